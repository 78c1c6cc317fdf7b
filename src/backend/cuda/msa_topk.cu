#include "backend/cuda/msa_topk.cuh"

#include "backend/cuda/common.cuh"

namespace m3::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxK = 64;

__device__ __forceinline__ bool ranks_before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// K − 1 rounds; round k takes the best block ranking strictly after round k − 1's pick (total order: key desc,
// id asc), so no "taken" set is needed. Rows have ≤ max_cols ≈ context/B entries: a few strided reads per thread.
__global__ void __launch_bounds__(kThreads) msa_topk_kernel(const float* __restrict__ scores, int T,
                                                            const int32_t* __restrict__ pos, int B, int64_t max_cols,
                                                            int K, int32_t* __restrict__ selection) {
  __shared__ float wkey[kThreads / 32];
  __shared__ int wid[kThreads / 32];
  __shared__ int chosen[kMaxK];
  const int64_t row = blockIdx.x;  // = h·T + t
  const int t = int(row % T);
  const int local = pos[t] / B, n = local + 1;
  int32_t* sel = selection + row * K;
  if (n <= K) {
    for (int i = threadIdx.x; i < K; i += blockDim.x) sel[i] = i < n ? i : -1;
    return;
  }
  const float* sr = scores + row * max_cols;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float pk = 0.f;
  int pb = -1;
  for (int k = 0; k < K - 1; ++k) {
    float bk = -INFINITY;
    int bb = -1;
    for (int b = threadIdx.x; b < local; b += kThreads) {
      float key = sr[b];
      if (isnan(key)) key = -INFINITY;
      if (pb >= 0 && !ranks_before(pk, pb, key, b)) continue;
      if (bb < 0 || ranks_before(key, b, bk, bb)) bk = key, bb = b;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
      const int ob = __shfl_xor_sync(0xffffffffu, bb, o);
      if (ob >= 0 && (bb < 0 || ranks_before(ok, ob, bk, bb))) bk = ok, bb = ob;
    }
    if (lane == 0) wkey[warp] = bk, wid[warp] = bb;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w)
        if (wid[w] >= 0 && (wid[0] < 0 || ranks_before(wkey[w], wid[w], wkey[0], wid[0]))) wkey[0] = wkey[w], wid[0] = wid[w];
      chosen[k] = wid[0];
    }
    __syncthreads();
    pk = wkey[0], pb = wid[0];
    __syncthreads();  // wkey/wid are rewritten next round
  }
  if (threadIdx.x == 0) {  // ascending ids (n > K ⇒ local ≥ K, so all K − 1 picks exist)
    for (int i = 1; i < K - 1; ++i) {
      const int v = chosen[i];
      int j = i - 1;
      while (j >= 0 && chosen[j] > v) chosen[j + 1] = chosen[j], --j;
      chosen[j + 1] = v;
    }
    for (int i = 0; i < K - 1; ++i) sel[i] = chosen[i];
    sel[K - 1] = local;
  }
}

}  // namespace

void msa_topk(const float* scores, int T, int H, const int32_t* pos, int block_size, int64_t max_cols, int top_k,
              int32_t* selection, cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  M3_CUDA_REQUIRE(top_k >= 1 && top_k <= kMaxK, "msa_topk: top_k %d (supported: 1..%d)", top_k, kMaxK);
  msa_topk_kernel<<<unsigned(int64_t(H) * T), kThreads, 0, s>>>(scores, T, pos, block_size, max_cols, top_k,
                                                                 selection);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
