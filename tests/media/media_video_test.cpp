// Video decoding and sampling: a small MPEG-4 Part 2 clip is encoded in memory with libavcodec (clip_util.h), then
// decoded through decode_video.
#include <gtest/gtest.h>

#include "media/image.h"
#include "media/media_error.h"
#include "media/video.h"
#include "clip_util.h"

namespace m3::media {
namespace {

using test_clips::make_clip;

TEST(MediaVideoSampling, KeepsFrameZeroThenOnePerInterval) {
  std::vector<double> ts;
  for (int i = 0; i < 100; ++i) ts.push_back(i / 10.0);  // 10 fps, 10 s
  auto idx = sample_frame_indices(ts, 1.0, 300.0, 768);
  ASSERT_EQ(idx.size(), 10u);
  for (int k = 0; k < 10; ++k) EXPECT_EQ(idx[k], 10 * k);
  EXPECT_EQ(sample_frame_indices(ts, 2.0, 300.0, 768).size(), 20u);
  EXPECT_EQ(sample_frame_indices(ts, 1.0, 4.5, 768).size(), 5u);   // time cap
  EXPECT_EQ(sample_frame_indices(ts, 5.0, 300.0, 7).size(), 7u);   // frame cap
}

TEST(MediaVideoSampling, TimestampsUseEveryOtherSampledIndex) {
  VideoFrames v;
  v.src_fps = 20.0;
  v.indices = {0, 20, 40, 60, 80};
  v.frames.resize(5);
  auto ts = video_timestamps(v);
  EXPECT_EQ(ts, (std::vector<std::string>{"0.0", "2.0", "4.0"}));
  v.src_fps = 0;
  EXPECT_TRUE(video_timestamps(v).empty());
}

TEST(MediaVideoDecode, DecodesAnInMemoryClipAtOneFramePerSecond) {
  auto clip = make_clip(25, 64, 48, 5);  // 5 s at 5 fps
  if (clip.empty()) GTEST_SKIP() << "no MPEG-4 encoder in this libavcodec";
  VideoFrames v = decode_video(clip);
  ASSERT_EQ(v.frames.size(), 5u);
  EXPECT_EQ(v.indices, (std::vector<int64_t>{0, 5, 10, 15, 20}));
  EXPECT_NEAR(v.src_fps, 5.0, 1e-9);
  EXPECT_EQ(v.frames[0].w, 64);
  EXPECT_EQ(v.frames[0].h, 48);
  // Frame 10's flat area was luma 96 (limited range): about (96-16)*255/219 ≈ 93 in RGB.
  EXPECT_NEAR(v.frames[2].data[(20 * 64 + 40) * 3], 93, 6);
  PixelTensor pt = preprocess_video(v.frames);
  EXPECT_EQ(pt.t, 3);  // 5 frames padded to 6
  EXPECT_EQ(video_timestamps(v), (std::vector<std::string>{"0.0", "2.0", "4.0"}));
  VideoLimits two;
  two.fps = 2.0;
  // 2 fps over 0.2-s frames: 0.0, 0.6, 1.2, … (each first frame ≥ last kept + 0.5 s), 9 frames.
  auto v2 = decode_video(clip, two);
  EXPECT_EQ(v2.indices, (std::vector<int64_t>{0, 3, 6, 9, 12, 15, 18, 21, 24}));
}

TEST(MediaVideoDecode, HostileInputsAreMediaErrors) {
  std::vector<uint8_t> junk(5000, 0x47);
  EXPECT_THROW(decode_video(junk), MediaError);
  EXPECT_THROW(decode_video({}), MediaError);
  auto clip = make_clip(10, 32, 32, 5);
  if (clip.empty()) GTEST_SKIP();
  for (size_t n : {size_t(10), size_t(100), clip.size() / 2}) {
    try {
      decode_video(std::span<const uint8_t>(clip.data(), n));
    } catch (const MediaError&) {
    }
  }
  VideoLimits bad;
  bad.fps = 50;
  EXPECT_THROW(decode_video(clip, bad), MediaError);
}

}  // namespace
}  // namespace m3::media
