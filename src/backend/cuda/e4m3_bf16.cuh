// e4m3 → bf16 in registers for the W8A16 kernels (fp8_gemm.cu, moe_grouped.cu; docs/FP8.md §4): two packed e4m3
// codes become one bf16x2 word holding value·2^−120 with no rounding, and one mul.bf16x2 by the block's
// scale·2^120 makes it the exact weight (exact for power-of-two scales ≤ 2^7, every scale the formats hold).
#pragma once

#include <cstdint>

namespace m3::cuda {

#ifdef __CUDACC__
// The W8A16 kernels' element trait: two packed 8-bit codes → bf16x2 holding value·2^−kBias, with no rounding.
struct E4M3 {
  static constexpr int kBias = 120;  // bf16 exponent bias 127 − e4m3 bias 7
  // Codes S.EEEE.MMM placed as bf16 S.0000EEEE.MMM0000: exponent field E, mantissa M/8 — for E > 0 that is
  // (1 + M/8)·2^(E−127) = value·2^−120; for E = 0 the bf16 subnormal (M/8)·2^−126 = value·2^−120 as well.
  __device__ __forceinline__ static uint32_t lo2(uint32_t w) {  // bytes 0, 1
    const uint32_t v = __byte_perm(w, 0, 0x1404);
    return ((v >> 4) & 0x07F007F0u) | (v & 0x80008000u);
  }
  __device__ __forceinline__ static uint32_t hi2(uint32_t w) {  // bytes 2, 3
    const uint32_t v = __byte_perm(w, 0, 0x3424);
    return ((v >> 4) & 0x07F007F0u) | (v & 0x80008000u);
  }
};

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
#endif

}  // namespace m3::cuda
