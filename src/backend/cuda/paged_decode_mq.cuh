// Multi-query paged GQA decode over bf16 K/V (issue 11 item 4; design in docs/KERNELS.md §9): the Q ≤ 8 query rows
// of one request (speculative verify / MTP rows at consecutive positions) attend in ONE CTA per (request, KV head),
// which streams the union of the rows' selected pages once instead of once per row.
//
// Inputs are exactly PagedDecodeTc's (paged_decode_tc.cuh): q [T, Hkv·G, 128] viewed as fake requests
// r = t·Hkv + h of G query heads, and the per-(row, KV head) CSR page lists (indptr [T·Hkv + 1], virtual pages
// v = p·Hkv + h for HND pools, last-page fill), so MsaDecodeIndex's page list feeds it unchanged and dense lists work
// too. Added: req_indptr, the grouping of the T rows into N requests of consecutive rows (Q = 1..8 rows each). The
// output is PagedDecodeTc's, row by row: every row keeps its own selection and causality (its last page's fill).
// Contract: a request's rows hold together at most kMaxEntries = 128 page-list entries (e.g. 8 rows × top-16, or one
// row of ≤ 128 pages); plan() checks it against (max_q, max_pages).
//
// plan() (host, allocates nothing) picks the split count from N·Hkv; run() is one launch, allocation-free and
// capture-safe (the split count depends on (N, Hkv, max_q, max_pages) only; each CTA cuts its own union evenly over
// the splits, so one captured launch serves any page lists of that capacity). Splits of a (request, KV head) form a
// thread-block cluster and merge through distributed shared memory, as in PagedDecodeTc.
// Not wired into the executor: the engine has no speculative decoding yet.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace m3::cuda {

template <typename KvT>
struct PagedDecodeMqArgs {
  const __nv_bfloat16* q = nullptr;  // [T, Hkv·G, 128]
  __nv_bfloat16* out = nullptr;      // [T, Hkv·G, 128]
  const KvT* k = nullptr;            // element (virtual page v, token j, d) at k + v·stride_page + j·stride_tok + d
  const KvT* v = nullptr;
  int64_t stride_page = 0, stride_tok = 0;  // elements; HND [P, Hkv, 128, 128]: 128·128 and 128
  const int32_t* indptr = nullptr;          // [T·Hkv + 1]: page list of (row t, KV head h) is list t·Hkv + h
  const int32_t* indices = nullptr;         // virtual pages
  const int32_t* last_len = nullptr;        // [T·Hkv] tokens valid in the last page (1..128)
  const int32_t* req_indptr = nullptr;      // [N + 1]: request n owns rows [req_indptr[n], req_indptr[n + 1]), ≤ 8
  int N = 0, Hkv = 0, G = 0;
  float scale = 1.f;
};

class PagedDecodeMq {
 public:
  static constexpr int kHeadDim = 128, kPage = 128, kMaxRows = 8, kMaxEntries = 128;
  // N requests of at most max_q rows, each row's list at most max_pages pages (max_q·max_pages ≤ 128).
  // allow_split = false forces one CTA per (request, KV head).
  void plan(int N, int Hkv, int G, int max_q, int max_pages, bool allow_split);
  // pdl: programmatic dependent launch (the CTAs wait for the previous kernel before reading anything).
  template <typename KvT>
  void run(const PagedDecodeMqArgs<KvT>& a, cudaStream_t s, bool pdl = false);
  int splits() const { return splits_; }
  // Clusters of `splits` CTAs that can be resident at once (0: such a cluster cannot launch).
  static int max_active_clusters(int splits);

 private:
  int N_ = 0, Hkv_ = 0, G_ = 0, splits_ = 1;
};

}  // namespace m3::cuda
