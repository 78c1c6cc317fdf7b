// MSA sparse prefill: which kernel serves each tile (the rule of backend/cuda/msa_prefill_sparse.cuh). The route
// twin below is the CPU reference of the device route kernel; union_only is the host's shortcut, header-only so the
// CUDA backend (which does not link the CPU backend) uses the same code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace m3::cpu {

constexpr int kMsaRouteTileRows = 8;  // step rows per routing tile (the union-tile kernel's CTA)

// Per (tile of 8 consecutive step rows, KV head h): E = the tile's valid selection entries (0 ≤ b ≤ local of the
// row), |U| = distinct physical pages among them (pt_pages[pt_indptr[row_seq[t]] + b]); route[tile · Hkv + h] = 1
// (KV-block-major) when |U| > top_k and |U| · 100 > E · threshold_pct, else 0 (union tile). selection: [Hkv, T,
// top_k]. The absolute term: a union of at most top_k pages streams no more than one row's own selection, so the
// union tile cannot lose there, while the KV-block-major path adds its partials and combine (H200: T = 1 at position
// 0, 0.011 vs 0.028 ms; bench/results/2026-12-03f-h200.md run 6).
std::vector<uint8_t> msa_prefill_route(const int32_t* selection, const int32_t* pos, const int32_t* row_seq,
                                       const int32_t* pt_indptr, const int32_t* pt_pages, int64_t T, int Hkv,
                                       int top_k, int block_size, int threshold_pct);

// True when msa_prefill_route gives 0 for every tile whatever the indexer chose: every row's selection is fixed
// (local + 1 ≤ top_k: all of its blocks), and per tile the union is at most Σ over the tile's sequences (rows of one
// sequence are consecutive) of their rows' largest local + 1 — shared prefix pages only lower it — while E = Σ
// (local + 1); that bound ≤ top_k or within the ratio routes the tile to the union kernel. A negative position
// returns false (the device reports it).
inline bool msa_prefill_union_only(const int32_t* pos, const int32_t* row_seq, int64_t T, int block_size, int top_k,
                                   int threshold_pct) {
  if (block_size <= 0) return false;
  for (int64_t t0 = 0; t0 < T; t0 += kMsaRouteTileRows) {
    const int64_t t1 = std::min<int64_t>(T, t0 + kMsaRouteTileRows);
    int64_t entries = 0, union_bound = 0;
    for (int64_t t = t0; t < t1;) {
      int32_t widest = 0;
      const int32_t sq = row_seq[t];
      for (; t < t1 && row_seq[t] == sq; ++t) {
        if (pos[t] < 0) return false;
        const int32_t n = pos[t] / block_size + 1;  // the row's blocks
        if (n > top_k) return false;
        entries += n;
        widest = std::max(widest, n);
      }
      union_bound += widest;
    }
    if (union_bound > top_k && union_bound * 100 > entries * threshold_pct) return false;
  }
  return true;
}

}  // namespace m3::cpu
