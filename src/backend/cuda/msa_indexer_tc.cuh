// MSA prefill indexer on Hopper tensor cores (issue 10 item 4): the block scores as a GEMM with a row-max epilogue.
// Semantics: cpu::msa_block_scores (as MsaIndexer, msa_indexer.cuh): for query row t and index head h,
//   scores[h, t, b] = max_{j in block b} iq[t, h]·ik[j]  for b < local(t) = pos[t] / B, −inf for the other
//   columns < max_cols. Layout [Hidx, T, max_cols]; every element is written.
// M = (token, head) rows (iq [T, Hidx, Di] is already row-major in them), N = one 128-key index-K page reached through
// the sequence's page table, K = Di = 128. CTA = 128 rows of ONE sequence (128 / Hidx tokens), two consumer
// warpgroups of 64 rows; the producer streams the sequence's history pages 0 .. max local − 1 of the tile by TMA.
// bf16 iq and bf16 index-K pages; fp32 accumulate and fp32 scores, so msa_topk ranks them exactly as for the v1
// kernel (scores differ from v1's only by iq's bf16 rounding).
// run_topk() fuses the top-k into the same CTA (docs/KERNELS.md §8.3): a tile already streams every history page of
// its rows, so each row keeps a running top-(K − 1) in registers (4 slots in each lane of its quad, replaced only when
// a block ranks before the current worst) and the CTA writes the final selection ([Hidx, T, K], the cpu::msa_topk
// contract on the cpu::msa_block_scores scores: ties to the lower id, NaN as −inf, local block last, −1 padding).
// No score matrix, no −inf fill, no second kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"

namespace m3::cuda {

class MsaIndexerTc {
 public:
  // pos / row_seq: host copies of the step rows (rows of one sequence contiguous). Supports Di 128, B 128 and
  // Hidx dividing 128; else m3::Error. Builds the tile list (tiles never span sequences; longest first).
  void plan(const std::vector<int32_t>& pos, const std::vector<int32_t>& row_seq, int num_heads, int index_dim,
            int block_size, cudaStream_t s);
  int64_t max_cols() const { return max_cols_; }  // max local + 1 (at least 1)
  // iq: [T, Hidx, Di] bf16; ik: the layer's bf16 index-K pool, page p at ik + p·page_stride elements ([B, Di]);
  // scores: [Hidx, T, max_cols()] fp32.
  void run(const uint16_t* iq, const uint16_t* ik, int64_t page_stride, int64_t num_pages, const DevStepRows& rows,
           float* scores, cudaStream_t s);

  // Fused scores + top-k (1 ≤ top_k ≤ 16): writes selection [Hidx, T, top_k] only. Same plan() as run().
  // Overlap: two accumulator sets, the MMAs of the next page run under this page's max + top-k epilogue.
  enum class TopKPipeline { Serial, Overlap };
  static constexpr int kMaxTopK = 16;
  void run_topk(const uint16_t* iq, const uint16_t* ik, int64_t page_stride, int64_t num_pages, const DevStepRows& rows,
                int top_k, int32_t* selection, cudaStream_t s, TopKPipeline pipeline = TopKPipeline::Overlap);

  // Work item: a tile of ≤ 128 / Hidx tokens of one sequence and its page range [b0, b1); cand ≥ 0: a split of the
  // tile (candidate set index), −1: the whole history (the CTA writes the final selection).
  struct Tile {
    int32_t t0, n, max_local, seq, b0, b1, cand;
  };
  struct MergeRow {  // one (token, head) row of a split tile: its candidates at cand, splits × [128 rows][16] apart
    int32_t t, h;
    int64_t cand;
    int32_t splits;
  };
  // Split tuning: the grid the split aims at (0 = the device's SM count; 1 = never split, for tests).
  void set_target_ctas(int n) { target_ctas_ = n; }
  int num_items() const { return int(h_tiles_.size()); }
  int num_split_rows() const { return int(h_merge_.size()); }
  static constexpr int kMinSplitPages = 32, kMaxSplits = 64;

 private:
  int H_ = 0, T_ = 0;
  int64_t max_cols_ = 1;
  int target_ctas_ = 0, num_cand_ = 0;
  std::vector<Tile> h_tiles_;
  std::vector<MergeRow> h_merge_;
  DeviceBuffer<Tile> tiles_;
  DeviceBuffer<MergeRow> merge_;
  DeviceBuffer<float> cand_;
};

}  // namespace m3::cuda
