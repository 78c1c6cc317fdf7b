#include "backend/cuda/msa_decode.cuh"

#include <algorithm>

namespace m3::cuda {

namespace {

// One thread per fake request r = t·Hkv + h (top_k ≤ 64 entries each).
__global__ void build_sparse_pages_kernel(const int32_t* __restrict__ sel, DevStepRows rows, int Hkv, int K, int B,
                                          int64_t ppu, const int32_t* __restrict__ indptr,
                                          int32_t* __restrict__ indices, int* __restrict__ error) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= int64_t(rows.T) * Hkv) return;
  const int t = int(r / Hkv), h = int(r % Hkv);
  const int32_t* srow = sel + (int64_t(h) * rows.T + t) * K;
  const int32_t* pt = rows.pt_pages + rows.pt_indptr[rows.row_seq[t]];
  const int local = rows.pos[t] / B;
  const int n = indptr[r + 1] - indptr[r];
  bool bad = false;
  for (int s = 0; s < K; ++s) {
    int b = srow[s];
    if (s >= n) {
      bad |= b != -1;
      continue;
    }
    const bool ok = b >= 0 && b <= local && ((s == n - 1) == (b == local));
    bool dup = false;
    for (int u = 0; u < s && ok; ++u) dup |= srow[u] == b;
    if (!ok || dup) bad = true, b = local;
    indices[indptr[r] + s] = int32_t(pt[b] * ppu + h);
  }
  if (bad) atomicOr(error, 1);
}

}  // namespace

void build_sparse_page_list(const int32_t* selection, const DevStepRows& rows, int Hkv, int top_k, int block_size,
                            int64_t pages_per_unit, const int32_t* indptr, int32_t* indices, int* error,
                            cudaStream_t s) {
  const int64_t R = int64_t(rows.T) * Hkv;
  if (R == 0) return;
  build_sparse_pages_kernel<<<unsigned((R + 127) / 128), 128, 0, s>>>(selection, rows, Hkv, top_k, block_size,
                                                                      pages_per_unit, indptr, indices, error);
  M3_CUDA_LAUNCH_CHECK();
}

void SparseAttentionLists::plan(const std::vector<int32_t>& pos, int num_kv_heads, int group, int head_dim,
                                int block_size, int top_k, cudaStream_t s) {
  const int64_t T = int64_t(pos.size());
  M3_CUDA_REQUIRE(T * num_kv_heads < (int64_t(1) << 31) / std::max(top_k, 1), "msa attention: too many rows");
  R_ = int(T * num_kv_heads), Hkv_ = num_kv_heads, G_ = group, D_ = head_dim, B_ = block_size, K_ = top_k;
  h_indptr_.assign(size_t(R_) + 1, 0);
  h_last_.assign(size_t(R_), 0);
  max_pages_ = 0;
  for (int64_t t = 0; t < T; ++t) {
    M3_CUDA_REQUIRE(pos[t] >= 0, "msa attention: negative position %d", pos[t]);
    const int n = std::min(top_k, pos[t] / block_size + 1);
    max_pages_ = std::max(max_pages_, n);
    for (int h = 0; h < num_kv_heads; ++h) {
      const int64_t r = t * num_kv_heads + h;
      h_last_[r] = pos[t] % block_size + 1;
      h_indptr_[r + 1] = h_indptr_[r] + n;
    }
  }
  if (error_.size() == 0) {
    error_.grow(1);
    M3_CUDA_CHECK(cudaMemsetAsync(error_.get(), 0, sizeof(int32_t), s));
  }
  if (R_ == 0) return;
  upload(indptr_, h_indptr_.data(), h_indptr_.size(), s);
  upload(last_, h_last_.data(), h_last_.size(), s);
  indices_.grow(size_t(h_indptr_.back()));
}

void SparseAttentionLists::fill(const int32_t* selection, const DevStepRows& rows, const DevPagedKV& kv,
                                cudaStream_t s) {
  M3_CUDA_REQUIRE(rows.T * Hkv_ == R_ && kv.block_size == B_ && kv.head_dim == D_ && kv.num_kv_heads == Hkv_,
                  "msa attention: rows/cache do not match the plan");
  M3_CUDA_REQUIRE(kv.page_stride % (int64_t(B_) * D_) == 0,
                  "msa attention: page of %lld elements is not a multiple of block·head_dim",
                  (long long)kv.page_stride);
  build_sparse_page_list(selection, rows, Hkv_, K_, B_, kv.pages_per_unit(), indptr_.get(), indices_.get(),
                         reinterpret_cast<int*>(error_.get()), s);
}

PagedGqaArgs SparseAttentionLists::args(const float* q, const DevPagedKV& kv, float scale, float* out) const {
  PagedGqaArgs a;
  a.q = q, a.out = out, a.k = kv.k, a.v = kv.v, a.kv_type = kv.type;
  a.stride_page = int64_t(B_) * D_, a.stride_tok = D_;
  a.indptr = indptr_.get(), a.indices = indices_.get(), a.last_len = last_.get();
  a.R = R_, a.G = G_, a.D = D_, a.page_size = B_, a.scale = scale;
  return a;
}

void SparseAttentionLists::check(cudaStream_t s) {
  int32_t err = 0;
  if (error_.size() == 0) return;
  M3_CUDA_CHECK(cudaMemcpyAsync(&err, error_.get(), sizeof err, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  if (err) {
    M3_CUDA_CHECK(cudaMemsetAsync(error_.get(), 0, sizeof(int32_t), s));
    failf("msa attention: a selection row violates the MSA contract (valid prefix, range, uniqueness, local last)");
  }
}

void MsaDecode::plan(const std::vector<int32_t>& pos, int num_kv_heads, int group, int head_dim, int block_size,
                     int top_k, bool allow_split, cudaStream_t s) {
  SparseAttentionLists::plan(pos, num_kv_heads, group, head_dim, block_size, top_k, s);
  splits_ = allow_split ? choose_splits(R_, max_pages_) : 1;
  if (splits_ > 1) {
    part_o_.grow(size_t(splits_) * R_ * G_ * D_);
    part_lse_.grow(size_t(splits_) * R_ * G_);
  }
}

void MsaDecode::run(const float* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKV& kv,
                    float scale, float* out, cudaStream_t s) {
  if (R_ == 0) return;
  fill(selection, rows, kv, s);
  PagedGqaArgs a = args(q, kv, scale, out);
  a.num_splits = splits_, a.part_o = part_o_.get(), a.part_lse = part_lse_.get();
  paged_gqa_decode(a, s);
}

}  // namespace m3::cuda
