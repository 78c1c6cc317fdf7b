// FP8 weight formats shared by the CPU twins (backend/cpu/fp8.h) and the CUDA backend (backend/cuda/fp8_gemm.cuh):
// the scale granularities and where each scale lives. Header-only, no CUDA or fmt, so .cu files can include it.
// Every format stores the e4m3 values q[N, K] row-major; they differ in the scales (docs/FP8.md):
//   G32     the MXFP8 release as is: one UE8M0 byte per 32 values of a row, [N][ceil(K/32)];  W = q · 2^(s − 127).
//   Row128  one fp32 scale per 128 values of a row (cuBLASLt VEC128_32F), [ceil(K/128)][round_up(N, 4)]:
//           the outer dimension (rows) contiguous, as cuBLASLt reads VEC128 scales.
//   Blk128  one fp32 scale per 128×128 block (cuBLASLt BLK128x128_32F), [ceil(N/128)][round_up(ceil(K/128), 4)]:
//           the K blocks contiguous, padded to a multiple of 4.
#pragma once

#include <cmath>
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

namespace m3 {

// Which FP8 GEMM a projection y[T, N] = x[T, K] · Wᵀ runs (the executor's `--dtype fp8`, docs/FP8.md §4–§6):
//   W8Lines  W8A16, whole-line variant (cuda::W8Kernel::Lines128): the fastest at ≤ 8 rows on the H200 (1.22–1.41×
//            bf16 at M = 1, 1.09–1.33× at M = 8, bench/results/2026-12-02-final-run-h200.md); needs K % 128 == 0.
//   W8Chunk  W8A16, 64-wide chunks: 9 rows up to the cuBLASLt threshold, and every M when K % 128 ≠ 0 (the
//            block-scaled GEMM and the line kernel need K % 128 == 0); also when N % 128 ≠ 0 (the block-scaled GEMM
//            was verified on whole 128-row weight blocks only — every M3 projection has N % 128 == 0).
//   Lt       cuBLASLt block-scaled FP8×FP8 with the activations quantised to e4m3 per 1×128 (W8A16 on mma.sync is
//            3× slower than bf16 at M = 64 and compute-bound beyond; cuBLASLt FP8 is 1.2× faster than bf16 there).
// All three read bf16 activations and the same Blk128 weights; only Lt quantises the activations (docs/FP8.md §3: it
// costs accuracy), so lt_min_rows ≤ 0 never takes it.
enum class Fp8Path : uint8_t { W8Lines, W8Chunk, Lt };

inline Fp8Path fp8_pick_path(int64_t T, int64_t N, int64_t K, int64_t lt_min_rows) {
  if (K % 128 != 0) return Fp8Path::W8Chunk;
  if (lt_min_rows > 0 && T >= lt_min_rows && N % 128 == 0) return Fp8Path::Lt;
  return T <= 8 ? Fp8Path::W8Lines : Fp8Path::W8Chunk;
}

inline const char* fp8_path_name(Fp8Path p) {
  switch (p) {
    case Fp8Path::W8Lines: return "w8a16-lines128";
    case Fp8Path::W8Chunk: return "w8a16-chunk64";
    case Fp8Path::Lt: return "cublaslt-fp8";
  }
  return "?";
}

// Whether an [N, K] matrix can be stored as FP8 for the executor: every path needs K % 64 == 0 (W8A16's chunk).
inline bool fp8_matrix_supported(int64_t N, int64_t K) { return N > 0 && K > 0 && K % 64 == 0; }

// The exponent S of the one power-of-two scale of FP8 dummy weights uniform in [−scale, scale): the smallest S with
// scale ≤ 448·2^S (as backend/cpu/fp8.h chooses a block's scale; 0 for scale ≤ 0).
inline int fp8_dummy_exponent(float scale) {
  if (!(scale > 0.f)) return 0;
  int S = std::ilogb(scale) - 8;  // 448 = 1.75 · 2^8
  if (scale > 448.0f * std::ldexp(1.0f, S)) ++S;
  return S;
}

// Device bytes of one FP8 matrix stored in `fmt` (values + scales), as the executor allocates it.
inline int64_t fp8_matrix_bytes(Fp8Scale fmt, int64_t N, int64_t K) {
  return N * K + fp8_scale_count(fmt, N, K) * (fmt == Fp8Scale::G32 ? 1 : 4);
}

}  // namespace m3
