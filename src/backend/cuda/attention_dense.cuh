// Paged attention over the HND cache: ONE paged GQA decode kernel that every attention flavour feeds.
//
// The kernel sees "fake requests" r = 0..R-1, each with one KV head, G query heads and its own page list
// (FlashInfer-style CSR: indptr/indices, plus the fill of its last page). It never knows about positions: causality
// comes from the lengths. A query row t of KV head h becomes r = t·Hkv + h, so q [T, Hq, D] is read as [T·Hkv, G, D]
// (query head m = h·G + g is contiguous) and the output likewise (docs/MSA_CONTRACT.md §4.5).
//
// Pages are addressed through a strided, virtual-page view of the page unit (kv/kv_cache.h): element (virtual page
// v, token j, d) lives at base + v·stride_page + j·stride_tok + d. With the HND unit
// [.. K_l [Hkv, B, D] ..] of page_stride floats (a multiple of B·D, see KV pages below), stride_page = B·D,
// stride_tok = D and v = physical_page · (page_stride / (B·D)) + h.
//
// Users: dense causal prefill and decode (this file: page list = the sequence's pages 0..p/B), MSA sparse prefill
// (msa_prefill: query-major, one CTA per (query token, KV head)) and MSA decode (msa_decode: page list built from
// the selected blocks). Split-K: a request's pages are cut into `num_splits` contiguous ranges processed by separate
// CTAs that write normalised partial O and LSE; a merge kernel combines them (empty splits: O = 0, LSE = −inf).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_types.cuh"

namespace m3::cuda {

// Device view of one layer's K and V pools: element (page p, KV head h, token j, channel d) at
// k + p·page_stride + (h·B + j)·D + d, in elements of `type`. Per-layer pools (issue 9) have page_stride = Hkv·B·D;
// any multiple of B·D works (virtual page v = p·(page_stride / (B·D)) + h).
struct DevPagedKV {
  void* k = nullptr;
  void* v = nullptr;
  int64_t page_stride = 0;  // elements per page, a multiple of block_size·head_dim
  int num_kv_heads = 0, block_size = 0, head_dim = 0;
  KvType type = KvType::F32;
  int64_t pages_per_unit() const { return page_stride / (int64_t(block_size) * head_dim); }
};

// The query rows of one forward step, on the device (shared by all layers of the step).
struct DevStepRows {
  const int32_t* pos = nullptr;        // [T] absolute positions
  const int32_t* row_seq = nullptr;    // [T] sequence of each row
  const int32_t* pt_indptr = nullptr;  // [S + 1] page-table CSR
  const int32_t* pt_pages = nullptr;   // physical page of logical block b of sequence s: pt_pages[pt_indptr[s] + b]
  int T = 0;
};

struct PagedGqaArgs {
  const float* q = nullptr;  // [R, G, D]
  float* out = nullptr;      // [R, G, D]
  const void* k = nullptr;  // elements of kv_type
  const void* v = nullptr;
  KvType kv_type = KvType::F32;
  int64_t stride_page = 0, stride_tok = 0;  // elements
  const int32_t* indptr = nullptr;   // [R + 1]
  const int32_t* indices = nullptr;  // virtual pages
  const int32_t* last_len = nullptr; // [R] tokens valid in the last page (1..page_size)
  int R = 0, G = 0, D = 0, page_size = 0;
  float scale = 1.f;
  int num_splits = 1;
  float* part_o = nullptr;    // [num_splits, R, G, D] when num_splits > 1
  float* part_lse = nullptr;  // [num_splits, R, G]
};
// Runs the kernel (and the merge when num_splits > 1). D must be a multiple of 32 and ≤ 256, G ≤ 32.
void paged_gqa_decode(const PagedGqaArgs& a, cudaStream_t s);

// Picks a split count so that R·splits fills the GPU about twice while every split keeps ≥ 2 pages.
int choose_splits(int64_t R, int64_t max_pages);

// Dense causal GQA over the full history (layers 0–2, and any dense layer): plan() per step, run() per layer.
class DenseAttention {
 public:
  // pos: host copy of the step's positions; rows: the same on the device. Builds the per-(row, KV head) page lists
  // 0..pos/B (layer-independent) and the split plan.
  void plan(const std::vector<int32_t>& pos, const DevStepRows& rows, int num_kv_heads, int group, int head_dim,
            int block_size, int64_t pages_per_unit, bool allow_split, cudaStream_t s);
  // The same page lists from the device rows alone (CUDA graphs: the launches depend on rows.T and the capacity
  // only). max_pages: a capacity, every row's pos / B + 1 must be ≤ it (the caller checks). For the tensor-core
  // decode (indptr / indices / last_len); run() then runs without splits.
  void plan_device(const DevStepRows& rows, int num_kv_heads, int group, int head_dim, int block_size,
                   int64_t pages_per_unit, int max_pages, cudaStream_t s);
  // q, out: [T, Hq, D]. kv: this layer's view.
  void run(const float* q, const DevPagedKV& kv, float scale, float* out, cudaStream_t s);
  // The plan's page lists (fake request r = t·Hkv + h), for other paged kernels (the tensor-core decode).
  int R() const { return R_; }
  int max_pages() const { return max_pages_; }
  const int32_t* indptr() const { return indptr_.get(); }
  const int32_t* indices() const { return indices_.get(); }
  const int32_t* last_len() const { return last_.get(); }

 private:
  int R_ = 0, G_ = 0, D_ = 0, B_ = 0, splits_ = 1, max_pages_ = 0;
  std::vector<int32_t> h_indptr_, h_last_;
  DeviceBuffer<int32_t> indptr_, indices_, last_;
  DeviceBuffer<float> part_o_, part_lse_;
};

}  // namespace m3::cuda
