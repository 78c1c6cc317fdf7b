// Device-side helpers of bench_fp8_gemm: random FP8 weights (codes that are never NaN, UE8M0 scales in a realistic
// band), random bf16, and the relative error of a device output against a device fp32 reference.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/common.cuh"

namespace m3::bench {

namespace {
__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__global__ void fill_codes_kernel(uint8_t* p, int64_t n, uint64_t seed, int lo, int span) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t x = mix(seed ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull));
    if (span == 0) {  // e4m3 codes: exponents 1..14 (magnitudes 2^-6..2^7·1.875), random sign and mantissa
      p[i] = uint8_t(((x & 1) << 7) | ((1 + (x >> 8) % 14) << 3) | ((x >> 16) & 7));
    } else {
      p[i] = uint8_t(lo + int((x >> 8) % uint64_t(span)));
    }
  }
}
__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t x = mix(seed ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull));
    const float v = (0.05f + 0.95f * float(x >> 40) * (1.0f / 16777216.0f)) * ((x & 1) ? 1.f : -1.f);
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}
__global__ void err_kernel(const void* got, bool bf16, const float* ref, int64_t n, unsigned* out) {
  float num = 0.f, den = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(got)[i]) : static_cast<const float*>(got)[i];
    const float d = fabsf(g - ref[i]);
    num = fmaxf(num, d == d ? d : 3.0e38f);  // NaN counts as a huge error
    den = fmaxf(den, fabsf(ref[i]));
  }
  atomicMax(&out[0], __float_as_uint(num));
  atomicMax(&out[1], __float_as_uint(den));
}
}  // namespace

void fill_fp8_codes(uint8_t* p, int64_t n, uint64_t seed) {
  fill_codes_kernel<<<4096, 256>>>(p, n, seed, 0, 0);
  M3_CUDA_LAUNCH_CHECK();
}
void fill_ue8m0(uint8_t* p, int64_t n, uint64_t seed, int lo, int hi) {
  fill_codes_kernel<<<4096, 256>>>(p, n, seed, lo, hi - lo + 1);
  M3_CUDA_LAUNCH_CHECK();
}
void fill_bf16(uint16_t* p, int64_t n, uint64_t seed) {
  fill_bf16_kernel<<<4096, 256>>>(p, n, seed);
  M3_CUDA_LAUNCH_CHECK();
}
double rel_err(const void* got, bool bf16, const float* ref, int64_t n) {
  unsigned* d = nullptr;
  M3_CUDA_CHECK(cudaMalloc(&d, 8));
  M3_CUDA_CHECK(cudaMemset(d, 0, 8));
  err_kernel<<<1024, 256>>>(got, bf16, ref, n, d);
  M3_CUDA_LAUNCH_CHECK();
  unsigned h[2];
  M3_CUDA_CHECK(cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost));
  cudaFree(d);
  float num, den;
  static_assert(sizeof(float) == 4);
  std::memcpy(&num, &h[0], 4);
  std::memcpy(&den, &h[1], 4);
  return den > 0 ? double(num) / double(den) : double(num);
}

}  // namespace m3::bench
