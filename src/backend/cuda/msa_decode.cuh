// MSA sparse attention for decode (docs/MSA_CONTRACT.md §4.5): the page table is built from the selected blocks, every
// (query row t, KV head h) becomes one fake request r = t·Hkv + h with G query heads and ≤ top_k pages, and the
// single paged GQA decode kernel (attention_dense.cuh) runs on B·Q·Hkv requests through the strided virtual-page
// view of the HND cache: virtual page v = physical·(page_stride / (B·D)) + h.
// Fake request r: pages v(pt[sel_0]), …, v(pt[local]) (the selection's valid prefix, local last), last-page fill
// p % B + 1, so causality needs no mask. The selection is consumed as produced (no sort).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"

namespace m3::cuda {

// Device kernel wrapper: indices[indptr[r] + s] = v(pt[selection[h, t, s]], h) for s < n_valid(r). Checks the MSA
// contract (valid prefix of exactly n_valid, ids in [0, local], unique, local last, −1 after) and ORs 1 into
// *error on a violation (a bad entry is replaced by the local block so memory stays in bounds).
void build_sparse_page_list(const int32_t* selection, const DevStepRows& rows, int Hkv, int top_k, int block_size,
                            int64_t pages_per_unit, const int32_t* indptr, int32_t* indices, int* error,
                            cudaStream_t s);

// Per-step lists shared by msa_decode and msa_prefill: n_valid(r) = min(top_k, p/B + 1) depends on positions only,
// so indptr and the last-page fill are known at plan() time; only the page ids depend on the layer's selection.
class SparseAttentionLists {
 public:
  void plan(const std::vector<int32_t>& pos, int num_kv_heads, int group, int head_dim, int block_size, int top_k,
            cudaStream_t s);
  // Throws m3::Error when a run() since the last check saw a selection violating the contract (syncs the stream).
  void check(cudaStream_t s);
  int R() const { return R_; }

 protected:
  void fill(const int32_t* selection, const DevStepRows& rows, const DevPagedKV& kv, cudaStream_t s);
  PagedGqaArgs args(const float* q, const DevPagedKV& kv, float scale, float* out) const;

  int R_ = 0, Hkv_ = 0, G_ = 0, D_ = 0, B_ = 0, K_ = 0, max_pages_ = 0;
  std::vector<int32_t> h_indptr_, h_last_;
  DeviceBuffer<int32_t> indptr_, indices_, last_, error_;
};

// Decode / speculative verify: plan() once per step (split-K chosen here when B·Q·Hkv is too small to fill the
// GPU), run() per sparse layer.
class MsaDecode : public SparseAttentionLists {
 public:
  void plan(const std::vector<int32_t>& pos, int num_kv_heads, int group, int head_dim, int block_size, int top_k,
            bool allow_split, cudaStream_t s);
  // q, out: [T, Hq, D]; selection: [Hkv, T, top_k] (head-major, local last, −1 padding).
  void run(const float* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKV& kv, float scale,
           float* out, cudaStream_t s);
  int splits() const { return splits_; }

 private:
  int splits_ = 1;
  DeviceBuffer<float> part_o_, part_lse_;
};

}  // namespace m3::cuda
