// FP8 weight formats shared by the CPU twins (backend/cpu/fp8.h) and the CUDA backend (backend/cuda/fp8_gemm.cuh):
// the scale granularities and where each scale lives. Header-only, no CUDA or fmt, so .cu files can include it.
// Every format stores the e4m3 values q[N, K] row-major; they differ in the scales (docs/FP8.md):
//   G32     the MXFP8 release as is: one UE8M0 byte per 32 values of a row, [N][ceil(K/32)];  W = q · 2^(s − 127).
//   Row128  one fp32 scale per 128 values of a row (cuBLASLt VEC128_32F), [ceil(K/128)][round_up(N, 4)]:
//           the outer dimension (rows) contiguous, as cuBLASLt reads VEC128 scales.
//   Blk128  one fp32 scale per 128×128 block (cuBLASLt BLK128x128_32F), [ceil(N/128)][round_up(ceil(K/128), 4)]:
//           the K blocks contiguous, padded to a multiple of 4.
#pragma once

#include <cstdint>

namespace m3 {

enum class Fp8Scale : uint8_t { G32, Row128, Blk128 };

inline const char* fp8_scale_name(Fp8Scale s) {
  switch (s) {
    case Fp8Scale::G32: return "g32-ue8m0";
    case Fp8Scale::Row128: return "1x128-pow2";
    case Fp8Scale::Blk128: return "128x128-pow2";
  }
  return "?";
}

namespace fp8_detail {
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
}  // namespace fp8_detail

// Leading dimension of the scale array: K/32 groups (G32), padded rows (Row128) or padded K blocks (Blk128).
inline int64_t fp8_scale_ld(Fp8Scale s, int64_t N, int64_t K) {
  using namespace fp8_detail;
  switch (s) {
    case Fp8Scale::G32: return ceil_div(K, 32);
    case Fp8Scale::Row128: return round_up(N, 4);
    case Fp8Scale::Blk128: return round_up(ceil_div(K, 128), 4);
  }
  return 0;
}

// Number of scale entries (bytes for G32, floats otherwise).
inline int64_t fp8_scale_count(Fp8Scale s, int64_t N, int64_t K) {
  using namespace fp8_detail;
  switch (s) {
    case Fp8Scale::G32: return N * ceil_div(K, 32);
    case Fp8Scale::Row128: return ceil_div(K, 128) * round_up(N, 4);
    case Fp8Scale::Blk128: return ceil_div(N, 128) * round_up(ceil_div(K, 128), 4);
  }
  return 0;
}

// Index of the scale of element (n, k).
inline int64_t fp8_scale_index(Fp8Scale s, int64_t N, int64_t K, int64_t n, int64_t k) {
  const int64_t ld = fp8_scale_ld(s, N, K);
  switch (s) {
    case Fp8Scale::G32: return n * ld + k / 32;
    case Fp8Scale::Row128: return (k / 128) * ld + n;
    case Fp8Scale::Blk128: return (n / 128) * ld + k / 128;
  }
  return 0;
}

}  // namespace m3
