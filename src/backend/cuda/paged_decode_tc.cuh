// Tensor-core paged GQA decode over bf16 or e4m3 K/V (issues 11, 15; design in docs/KERNELS.md §9). Same fake-request model as
// paged_gqa_decode (attention_dense.cuh): request r has G query heads, one KV head and a CSR page list of virtual
// pages (indptr / indices / last-page fill), so MSA decode (page list emitted by the decode indexer) and dense decode
// (pages 0..p/B) both use it. Fixed shape: head dim 128, page 128 tokens, G ∈ {8, 16} (one mma M-tile of 16 rows).
//
// plan() (host, may allocate) picks the schedule and the split count from R and the longest page list; run() is
// allocation-free and capture-safe: one launch. Cluster schedule (the default): with splits > 1 (≤ 16) the splits of
// a request form one thread-block cluster and merge their partial (O, LSE) through distributed shared memory.
// Balanced schedule (opt-in, Schedule): equal chunk ranges per CTA of a persistent grid, cut requests merged from
// global scratch (see paged_decode_tc.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace m3::cuda {

// KvT: element type of the K/V pools: __nv_bfloat16, or e4m3_t (kv_fp8.cuh; --kv-cache-dtype fp8) whose values are
// e4m3 · k_scale and e4m3 · v_scale (per-tensor fp32 scales; ignored for bf16).
template <typename KvT>
struct PagedDecodeTcArgs {
  const __nv_bfloat16* q = nullptr;  // [R, G, 128]
  __nv_bfloat16* out = nullptr;      // [R, G, 128]
  const KvT* k = nullptr;            // element (virtual page v, token j, d) at k + v·stride_page + j·stride_tok + d
  const KvT* v = nullptr;
  int64_t stride_page = 0, stride_tok = 0;  // elements; HND [P, Hkv, 128, 128]: 128·128 and 128, v = p·Hkv + h
  const int32_t* indptr = nullptr;          // [R + 1]
  const int32_t* indices = nullptr;         // virtual pages
  const int32_t* last_len = nullptr;        // [R] tokens valid in the last page (1..128)
  int R = 0, G = 0;
  float scale = 1.f;
  float k_scale = 1.f, v_scale = 1.f;  // e4m3 only
  // Bench only (bench_decode --trace): PagedDecodeTc::kTraceSlots %globaltimer stamps (ns) per CTA, CTA index
  // split · R + r; null (the default) turns it off. Slots in paged_decode_tc.cu (trace_stamp).
  uint64_t* trace = nullptr;
};

class PagedDecodeTc {
 public:
  static constexpr int kHeadDim = 128, kPage = 128;
  static constexpr int kTraceSlots = 8;
  // The balanced schedule keeps indptr in shared memory: at most this many requests (B ≤ 255 at 4 KV heads).
  static constexpr int kMaxBalancedRequests = 1023;
  // How the work is cut over CTAs (docs/KERNELS.md §9). kCluster: one CTA per (request, split), a request's splits a
  // thread-block cluster merged through distributed shared memory. kBalanced: a persistent grid, every CTA an
  // equal range of the step's chunks across request boundaries, cut requests merged from global scratch by the
  // last CTA to finish one (≤ kMaxBalancedRequests; a cut of few long requests leaves many parts to one merging CTA).
  // kAuto: cluster — the balanced schedule measured slower so far (paged_decode_tc.cu, plan()) and is opt-in.
  enum class Schedule { kAuto, kCluster, kBalanced };
  // R fake requests with at most max_pages pages each; allow_split = false forces one CTA per request (cluster
  // schedule). dynamic = false: every split owns a fixed count of chunks derived from max_pages (the longest list of
  // this step). dynamic = true (CUDA graphs, docs/KERNELS.md §9): max_pages is a capacity and only sets the split
  // count; each request's own chunks are cut evenly over the splits in the kernel, so the launch depends on
  // (R, G, capacity) alone and one captured launch serves any step of R requests (the balanced schedule reads the
  // page lists on the device either way). The balanced schedule's scratch (2 partials per CTA, a ticket per request,
  // about 4.4 MB) is allocated here on first use — never inside a capture if an eager step planned the same R first.
  void plan(int R, int G, int max_pages, bool allow_split, bool dynamic = false, Schedule schedule = Schedule::kAuto);
  // pdl: launch with programmatic dependent launch (the CTAs start while the previous kernel drains and wait for it
  // before reading anything).
  template <typename KvT>
  void run(const PagedDecodeTcArgs<KvT>& a, cudaStream_t s, bool pdl = false);
  int splits() const { return splits_; }
  bool deep() const { return deep_; }
  bool balanced() const { return balanced_; }
  // The balanced grid for this element type: bf16 deep (1 CTA per SM), e4m3 wide (2 per SM: its conversions need
  // the 8 warps) unless M3_DECODE_BALANCED_SHAPE=deep|wide says otherwise (benchmarks).
  template <typename KvT>
  bool balanced_deep() const;

 private:
  int R_ = 0, G_ = 0, splits_ = 1, chunks_per_split_ = 1;
  int max_units_ = 0;  // balanced: upper bound of the step's chunks (2 · R · max_pages)
  bool deep_ = false;  // 6-stage pipeline at 1 CTA per SM instead of 3 stages at 2 (see plan())
  bool balanced_ = false;
  DeviceBuffer<float> part_;
  DeviceBuffer<int> tickets_;
};

}  // namespace m3::cuda
