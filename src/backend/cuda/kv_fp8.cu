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

// One thread per 16 codes: one 16-byte load, eight bf16x2 conversions (exact), a multiply by the scale in fp32
// and two 16-byte stores. grid.x walks the page list (up to 2^31 − 1 entries), grid.y a page's 16-code chunks.
__global__ void kv_dequantize_pages_kernel(const uint8_t* __restrict__ q, int64_t page_elems,
                                           const int32_t* __restrict__ pages, float scale,
                                           __nv_bfloat16* __restrict__ out) {
  const int64_t chunks = page_elems / 16;
  const int64_t page = pages[blockIdx.x];
  for (int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; c < chunks; c += int64_t(gridDim.y) * blockDim.x) {
    const int64_t at = page * page_elems + c * 16;
    const uint4 w = *reinterpret_cast<const uint4*>(q + at);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = e4m3x2_to_bf16x2<kE4m3Bytes01>(words[i]), hi = e4m3x2_to_bf16x2<kE4m3Bytes23>(words[i]);
      const uint32_t in[2] = {lo, hi};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&in[j]));
        const __nv_bfloat162 r = __floats2bfloat162_rn(f.x * scale, f.y * scale);
        o[2 * i + j] = *reinterpret_cast<const uint32_t*>(&r);
      }
    }
    uint4* dst = reinterpret_cast<uint4*>(out + at);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

}  // namespace

void kv_dequantize_pages_e4m3(const e4m3_t* q, int64_t page_elems, const int32_t* pages, int64_t n_pages,
                              float scale, __nv_bfloat16* out, cudaStream_t s) {
  M3_CUDA_REQUIRE(page_elems > 0 && page_elems % 16 == 0 && n_pages >= 0 && n_pages < (int64_t(1) << 31) &&
                      scale > 0.f,
                  "kv_dequantize_pages_e4m3: page_elems %lld (a multiple of 16), %lld pages, scale %g (> 0)",
                  (long long)page_elems, (long long)n_pages, double(scale));
  if (n_pages == 0) return;
  const int64_t chunks = page_elems / 16;
  const dim3 grid(unsigned(n_pages), unsigned(std::min<int64_t>((chunks + 255) / 256, 64)));
  kv_dequantize_pages_kernel<<<grid, 256, 0, s>>>(reinterpret_cast<const uint8_t*>(q), page_elems, pages, scale,
                                                  out);
  M3_CUDA_LAUNCH_CHECK();
}

void kv_quantize_e4m3(const __nv_bfloat16* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s) {
  launch(x, n, scale, q, s);
}
void kv_quantize_e4m3(const float* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s) { launch(x, n, scale, q, s); }

}  // namespace m3::cuda
