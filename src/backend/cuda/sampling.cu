#include "backend/cuda/sampling.cuh"

#include <cub/cub.cuh>

namespace m3::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__global__ void iota_rows_kernel(int32_t* ids, int64_t V, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ids[i] = int32_t(i % V);
}

__global__ void offsets_kernel(int32_t* off, int R, int V) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= R) off[i] = i * V;
}

__device__ double block_sum_d(double v, double* part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < kWarps; ++w) t += part[w];  // fixed order
  return t;
}

__device__ int block_min_i(int v, int* part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  int t = part[0];
  for (int w = 1; w < kWarps; ++w) t = min(t, part[w]);
  return t;
}

// Inclusive prefix sum of one value per thread across the block; returns the thread's prefix, *total the sum.
__device__ double block_scan_d(double v, double* part, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) part[warp] = x;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += part[w];
    all += part[w];
  }
  *total = all;
  return before + x;
}

// First index i < n whose inclusive running mass (of prob_i = e_i / sum) satisfies pred(mass); INT_MAX if none.
// strict = false: mass ≥ thr; strict = true: mass > thr. Also returns the mass of the first `n` entries.
__device__ int first_mass_index(const float* keys, int n, float m, double inv_t, double inv_sum, double thr,
                                bool strict, double* part, int* ipart) {
  double carry = 0.0;
  for (int c0 = 0; c0 < n; c0 += kThreads) {
    const int i = c0 + threadIdx.x;
    const double p = i < n ? exp((double(keys[i]) - double(m)) * inv_t) * inv_sum : 0.0;
    double chunk;
    const double c = carry + block_scan_d(p, part, &chunk);
    const bool hit = i < n && (strict ? c > thr : c >= thr);
    const int first = block_min_i(hit ? i : INT_MAX, ipart);
    if (first != INT_MAX) return first;
    carry += chunk;
  }
  return INT_MAX;
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const float* __restrict__ keys_all,
                                                               const int32_t* __restrict__ ids_all, int V,
                                                               const SampleRow* __restrict__ rows,
                                                               int32_t* __restrict__ out) {
  __shared__ double part[kWarps];
  __shared__ int ipart[kWarps];
  const int r = blockIdx.x;
  const SampleRow p = rows[r];
  const float* keys = keys_all + int64_t(r) * V;
  const int32_t* ids = ids_all + int64_t(r) * V;
  if (p.temperature == 0.f || p.top_k == 1) {
    if (threadIdx.x == 0) out[r] = ids[0];
    return;
  }
  const int keep = p.top_k > 0 ? min(p.top_k, V) : V;
  const float m = keys[0];
  const double inv_t = 1.0 / double(p.temperature);
  double s = 0.0;
  for (int i = threadIdx.x; i < keep; i += kThreads) s += exp((double(keys[i]) - double(m)) * inv_t);
  const double sum = block_sum_d(s, part), inv_sum = 1.0 / sum;
  int n = keep;
  if (p.min_p > 0.f) {  // probabilities are non-increasing: keep those ≥ floor (at least one)
    const double floor = double(p.min_p) * (1.0 * inv_sum);
    double cnt = 0.0;
    for (int i = threadIdx.x; i < keep; i += kThreads)
      cnt += exp((double(keys[i]) - double(m)) * inv_t) * inv_sum >= floor ? 1.0 : 0.0;
    n = max(1, int(block_sum_d(cnt, part)));
  }
  if (p.top_p < 1.f) {
    const int i = first_mass_index(keys, n, m, inv_t, inv_sum, double(p.top_p), false, part, ipart);
    if (i != INT_MAX) n = i + 1;
  }
  double kept = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) kept += exp((double(keys[i]) - double(m)) * inv_t) * inv_sum;
  kept = block_sum_d(kept, part);
  const double target = double(p.u) * kept;
  int pick = first_mass_index(keys, n, m, inv_t, inv_sum, target, true, part, ipart);
  if (pick == INT_MAX) pick = n - 1;
  if (threadIdx.x == 0) out[r] = ids[pick];
}

}  // namespace

std::vector<int32_t> GpuSampler::sample(const float* logits, int R, int V, const std::vector<SampleRow>& rows,
                                        cudaStream_t s) {
  std::vector<int32_t> out(size_t(std::max(R, 0)));
  if (R <= 0) return out;
  M3_CUDA_REQUIRE(V > 0 && int64_t(R) * V < (int64_t(1) << 31), "sample: bad logits shape [%d, %d]", R, V);
  M3_CUDA_REQUIRE(int(rows.size()) == R, "sample: %zu parameter rows for %d logit rows", rows.size(), R);
  for (const SampleRow& p : rows)
    M3_CUDA_REQUIRE(p.temperature >= 0.f && p.top_p > 0.f && p.top_p <= 1.f && p.min_p >= 0.f && p.min_p <= 1.f &&
                        p.u >= 0.f && p.u < 1.f,
                    "sample: parameters out of range");
  const int64_t n = int64_t(R) * V;
  keys_.grow(size_t(n));
  ids_in_.grow(size_t(n));
  ids_out_.grow(size_t(n));
  offsets_.grow(size_t(R) + 1);
  out_.grow(size_t(R));
  upload(rows_, rows.data(), rows.size(), s);
  iota_rows_kernel<<<unsigned(std::min<int64_t>((n + 255) / 256, 8192)), 256, 0, s>>>(ids_in_.get(), V, n);
  M3_CUDA_LAUNCH_CHECK();
  offsets_kernel<<<unsigned((R + 1 + 255) / 256), 256, 0, s>>>(offsets_.get(), R, V);
  M3_CUDA_LAUNCH_CHECK();
  size_t bytes = 0;
  M3_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, bytes, logits, keys_.get(), ids_in_.get(), ids_out_.get(), int(n), R, offsets_.get(),
      offsets_.get() + 1, 0, 32, s));
  temp_.grow(bytes);
  M3_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      temp_.get(), bytes, logits, keys_.get(), ids_in_.get(), ids_out_.get(), int(n), R, offsets_.get(),
      offsets_.get() + 1, 0, 32, s));
  sample_rows_kernel<<<unsigned(R), kThreads, 0, s>>>(keys_.get(), ids_out_.get(), V, rows_.get(), out_.get());
  M3_CUDA_LAUNCH_CHECK();
  M3_CUDA_CHECK(cudaMemcpyAsync(out.data(), out_.get(), size_t(R) * 4, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
}

}  // namespace m3::cuda
