#include "backend/cuda/weight_convert.cuh"

#include <cuda_fp16.h>

#include "backend/cuda/common.cuh"
#include "base/counter_hash.h"

namespace m3::cuda {

namespace {

// base/dtype.h f32_to_bf16, restated for the device: round to nearest even on the bits, NaN made quiet.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// base/dtype.cpp's e4m3 table (fn variant: S.1111.111 is NaN, no infinities), computed instead of looked up.
__device__ __forceinline__ float e4m3_to_f32_dev(uint8_t v) {
  const int exp = (v >> 3) & 0xf, man = v & 7;
  float mag;
  if (exp == 0xf && man == 7)
    mag = __int_as_float(0x7fc00000);
  else if (exp == 0)
    mag = ldexpf(float(man), -9);
  else
    mag = ldexpf(1.0f + float(man) / 8.0f, exp - 7);
  return (v >> 7) ? -mag : mag;
}

__device__ __forceinline__ float ue8m0_to_f32_dev(uint8_t s) {
  return s == 255 ? __int_as_float(0x7fc00000) : ldexpf(1.0f, int(s) - 127);
}

__device__ __forceinline__ float load_as_f32(const void* src, SrcType st, int64_t i, const uint8_t* scales,
                                             int64_t base, int64_t cols, int64_t scols) {
  switch (st) {
    case SrcType::F32: return static_cast<const float*>(src)[i];
    case SrcType::F64: return __double2float_rn(static_cast<const double*>(src)[i]);
    case SrcType::BF16: return __uint_as_float(uint32_t(static_cast<const uint16_t*>(src)[i]) << 16);
    case SrcType::F16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(src)[i]));
    case SrcType::E4M3: {
      const int64_t g = base + i, r = g / cols, c = g - r * cols;
      // __fmul_rn: one IEEE multiply, as the host's e4m3 × scale (never contracted).
      return __fmul_rn(e4m3_to_f32_dev(static_cast<const uint8_t*>(src)[i]), ue8m0_to_f32_dev(scales[r * scols + c / 32]));
    }
  }
  return 0.f;
}

__global__ void convert_kernel(const void* src, SrcType st, int64_t n, void* dst, bool dst_bf16,
                               const uint8_t* scales, int64_t base, int64_t cols, int64_t scols) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_as_f32(src, st, i, scales, base, cols, scols);
    if (dst_bf16)
      static_cast<uint16_t*>(dst)[i] = f32_to_bf16_bits(v);
    else
      static_cast<float*>(dst)[i] = v;
  }
}

__global__ void fill_kernel(void* dst, bool dst_bf16, int64_t n, uint64_t key, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = counter_uniform(key, uint64_t(i), scale);
    if (dst_bf16)
      static_cast<uint16_t*>(dst)[i] = f32_to_bf16_bits(v);
    else
      static_cast<float*>(dst)[i] = v;
  }
}

unsigned grid_for(int64_t n) {
  const int64_t want = (n + 255) / 256;
  const int64_t cap = int64_t(sm_count()) * 16;
  return unsigned(want < cap ? (want > 0 ? want : 1) : cap);
}

}  // namespace

void convert_weights(const void* src, SrcType st, int64_t n, void* dst, bool dst_bf16, const uint8_t* scales,
                     int64_t base, int64_t cols, int64_t scols, cudaStream_t s) {
  if (n <= 0) return;
  M3_CUDA_REQUIRE(st != SrcType::E4M3 || (scales && cols > 0 && scols > 0), "convert_weights: E4M3 needs scales");
  convert_kernel<<<grid_for(n), 256, 0, s>>>(src, st, n, dst, dst_bf16, scales, base, cols, scols);
  M3_CUDA_LAUNCH_CHECK();
}

void fill_counter_uniform(void* dst, bool dst_bf16, int64_t n, uint64_t key, float scale, cudaStream_t s) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), 256, 0, s>>>(dst, dst_bf16, n, key, scale);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
