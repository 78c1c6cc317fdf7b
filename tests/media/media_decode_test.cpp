#include <gtest/gtest.h>

#include <turbojpeg.h>

#include <cstring>
#include <optional>
#include <string>

#include "media/decode.h"
#include "media/media_error.h"
#include "media_fixture_util.h"

namespace m3::media {
namespace {

using testing::read_file;

TEST(MediaDecode, SniffsEveryFormat) {
  EXPECT_EQ(sniff_image_format(read_file("tests/media/photos/rocket.jpg")), ImageFormat::Jpeg);
  EXPECT_EQ(sniff_image_format(read_file("tests/media/photos/chelsea.png")), ImageFormat::Png);
  EXPECT_EQ(sniff_image_format(read_file("tests/media/fixtures/files/lossy.webp")), ImageFormat::Webp);
  EXPECT_EQ(sniff_image_format(read_file("tests/media/fixtures/files/anim.gif")), ImageFormat::Gif);
  EXPECT_EQ(sniff_image_format(read_file("tests/media/fixtures/files/rgb.bmp")), ImageFormat::Bmp);
}

TEST(MediaDecode, GarbageAndEmptyInputsAreMediaErrors) {
  std::vector<uint8_t> junk(100, 0x42);
  EXPECT_THROW(decode_image(junk), MediaError);
  EXPECT_THROW(decode_image({}), MediaError);
}

TEST(MediaDecode, EveryPrefixOfEveryFixtureFailsCleanlyOrDecodes) {
  // Truncation at many points must never crash (JPEG/PNG/GIF/WebP/BMP readers all bounds-check).
  for (const char* f : {"tests/media/fixtures/files/q90_420.jpg", "tests/media/fixtures/files/rgba.png",
                        "tests/media/fixtures/files/anim.gif", "tests/media/fixtures/files/lossless.webp",
                        "tests/media/fixtures/files/rgb.bmp", "tests/media/fixtures/files/i16.png"}) {
    auto full = read_file(f);
    ASSERT_FALSE(full.empty()) << f;
    for (size_t n = 0; n < full.size(); n += std::max<size_t>(1, full.size() / 97)) {
      std::span<const uint8_t> part(full.data(), n);
      try {
        RgbImage img = decode_image(part);
        EXPECT_EQ(img.data.size(), size_t(img.w) * img.h * 3);
      } catch (const MediaError&) {
      }
    }
  }
}

TEST(MediaDecode, TruncatedJpegIsRejectedLikePillow) {
  EXPECT_THROW(decode_image(read_file("tests/media/photos/truncated.jpg")), MediaError);
}

// preprocess_encoded_image (a JPEG decoded scanline by scanline into the width pass) against decode_image +
// preprocess_image: the same tensor bit for bit, the same success or failure, on the JPEG fixtures (4:2:0, 4:4:4,
// progressive, grey, CMYK → the whole-image path), the skimage photo, noise encoded here at sizes that exercise
// the row batches (1080p, 4k-wide, odd, 1 row, no width change), every prefix of a file, and with the portable
// resample loops forced.
bool same_tensor(const PixelTensor& a, const PixelTensor& b) {
  return a.t == b.t && a.gh == b.gh && a.gw == b.gw && a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

std::vector<uint8_t> noise_jpeg(int h, int w, int sub, uint32_t seed) {
  std::vector<uint8_t> px(size_t(h) * w * 3);
  for (size_t i = 0; i < px.size(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    px[i] = uint8_t(((i / 3) % w) * 3 + (seed >> 29));  // a ramp plus noise
  }
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &buf, &size, sub, 90, 0), 0);
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

TEST(MediaDecode, StreamedJpegPreprocessingEqualsDecodeThenPreprocess) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  for (const char* f : {"tests/media/fixtures/files/q90_420.jpg", "tests/media/fixtures/files/q95_444.jpg",
                        "tests/media/fixtures/files/progressive.jpg", "tests/media/fixtures/files/gray.jpg",
                        "tests/media/fixtures/files/cmyk.jpg", "tests/media/photos/rocket.jpg"})
    files.emplace_back(f, read_file(f));
  struct S { int h, w, sub; } sizes[] = {{1080, 1920, TJSAMP_420}, {301, 3840, TJSAMP_422}, {37, 501, TJSAMP_444},
                                         {1, 200, TJSAMP_420}, {45, 61, TJSAMP_GRAY}, {56, 56, TJSAMP_420},
                                         {17, 2000, TJSAMP_420},
                                         {280, 1000, TJSAMP_420}};  // height kept, width changed: bands read the
                                                                    // width-passed rows directly
  uint32_t seed = 1;
  for (auto sz : sizes)
    files.emplace_back(std::to_string(sz.h) + "x" + std::to_string(sz.w), noise_jpeg(sz.h, sz.w, sz.sub, seed++));
  for (bool scalar : {false, true}) {
    detail::force_scalar_resize(scalar);
    for (const auto& [name, bytes] : files) {
      ASSERT_FALSE(bytes.empty()) << name;
      // Streamed first: preprocess_image leaves this picture's width-passed rows in the shared scratch, which would
      // hide a band made before all of its source rows had arrived.
      const PixelTensor got = preprocess_encoded_image(bytes);
      const PixelTensor want = preprocess_image(decode_image(bytes));
      EXPECT_TRUE(same_tensor(got, want)) << name << (scalar ? " (portable)" : "");
    }
  }
  detail::force_scalar_resize(false);
  const auto& full = files[0].second;
  for (size_t n = 0; n < full.size(); n += std::max<size_t>(1, full.size() / 61)) {
    std::span<const uint8_t> part(full.data(), n);
    std::optional<PixelTensor> a, b;
    try { a = preprocess_image(decode_image(part)); } catch (const MediaError&) {}
    try { b = preprocess_encoded_image(part); } catch (const MediaError&) {}
    ASSERT_EQ(a.has_value(), b.has_value()) << "prefix " << n;
    if (a) {
      EXPECT_TRUE(same_tensor(*a, *b)) << "prefix " << n;
    }
  }
  EXPECT_THROW(preprocess_encoded_image(read_file("tests/media/photos/truncated.jpg")), MediaError);
}

TEST(MediaDecode, HeaderSizeOverTheLimitIsRejectedBeforeDecoding) {
  auto png = read_file("tests/media/photos/chelsea.png");
  DecodeLimits lim;
  lim.max_pixels = 1000;
  try {
    decode_image(png, lim);
    FAIL() << "expected a limit error";
  } catch (const MediaError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the decode limit"), std::string::npos) << e.what();
  }
  // A BMP header claiming 100000x100000.
  std::vector<uint8_t> bmp(54, 0);
  bmp[0] = 'B'; bmp[1] = 'M'; bmp[10] = 54; bmp[14] = 40;
  bmp[18] = 0xA0; bmp[19] = 0x86; bmp[20] = 0x01;  // 100000
  bmp[22] = 0xA0; bmp[23] = 0x86; bmp[24] = 0x01;
  bmp[28] = 24;
  EXPECT_THROW(decode_image(bmp), MediaError);
}

TEST(MediaDecode, AlphaIsDroppedNotComposited) {
  // rgba.png has alpha 0 over non-zero RGB in columns 0..9; Pillow (and HF) keep those RGB values.
  RgbImage a = decode_image(read_file("tests/media/fixtures/files/rgba.png"));
  bool nonzero = false;
  for (int y = 1; y < a.h - 1; ++y) nonzero |= a.data[(size_t(y) * a.w + 3) * 3] != 0;
  EXPECT_TRUE(nonzero);
}

}  // namespace
}  // namespace m3::media
