// The 1×128 e4m3 activation quantisation of the FP8×FP8 prefill GEMMs (fp8_gemm.cuh), as a warp-level device
// helper so the kernels that write an activation (the RMS norm, SwiGLU) can quantise it in the same pass instead of a
// separate read of the bf16 tensor (docs/FP8.md §3). Bit for bit backend/cpu/fp8.h fp8_quantize_act_1x128 on the
// bf16-rounded values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace m3::cuda {

// Where a fused writer puts the quantised activation: q [T_pad, K] e4m3 codes, s [K/128][ld_s] fp32 scales (ld_s ≥
// T_pad; rows T..T_pad−1 are written as zeros with scale 1, as fp8_quantize_act_1x128 pads them).
struct Fp8ActOut {
  uint8_t* q = nullptr;
  float* s = nullptr;
  int64_t T_pad = 0, ld_s = 0;
};

#ifdef __CUDACC__
// One 128-value block held by a warp, lane i holding values 4i..4i+3 (already rounded to bf16 where the reference
// quantises a bf16 tensor): amax over the block, scale amax / 448 (1 for an all-zero block), codes rne_e4m3(v / scale)
// saturated. Returns the lane's 4 codes packed little-endian; every lane gets the block's scale in `scale`.
__device__ __forceinline__ uint32_t quant_block128_warp(const float (&v)[4], float& scale) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = warp_max(amax);
  scale = amax > 0.f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    packed |= uint32_t(__nv_cvt_float_to_fp8(__fdiv_rn(v[i], scale), __NV_SATFINITE, __NV_E4M3)) << (8 * i);
  return packed;
}

// bf16 round-trip of an fp32 value (round to nearest even), as the bf16 tensor the reference quantises holds it.
__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
#endif

}  // namespace m3::cuda
