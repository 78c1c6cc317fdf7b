// Shared with scripts/oracle/make_media_fixtures.py: the synthetic image formula and the checksum.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "media/image.h"

namespace m3::media::testing {

// Standard base64 with padding: the tests' data: URLs.
inline std::string base64_encode(const std::vector<uint8_t>& b) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  size_t i = 0;
  for (; i + 2 < b.size(); i += 3) {
    const uint32_t v = uint32_t(b[i]) << 16 | uint32_t(b[i + 1]) << 8 | b[i + 2];
    for (int k = 18; k >= 0; k -= 6) o += t[(v >> k) & 63];
  }
  if (i + 1 == b.size()) {
    const uint32_t v = uint32_t(b[i]) << 16;
    o += t[v >> 18 & 63];
    o += t[v >> 12 & 63];
    o += "==";
  } else if (i + 2 == b.size()) {
    const uint32_t v = uint32_t(b[i]) << 16 | uint32_t(b[i + 1]) << 8;
    o += t[v >> 18 & 63];
    o += t[v >> 12 & 63];
    o += t[v >> 6 & 63];
    o += '=';
  }
  return o;
}

inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// sum_i v_i * (lowbias32(i) | 1) mod 2^64 over bytes or float32 bit patterns.
inline uint64_t checksum_bytes(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += uint64_t(p[i]) * (uint64_t(lowbias32(uint32_t(i))) | 1);
  return s;
}
inline uint64_t checksum_floats(const float* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &p[i], 4);
    s += uint64_t(b) * (uint64_t(lowbias32(uint32_t(i))) | 1);
  }
  return s;
}

inline RgbImage gen_image(int h, int w, int seed, const std::string& kind) {
  RgbImage img(w, h);
  const uint32_t mix = uint32_t(uint64_t(seed) * 0x9E3779B9ULL);
  const size_t n = size_t(h) * w * 3;
  for (size_t i = 0; i < n; ++i) {
    uint32_t hsh = lowbias32(uint32_t(i) ^ mix);
    if (kind == "noise") {
      img.data[i] = uint8_t(hsh >> 24);
    } else {
      uint64_t c = i % 3, x = (i / 3) % w, y = i / (3 * size_t(w));
      img.data[i] = uint8_t((7 * x + 13 * y + 85 * c + (hsh >> 29)) & 255);
    }
  }
  auto set = [&](int y, int x, uint8_t v) { for (int c = 0; c < 3; ++c) img.data[(size_t(y) * w + x) * 3 + c] = v; };
  for (int x = 0; x < w; ++x) set(0, x, 255);
  for (int y = 0; y < h; ++y) set(y, 0, 255);
  for (int x = 0; x < w; ++x) set(h - 1, x, 0);
  for (int y = 0; y < h; ++y) set(y, w - 1, 0);
  return img;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace m3::media::testing
