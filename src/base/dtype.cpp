#include "base/dtype.h"

#include <array>
#include <limits>

namespace m3 {

namespace {
struct DTypeInfo {
  DType t;
  const char* name;
  size_t size;
};
constexpr std::array<DTypeInfo, 10> kDTypes{{
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},
    {DType::BOOL, "BOOL", 1},
}};

// fp8 e4m3fn decode table, built once.
std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float mag;
    if (exp == 0xf && man == 7) {
      mag = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      mag = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
    } else {
      mag = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    }
    t[v] = sign ? -mag : mag;
  }
  return t;
}
const std::array<float, 256> kE4M3 = make_e4m3_table();
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.size;
  return 0;
}

std::string_view dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d.name;
  return "?";
}

bool dtype_from_name(std::string_view s, DType* out) {
  for (const auto& d : kDTypes)
    if (s == d.name) {
      *out = d.t;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  int exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(float(man), -24);
  } else if (exp == 31) {
    mag = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(1.0f + float(man) / 1024.0f, exp - 15);
  }
  uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < std::ldexp(1.0f, -14)) {  // subnormal range: quantum 2^-24
    float q = std::nearbyint(a * std::ldexp(1.0f, 24));
    return sign | uint16_t(q);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  float q = std::nearbyint(m * 2048.0f);  // 11 significant bits
  if (q >= 2048.0f) {
    q /= 2;
    e += 1;
  }
  int exp = e - 1 + 15;
  if (exp >= 31) return sign | 0x7c00;
  return sign | uint16_t(exp << 10) | (uint16_t(q) & 0x3ff);
}

float e4m3_to_f32(uint8_t v) { return kE4M3[v]; }

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fmin(std::fabs(f), 448.0f);
  // Exhaustive nearest search over the 127 finite magnitudes; ties go to the even code.
  int best = 0;
  float best_err = std::numeric_limits<float>::infinity();
  for (int c = 0; c < 127; ++c) {
    float err = std::fabs(kE4M3[c] - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best_err = err;
      best = c;
    }
  }
  return sign | uint8_t(best);
}

}  // namespace m3
