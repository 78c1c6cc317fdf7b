// Parity with HF transformers 5.17 minimax_m3_vl image/video processors (fixtures from
// scripts/oracle/make_media_fixtures.py, run on the H200 machine). Whole tensors are compared through an exact
// checksum of their float32 bits (so the tolerance is 0, tighter than the 1e-5) and four raw rows per case
// give a readable max-abs diff when something breaks.
#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "media/decode.h"
#include "media/image.h"
#include "media/media_error.h"
#include "media/prompt.h"
#include "media_fixture_util.h"

namespace m3::media {
namespace {

using testing::checksum_bytes;
using testing::checksum_floats;
using testing::gen_image;
using testing::read_file;

const std::string kDir = "tests/media/fixtures/";

struct Fixtures {
  nlohmann::json j;
  std::vector<float> rows;
  Fixtures() {
    auto txt = read_file(kDir + "media_fixtures.json");
    j = nlohmann::json::parse(txt.begin(), txt.end());
    auto raw = read_file(kDir + "media_rows.f32");
    rows.resize(raw.size() / 4);
    std::memcpy(rows.data(), raw.data(), rows.size() * 4);
  }
};
const Fixtures& fx() {
  static Fixtures f;
  return f;
}

void compare_tensor(const nlohmann::json& c, const PixelTensor& pt) {
  const auto g = c["grid_thw"];
  EXPECT_EQ(pt.t, g[0].get<int>());
  EXPECT_EQ(pt.gh, g[1].get<int>());
  EXPECT_EQ(pt.gw, g[2].get<int>());
  EXPECT_EQ(pt.tokens(), c["tokens"].get<int64_t>());
  ASSERT_EQ(pt.rows(), c["rows"].get<int64_t>());
  ASSERT_EQ(pt.values.size(), size_t(pt.rows()) * kRowWidth);
  const int64_t off = c["sample_offset"].get<int64_t>();
  double maxdiff = 0;
  int k = 0;
  for (const auto& r : c["sample_rows"]) {
    const float* ours = &pt.values[size_t(r.get<int64_t>()) * kRowWidth];
    const float* ref = &fx().rows[size_t(off + k++) * kRowWidth];
    for (int i = 0; i < kRowWidth; ++i) maxdiff = std::max(maxdiff, double(std::abs(ours[i] - ref[i])));
  }
  EXPECT_LE(maxdiff, 1e-5) << "sampled rows differ";
  EXPECT_EQ(std::to_string(checksum_floats(pt.values.data(), pt.values.size())), c["checksum"].get<std::string>())
      << "whole-tensor float32 bits differ (sampled max diff " << maxdiff << ")";
}

TEST(MediaHfParity, SyntheticImagesMatchHfProcessorBitForBit) {
  const auto& mm = fx().j["provenance"]["image_min_max_pixels"];
  ResizeLimits lim{mm[0].get<int64_t>(), mm[1].get<int64_t>()};
  int compared = 0;
  for (const auto& c : fx().j["images"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const int h = c["h"], w = c["w"];
    RgbImage img = gen_image(h, w, c["seed"], c["kind"]);
    ASSERT_EQ(std::to_string(checksum_bytes(img.data.data(), img.data.size())), c["input_checksum"].get<std::string>())
        << "synthetic generator differs from the oracle's";
    if (c.contains("py_error") || c.contains("error")) {
      EXPECT_THROW(preprocess_image(img, lim), MediaError);
      continue;
    }
    // Our smart_resize against the script's Python one, and our resample against torchvision's bytes.
    auto [th, tw] = smart_resize(h, w, lim);
    EXPECT_EQ(th, c["py_resized"][0].get<int>());
    EXPECT_EQ(tw, c["py_resized"][1].get<int>());
    RgbImage r = resize_bicubic_aa(img, th, tw);
    EXPECT_EQ(std::to_string(checksum_bytes(r.data.data(), r.data.size())),
              c["tv_resized_checksum"].get<std::string>())
        << "resized bytes differ from torchvision";
    // HF reads an [h, w, 3] array with h ∈ {1, 3} as channels-first (its "channel dimension is ambiguous"
    // warning), so its output for those inputs is not the image's: only the torchvision comparison applies.
    if (h == 1 || h == 3) continue;
    compare_tensor(c, preprocess_image(img, lim));
    ++compared;
  }
  EXPECT_GE(compared, 18);
}

TEST(MediaHfParity, VideosMatchHfVideoProcessorWithLastFramePadding) {
  const auto& mm = fx().j["provenance"]["video_min_max_pixels"];
  ResizeLimits lim{mm[0].get<int64_t>(), mm[1].get<int64_t>()};
  for (const auto& c : fx().j["videos"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ASSERT_FALSE(c.contains("error")) << c["error"];
    std::vector<RgbImage> frames;
    for (int k = 0; k < c["frames"].get<int>(); ++k)
      frames.push_back(gen_image(c["h"], c["w"], c["seed"].get<int>() + 1000 * k, c["kind"]));
    compare_tensor(c, preprocess_video(frames, lim));
  }
}

TEST(MediaHfParity, DecodedFilesMatchPillowAndHf) {
  const auto& mm = fx().j["provenance"]["image_min_max_pixels"];
  ResizeLimits lim{mm[0].get<int64_t>(), mm[1].get<int64_t>()};
  for (const auto& c : fx().j["files"]) {
    const std::string name = c["file"];
    SCOPED_TRACE(name);
    const std::string path =
        name.rfind("photo_", 0) == 0 ? "tests/media/photos/" + name.substr(6) : kDir + "files/" + name;
    auto bytes = read_file(path);
    ASSERT_EQ(bytes.size(), c["bytes"].get<size_t>()) << path;
    if (c.contains("error")) {
      EXPECT_THROW(decode_image(bytes), MediaError);
      continue;
    }
    RgbImage img;
    try {
      img = decode_image(bytes);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "decode failed: " << e.what();
      continue;
    }
    EXPECT_EQ(img.h, c["decoded_hw"][0].get<int>());
    EXPECT_EQ(img.w, c["decoded_hw"][1].get<int>());
    const bool lossy_codec = name.find(".jpg") != std::string::npos || name.find("lossy") != std::string::npos;
    const std::string cs = std::to_string(checksum_bytes(img.data.data(), img.data.size()));
    EXPECT_EQ(cs, c["decoded_checksum"].get<std::string>()) << "RGB differs from Pillow's convert(\"RGB\")"
                                                            << (lossy_codec ? " (lossy codec)" : "");
    if (cs == c["decoded_checksum"].get<std::string>()) compare_tensor(c, preprocess_image(img, lim));
  }
}

TEST(MediaHfParity, TimestampsFormatLikePython) {
  for (const auto& c : fx().j["timestamps"]) {
    const double ts = double(c["index"].get<int64_t>()) / c["fps"].get<double>();
    EXPECT_EQ(format_timestamp(ts), c["double"].get<std::string>())
        << c["index"] << " / " << c["fps"].get<double>();
  }
}

}  // namespace
}  // namespace m3::media
