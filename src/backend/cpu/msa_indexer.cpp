// MSA indexer: block scoring (max over causal keys of each history block) and top-k selection (CPU reference).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/msa_route.h"
#include "base/thread_pool.h"

namespace m3::cpu {

void msa_block_scores(const float* iq, int64_t Tq, int Hidx, const int32_t* positions, const PagedIndexK& cache,
                      const int32_t* page_table, int64_t max_blocks, float* scores) {
  const int B = cache.block_size, Di = cache.index_dim;
  const float ninf = -std::numeric_limits<float>::infinity();
  ThreadPool::global().parallel_for(Tq * Hidx, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / Hidx;
      const int h = int(r % Hidx);
      const float* q = iq + r * Di;
      float* row = scores + (int64_t(h) * Tq + i) * max_blocks;
      const int64_t local = positions[i] / B;
      std::fill(row, row + max_blocks, ninf);
      // History blocks are entirely in the past: all B keys are visible, no causal mask needed.
      for (int64_t b = 0; b < local; ++b) {
        const float* kp = cache.ik + int64_t(page_table[b]) * cache.page_stride;
        float best = ninf;
        for (int j = 0; j < B; ++j) {
          const float* kr = kp + int64_t(j) * Di;
          float dot = 0.f;
          for (int d = 0; d < Di; ++d) dot += q[d] * kr[d];
          best = std::max(best, dot);
        }
        row[b] = best;
      }
    }
  });
}

void msa_topk(const float* scores, int64_t Tq, int Hidx, const int32_t* positions, int block_size,
              int64_t max_blocks, int top_k, int32_t* selection) {
  std::vector<int32_t> order;
  for (int h = 0; h < Hidx; ++h)
    for (int64_t i = 0; i < Tq; ++i) {
      const float* row = scores + (int64_t(h) * Tq + i) * max_blocks;
      int32_t* sel = selection + (int64_t(h) * Tq + i) * top_k;
      const int32_t local = positions[i] / block_size;
      const int32_t n = local + 1;
      std::fill(sel, sel + top_k, -1);
      if (n <= top_k) {
        for (int32_t b = 0; b < n; ++b) sel[b] = b;
        continue;
      }
      order.resize(local);
      std::iota(order.begin(), order.end(), 0);
      // NaN scores rank last (a NaN in a comparator would break the sort's ordering contract).
      auto key = [&](int32_t b) { return std::isnan(row[b]) ? -std::numeric_limits<float>::infinity() : row[b]; };
      std::partial_sort(order.begin(), order.begin() + (top_k - 1), order.end(), [&](int32_t a, int32_t b) {
        const float ka = key(a), kb = key(b);
        return ka != kb ? ka > kb : a < b;
      });
      std::sort(order.begin(), order.begin() + (top_k - 1));
      for (int s = 0; s < top_k - 1; ++s) sel[s] = order[s];
      sel[top_k - 1] = local;
    }
}

std::vector<uint8_t> msa_prefill_route(const int32_t* selection, const int32_t* pos, const int32_t* row_seq,
                                       const int32_t* pt_indptr, const int32_t* pt_pages, int64_t T, int Hkv,
                                       int top_k, int block_size, int threshold_pct) {
  const int64_t tiles = (T + kMsaRouteTileRows - 1) / kMsaRouteTileRows;
  std::vector<uint8_t> route(size_t(tiles * Hkv), 0);
  std::vector<int32_t> pages;
  for (int64_t tile = 0; tile < tiles; ++tile)
    for (int h = 0; h < Hkv; ++h) {
      pages.clear();
      for (int64_t t = tile * kMsaRouteTileRows; t < std::min<int64_t>(T, (tile + 1) * kMsaRouteTileRows); ++t)
        for (int s = 0; s < top_k; ++s) {
          const int32_t b = selection[(int64_t(h) * T + t) * top_k + s];
          if (b >= 0 && b <= pos[t] / block_size) pages.push_back(pt_pages[pt_indptr[row_seq[t]] + b]);
        }
      const int64_t entries = int64_t(pages.size());
      std::sort(pages.begin(), pages.end());
      const int64_t distinct = std::unique(pages.begin(), pages.end()) - pages.begin();
      route[size_t(tile * Hkv + h)] = uint8_t(distinct > top_k && distinct * 100 > entries * threshold_pct);
    }
  return route;
}

}  // namespace m3::cpu
