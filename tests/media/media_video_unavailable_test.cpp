// A media build without FFmpeg's libraries (M3_MEDIA_VIDEO=OFF, or the GPU machine's carried image codecs only):
// video requests get a MediaError that says why, the pure sampling and timestamp helpers still work, and images are
// unaffected (the other media tests run unchanged in this build).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "media/media_error.h"
#include "media/video.h"

namespace m3::media {
namespace {

TEST(MediaVideoUnavailable, DecodeVideoThrowsAMediaErrorThatNamesTheMissingLibraries) {
  const std::vector<uint8_t> bytes{0x00, 0x00, 0x00, 0x20, 'f', 't', 'y', 'p'};
  try {
    decode_video(bytes);
    FAIL() << "decode_video returned in a build without FFmpeg";
  } catch (const MediaError& e) {
    EXPECT_NE(std::string(e.what()).find("FFmpeg"), std::string::npos) << e.what();
  }
}

TEST(MediaVideoUnavailable, SamplingAndTimestampsStillWork) {
  EXPECT_EQ(sample_frame_indices({0.0, 0.5, 1.0, 1.5, 2.0}, 1.0, 300.0, 768), (std::vector<int64_t>{0, 2, 4}));
  VideoFrames v;
  v.indices = {0, 2, 4};
  v.src_fps = 2.0;
  EXPECT_EQ(video_timestamps(v), (std::vector<std::string>{"0.0", "2.0"}));
}

}  // namespace
}  // namespace m3::media
