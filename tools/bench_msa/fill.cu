// Device-side random fill for the benchmark (gigabytes of cache; a host fill would dominate the run).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace m3::bench {

namespace {
__global__ void fill_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    const float u = float(x >> 40) * (1.0f / 16777216.0f);
    const float v = lo + (hi - lo) * u;
    p[i] = (x & 1) ? v : -v;  // random sign, |v| ≥ lo > 0: never zero
  }
}
}  // namespace

void fill_uniform(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  fill_kernel<<<4096, 256>>>(p, n, seed, lo, hi);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::bench
