// MSA indexer scoring (semantics: cpu::msa_block_scores): for query row t and index head h,
//   scores[h, t, b] = max_{j in block b} iq[t, h]·ik[j]   for b < local(t) = pos[t] / B (history blocks, fully
//   visible: no causal mask), and −inf for every other column < max_cols.
// Layout head-major [Hidx, T, max_cols] over all rows of the step (docs/MSA_CONTRACT.md §1.1); every element is written.
//
// v1 kernels (fp32 CUDA cores). Prefill: a CTA owns a tile of ≤ 64 (token, head) rows of ONE sequence and a strided
// set of blocks; per block it stages 32 keys at a time in shared memory and keeps a running max per row in registers.
// Decode (plan(decode = true)): tiles of ≤ 32 rows, all 256 threads on keys (8 lanes per key row, 16-byte loads
// straight from the cache), many CTAs per tile over the pages — a bandwidth kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"

namespace m3::cuda {

// Index keys of one layer: pages of [B, Di] elements of `type` at ik + page·page_stride.
struct DevPagedIndexK {
  void* ik = nullptr;
  int64_t page_stride = 0;  // elements
  int block_size = 0, index_dim = 0;
  KvType type = KvType::F32;
};

class MsaIndexer {
 public:
  // pos / row_seq: host copies of the step rows (rows of one sequence are contiguous). Builds the tile list.
  // decode = true spreads each tile's blocks over more CTAs (few rows, long histories).
  void plan(const std::vector<int32_t>& pos, const std::vector<int32_t>& row_seq, int num_heads, int block_size,
            bool decode, cudaStream_t s);
  int64_t max_cols() const { return max_cols_; }  // columns of the score matrix = max local + 1
  // iq: [T, Hidx, Di]; scores: [Hidx, T, max_cols()].
  void run(const float* iq, const DevPagedIndexK& cache, const DevStepRows& rows, float* scores, cudaStream_t s);

  struct Tile {
    int32_t t0, n, max_local, pad;
  };

 private:
  int H_ = 0, B_ = 0, T_ = 0, rows_per_tile_ = 0, col_groups_ = 1;
  bool decode_ = false;
  int64_t max_cols_ = 0;
  std::vector<Tile> h_tiles_;
  DeviceBuffer<Tile> tiles_;
};

}  // namespace m3::cuda
