// Shared helpers of the CUDA backend: error checks, a tiny RAII device buffer, warp/block reductions.
//
// .cu files must not include fmt/spdlog (nvcc 13 + C++20 cannot compile them), so errors raised from CUDA code go
// through plain C functions defined in common.cpp, which turns them into m3::Error like the rest of m3serve.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace m3::cuda {

// Throws m3::Error("CUDA error <name> (<code>) in <expr> at <file>:<line>").
[[noreturn]] void raise_cuda_error(const char* expr, int code, const char* msg, const char* file, int line);
// Throws m3::Error with a printf-formatted message (the CUDA side's M3_CHECK).
[[noreturn]] void failf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Devices visible to this process (0 when the driver or runtime is missing; never throws).
int device_count();

// Streaming multiprocessors of the current device (132 when it cannot be queried); cached after the first call.
int sm_count();

// Counts every device (re)allocation of a DeviceBuffer in this process. A captured CUDA graph bakes device pointers
// in; the executor records the epoch at capture and re-captures when it changed (a buffer it reads may have moved).
uint64_t alloc_epoch();
void bump_alloc_epoch();

}  // namespace m3::cuda

// Every runtime call is checked; every launch is followed by M3_CUDA_LAUNCH_CHECK().
#define M3_CUDA_CHECK(expr)                                                                         \
  do {                                                                                             \
    cudaError_t m3_err_ = (expr);                                                                  \
    if (m3_err_ != cudaSuccess)                                                                    \
      ::m3::cuda::raise_cuda_error(#expr, int(m3_err_), cudaGetErrorString(m3_err_), __FILE__, __LINE__); \
  } while (0)
#define M3_CUDA_LAUNCH_CHECK() M3_CUDA_CHECK(cudaGetLastError())
#define M3_CUDA_REQUIRE(cond, ...)                \
  do {                                            \
    if (!(cond)) ::m3::cuda::failf(__VA_ARGS__);  \
  } while (0)

namespace m3::cuda {

// Owning device allocation (plain cudaMalloc). grow() keeps nothing: it is for scratch space.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { grow(n); }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  // Ensures room for n elements; reallocates (contents lost) when too small. cudaFree synchronises the device,
  // so a buffer still read by queued work is never freed under it.
  void grow(size_t n) {
    if (n <= n_) return;
    reset();
    M3_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T)));
    n_ = n;
    bump_alloc_epoch();
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Host → device copy of a small vector into a growing buffer (stream-ordered; the host data must stay alive until
// the copy ran, so callers sync or keep the vector — plan() objects keep their host copies as members).
template <typename T>
inline void upload(DeviceBuffer<T>& dst, const T* src, size_t n, cudaStream_t s) {
  dst.grow(n);
  if (n) M3_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src, n * sizeof(T), cudaMemcpyHostToDevice, s));
}

#ifdef __CUDACC__
// The segment of a CSR offsets array holding item i: the last s in [0, n) with indptr[s] ≤ i (indptr ascending,
// indptr[0] ≤ i; among empty segments sharing a start, the last one — the non-empty segment that holds i when
// i < indptr[n]). indptr may point to shared or global memory.
__device__ __forceinline__ int csr_segment_of(const int32_t* indptr, int n, int i) {
  int lo = 0, hi = n;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (indptr[mid] <= i) lo = mid;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the whole block (blockDim.x a multiple of 32, ≤ 1024). Every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = lane < nw ? part[lane] : 0.f;
  return warp_sum(t);
}
#endif

}  // namespace m3::cuda
