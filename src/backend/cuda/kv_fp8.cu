#include "backend/cuda/kv_fp8.cuh"

#include "backend/cuda/common.cuh"

namespace m3::cuda {

namespace {

__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(float x) { return x; }

template <typename T>
__global__ void kv_quantize_e4m3_kernel(const T* __restrict__ x, int64_t n, float scale, uint8_t* __restrict__ q) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    q[i] = e4m3_quantize(to_f32(x[i]), scale);
}

template <typename T>
void launch(const T* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s) {
  M3_CUDA_REQUIRE(n >= 0 && scale > 0.f, "kv_quantize_e4m3: n %lld, scale %g (must be > 0)", (long long)n,
                  double(scale));
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, int64_t(8) * sm_count());
  kv_quantize_e4m3_kernel<<<unsigned(blocks), 256, 0, s>>>(x, n, scale, reinterpret_cast<uint8_t*>(q));
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void kv_quantize_e4m3(const __nv_bfloat16* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s) {
  launch(x, n, scale, q, s);
}
void kv_quantize_e4m3(const float* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s) { launch(x, n, scale, q, s); }

}  // namespace m3::cuda
