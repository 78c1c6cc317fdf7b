#include <gtest/gtest.h>

#include <cstring>

#include "media/image.h"
#include "media/media_error.h"
#include "media/prompt.h"

namespace m3::media {
namespace {

TEST(MediaSmartResize, WorkedExamplesFromTheModelDoc) {
  struct Case { int h, w, th, tw; } cases[] = {
      {768, 1024, 560, 756}, {1080, 1920, 504, 896}, {720, 1280, 504, 896}, {2160, 3840, 504, 896},
      {1000, 1000, 672, 672}, {512, 512, 504, 504},  {224, 224, 224, 224},  {64, 64, 56, 56},
      {176, 2816, 168, 2688}, {10, 2000, 28, 812},   {100, 30, 112, 28},    {37, 501, 28, 504}};  // HF 5.17 fixture
  for (auto c : cases) {
    auto [h, w] = smart_resize(c.h, c.w, {});
    EXPECT_EQ(h, c.th) << c.h << "x" << c.w;
    EXPECT_EQ(w, c.tw) << c.h << "x" << c.w;
  }
}

TEST(MediaSmartResize, TiesRoundToEvenMultiples) {
  EXPECT_EQ(smart_resize(42, 300, {}).first, 56);
  EXPECT_EQ(smart_resize(70, 300, {}).first, 56);
  EXPECT_EQ(smart_resize(98, 300, {}).first, 112);
  EXPECT_EQ(smart_resize(350, 300, {}).first, 336);
}

TEST(MediaSmartResize, AspectRatioOver200IsRejectedExactly200Accepted) {
  EXPECT_NO_THROW(smart_resize(1, 200, {}));
  EXPECT_THROW(smart_resize(2, 401, {}), MediaError);
  EXPECT_THROW(smart_resize(1, 5000, {}), MediaError);
  EXPECT_THROW(smart_resize(0, 10, {}), MediaError);
}

TEST(MediaSmartResize, VideoFramesUseTheLargerBudget) {
  auto [h, w] = smart_resize(1080, 1920, {3136, kVideoFrameMaxPixels});
  EXPECT_EQ(h, 560);
  EXPECT_EQ(w, 1008);
}

TEST(MediaNormalize, ExtremesAndFusedFormula) {
  EXPECT_FLOAT_EQ(normalize_value(0, 0), -122.770943f / 68.5005341f);
  EXPECT_FLOAT_EQ(normalize_value(255, 2), (255.f - 104.093735f) / 70.3231583f);
  EXPECT_LT(normalize_value(0, 1), normalize_value(255, 1));
}

TEST(MediaPatchify, MergeWindowsAreContiguousAndTemporalSlotsDuplicated) {
  // 56x84 image (no resize): 4x6 patches; mark each patch with its own value in channel 0.
  RgbImage img(84, 56);
  for (int y = 0; y < 56; ++y)
    for (int x = 0; x < 84; ++x) img.data[(size_t(y) * 84 + x) * 3] = uint8_t((y / 14) * 6 + (x / 14));
  PixelTensor pt = preprocess_image(img);
  ASSERT_EQ(pt.gh, 4);
  ASSERT_EQ(pt.gw, 6);
  ASSERT_EQ(pt.rows(), 24);
  // Row r: window r/4 (merge-row-major over 2x3 windows), position r%4 row-major inside it.
  for (int r = 0; r < 24; ++r) {
    int win = r / 4, k = r % 4;
    int py = (win / 3) * 2 + k / 2, px = (win % 3) * 2 + k % 2;
    const float* row = &pt.values[size_t(r) * kRowWidth];
    EXPECT_EQ(row[0], normalize_value(uint8_t(py * 6 + px), 0)) << r;
    EXPECT_EQ(row[196], row[0]) << "temporal slot 1 duplicates slot 0";
    EXPECT_EQ(row[392], normalize_value(0, 1)) << "channel 1 starts at 2*196";
  }
}

TEST(MediaResize, IdentityAndConstantImagesStayExact) {
  RgbImage img(100, 60);
  std::fill(img.data.begin(), img.data.end(), 77);
  RgbImage r = resize_bicubic_aa(img, 28, 252);
  for (uint8_t v : r.data) ASSERT_EQ(v, 77);
  RgbImage same = resize_bicubic_aa(img, 60, 100);
  EXPECT_EQ(same.data, img.data);
}

// The AVX2 resample and normalisation loops (used where the CPU has AVX2) against the portable ones: the same integer sums, so the
// same bytes, on noise (every tap matters) over down- and upscales, odd sizes, single rows and columns, and the
// 1080p / 4k budgets. The HF fixtures (media_fixture_test) check whichever path this CPU runs against torchvision.
// An image of LCG noise, so every tap of a resample matters; `s` is the generator's state, carried from image to
// image.
RgbImage noise_image(int w, int h, uint32_t& s) {
  RgbImage img(w, h);
  for (auto& v : img.data) {
    s = s * 1664525u + 1013904223u;
    v = uint8_t(s >> 24);
  }
  return img;
}

TEST(MediaResize, Avx2LoopsEqualThePortableOnes) {
  uint32_t s = 12345;
  struct Case { int h, w, th, tw; } cases[] = {
      {1080, 1920, 504, 896}, {2160, 3840, 504, 896}, {45, 61, 56, 56}, {1, 200, 28, 812}, {200, 1, 812, 28},
      {97, 131, 28, 56},      {31, 17, 336, 224},     {2, 3, 28, 28},   {333, 501, 336, 504}, {60, 100, 60, 252}};
  for (auto c : cases) {
    const RgbImage img = noise_image(c.w, c.h, s);
    detail::force_scalar_resize(true);
    const RgbImage a = resize_bicubic_aa(img, c.th, c.tw);
    detail::force_scalar_resize(false);
    const RgbImage b = resize_bicubic_aa(img, c.th, c.tw);
    ASSERT_EQ(a.w, b.w);
    ASSERT_EQ(a.h, b.h);
    EXPECT_TRUE(a.data == b.data) << c.h << "x" << c.w << " -> " << c.th << "x" << c.tw;
    // Normalise + patchify too (the AVX2 loop, and the scalar one for the last pixels of the image).
    detail::force_scalar_resize(true);
    const PixelTensor pa = preprocess_image(img);
    detail::force_scalar_resize(false);
    const PixelTensor pb = preprocess_image(img);
    ASSERT_EQ(pa.values.size(), pb.values.size());
    EXPECT_EQ(std::memcmp(pa.values.data(), pb.values.data(), pa.values.size() * sizeof(float)), 0)
        << c.h << "x" << c.w;
  }
}

// Where the CPU has AVX-512BW the width pass runs a zmm kernel; it must give the AVX2 kernel's bytes (and both the
// portable loop's, above). Also covers the fixed quad count with windows moved left at the right edge.
TEST(MediaResize, Avx512WidthPassEqualsTheAvx2One) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bw")) GTEST_SKIP() << "no AVX-512BW on this CPU";
#else
  GTEST_SKIP() << "x86 only";
#endif
  uint32_t s = 777;
  struct Case { int h, w, tw; } cases[] = {{1080, 1920, 896}, {2160, 3840, 896}, {37, 501, 504}, {9, 13, 56},
                                           {5, 3, 28},        {64, 64, 56},      {17, 4000, 812}};
  for (auto c : cases) {
    const RgbImage img = noise_image(c.w, c.h, s);
    detail::disable_avx512(true);
    const RgbImage a = resize_bicubic_aa(img, c.h, c.tw);
    detail::disable_avx512(false);
    const RgbImage b = resize_bicubic_aa(img, c.h, c.tw);
    EXPECT_TRUE(a.data == b.data) << c.h << "x" << c.w << " -> width " << c.tw;
  }
}

TEST(MediaVideoPreprocess, OddFrameCountsPadWithTheLastFrame) {
  std::vector<RgbImage> frames;
  for (int k = 0; k < 3; ++k) {
    RgbImage f(56, 56);
    std::fill(f.data.begin(), f.data.end(), uint8_t(10 * k));
    frames.push_back(f);
  }
  PixelTensor pt = preprocess_video(frames);
  EXPECT_EQ(pt.t, 2);
  EXPECT_EQ(pt.gh, 4);
  // Group 1 = frames 2 and 2 (the pad): both temporal slots hold 20.
  const float* row = &pt.values[size_t(pt.gh * pt.gw) * kRowWidth];
  EXPECT_EQ(row[0], normalize_value(20, 0));
  EXPECT_EQ(row[196], normalize_value(20, 0));
  EXPECT_THROW(preprocess_video({}), MediaError);
}

TEST(MediaPrompt, ImageAnchorExpandsToWrappedSlots) {
  ItemExpansion e;
  e.slots_per_group = 3;
  std::string out = expand_placeholders("a]<]image[>[b", {e});
  EXPECT_EQ(out, "a]<]start of image[>[]<]image[>[]<]image[>[]<]image[>[]<]end of image[>[b");
}

TEST(MediaPrompt, VideoGroupsCarryTimestampsAndUseImageWrappers) {
  ItemExpansion v;
  v.video = true;
  v.groups = 2;
  v.slots_per_group = 1;
  v.timestamps = {"0.0", "2.0"};
  ItemExpansion i;
  i.slots_per_group = 1;
  // The video anchor comes first in the text but images and videos are matched separately, in order.
  std::string out = expand_placeholders("]<]video[>[ and ]<]image[>[", {i, v});
  EXPECT_EQ(out,
            "]<]0.0 seconds[>[]<]start of image[>[]<]video[>[]<]end of image[>[]<]2.0 seconds[>["
            "]<]start of image[>[]<]video[>[]<]end of image[>[ and ]<]start of image[>[]<]image[>[]<]end of image[>[");
}

TEST(MediaPrompt, AnchorCountMismatchIsAnError) {
  ItemExpansion e;
  e.slots_per_group = 1;
  EXPECT_THROW(expand_placeholders("no anchors", {e}), MediaError);
  EXPECT_THROW(expand_placeholders("]<]image[>[]<]image[>[", {e}), MediaError);
}

TEST(MediaPrompt, TimestampTiesGoToEven) {
  EXPECT_EQ(format_timestamp(0.25), "0.2");
  EXPECT_EQ(format_timestamp(0.75), "0.8");
  EXPECT_EQ(format_timestamp(3.0 / 20.0), "0.1");
}

}  // namespace
}  // namespace m3::media
