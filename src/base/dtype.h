// Storage dtypes and scalar conversions. All math in the CPU backend is fp32; these convert stored
// values (safetensors payloads, KV pages) to and from fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace m3 {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, U8, I8, I32, I64, F64, BOOL };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);          // safetensors spelling, e.g. "BF16"
bool dtype_from_name(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN preserved (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// OCP FP8 E4M3 (fn variant: no infinities, S.1111.111 is NaN, max 448).
float e4m3_to_f32(uint8_t v);
uint8_t f32_to_e4m3(float f);  // round-to-nearest-even, saturating to ±448

// UE8M0 scale byte (MX block scale): 2^(s-127); 255 is NaN.
inline float ue8m0_to_f32(uint8_t s) {
  if (s == 255) return NAN;
  return std::ldexp(1.0f, int(s) - 127);
}

}  // namespace m3
