#include <gtest/gtest.h>

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
