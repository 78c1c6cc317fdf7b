// MSA decode index scorer fused with top-k and the page-list emit (issue 11; design in docs/KERNELS.md §9).
// Semantics: cpu::msa_block_scores then cpu::msa_topk, then the page list that
// PagedDecodeTc reads: fake request r = t·H + h (index head h selects for KV head h) has pages
// v(pt[sel_0]), …, v(pt[local]) with v(p) = p·kv_pages_per_unit + h, last-page fill pos % 128 + 1.
//
// plan() (once per step, shared by all sparse layers) runs one small device kernel over the step rows: per row the
// work = history pages to score (local when local + 1 > top_k, else 0: a short row's selection is fixed), its prefix
// sum, the physical page of every work item (page tables are shared by the layers), and the attention CSR
// (indptr = prefix of n_valid, last-page fill). run() (per layer) is ONE persistent launch, allocation-free and
// capture-safe: CTAs (2 per SM) take equal ranges of the flattened (row, page) work, stream each index-K page
// [128, 128] bf16 through a 3-stage cp.async ring (L2 evict-first), score it with mma.sync (keys as M, index heads
// as N), write the block max per (head, row, page); the CTA that completes a row (per-row ticket) runs
// the top-k for its H heads (one warp per head) and writes the selection and the page list.
// Fixed shape: block 128 tokens, index dim 128, H ∈ 1..4 index heads, top_k ≤ 16, one query row per request (Q = 1;
// rows of a multi-query request are scored independently).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"

namespace m3::cuda {

// Index keys of one layer: page p holds keys [128, 128] at ik + p·page_stride (elements). KT: __nv_bfloat16, or
// e4m3_t (kv_fp8.cuh) with key = e4m3 · scale (per-tensor, > 0; MSA stores unscaled e4m3 keys: 1; ignored for bf16).
template <typename KT>
struct DevPagedIndexKT {
  const KT* ik = nullptr;
  int64_t page_stride = 0;
  float scale = 1.f;
};

class MsaDecodeIndex {
 public:
  static constexpr int kBlock = 128, kDim = 128, kMaxHeads = 4, kMaxTopK = 16, kMaxRows = 2048;
  // T rows with host positions pos (for the score-matrix width); rows: the same step on the device.
  void plan(const std::vector<int32_t>& pos, const DevStepRows& rows, int num_heads, int top_k,
            int64_t kv_pages_per_unit, cudaStream_t s);
  // The same plan from the device rows alone (a CUDA graph replays it with new rows): the launches depend only on
  // (rows.T, H, top_k, max_cols). max_cols is a capacity: every row's history blocks pos / 128 must be ≤ it (the
  // caller checks; the executor uses max_position_embeddings / 128). The work count stays on the device (run()
  // reads it), the page lists are planned for top_k pages per request.
  void plan_device(const DevStepRows& rows, int num_heads, int top_k, int64_t kv_pages_per_unit, int64_t max_cols,
                   cudaStream_t s);
  // iq: [T, H, 128] bf16; rows: the plan's rows (their page table was flattened by plan()). Writes scores (history
  // columns only), selection [H, T, top_k] and the page list.
  // pdl: programmatic dependent launch — before waiting for the previous kernel the CTAs read only the step plan
  // and history index-K pages, so the plan must come from an earlier, completed launch (plan() then any other
  // kernel, as in a decode step).
  template <typename KT>
  void run(const __nv_bfloat16* iq, const DevPagedIndexKT<KT>& cache, const DevStepRows& rows, cudaStream_t s,
           bool pdl = false);

  int T() const { return T_; }
  int64_t max_cols() const { return max_cols_; }
  const float* scores() const { return scores_.get(); }             // [H, T, max_cols]
  const int32_t* selection() const { return selection_.get(); }     // [H, T, top_k]
  const int32_t* attn_indptr() const { return attn_indptr_.get(); } // [T·H + 1]
  const int32_t* attn_indices() const { return attn_indices_.get(); }
  const int32_t* attn_last_len() const { return attn_last_.get(); } // [T·H]
  int max_pages() const { return max_pages_; }                      // longest page list (≤ top_k)
  // Bench only: run() writes kTraceSlots %globaltimer stamps (ns) per CTA to trace[grid() · kTraceSlots] (see
  // msa_decode_index.cu, trace_stamp); null (the default) turns it off.
  static constexpr int kTraceSlots = 8;
  void set_trace(uint64_t* trace) { trace_ = trace; }
  // Rows of ≤ this many history blocks take the radix top-k, longer ones the insertion network (0 … 512; < 0: the
  // default, M3_DECODE_TOPK_RADIX_MAX or 128). Both give the same selection; tests cover each.
  void set_radix_max(int blocks) { radix_max_ = blocks; }
  int grid() const { return grid_; }

 private:
  void launch_plan(const DevStepRows& rows, size_t work_cap, int W, cudaStream_t s);
  int T_ = 0, H_ = 0, K_ = 0, W_ = 0, grid_ = 0, max_pages_ = 0, radix_max_ = -1;
  int64_t max_cols_ = 0, ppu_ = 1;
  DeviceBuffer<int32_t> work_indptr_, work_pages_, attn_indptr_, attn_indices_, attn_last_, selection_, row_done_;
  DeviceBuffer<float> scores_;
  uint64_t* trace_ = nullptr;
};

}  // namespace m3::cuda
