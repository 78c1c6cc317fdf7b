// CPU storage of the paged cache. One page is one contiguous unit holding, in this order:
//   for each layer l:        K [Hkv, B, D] then V [Hkv, B, D]      (HND, post-norm post-RoPE K, raw V)
//   for each sparse layer s: index-K [B, Di]                         (post-norm post-RoPE)
// so a page's K, V and index-K live and die together. Layer views address the pool with page_stride = page size.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "io/config.h"
#include "kv/page_pool.h"

namespace m3 {

// Where each layer's K, V and index-K sit inside one page unit (in floats), shared by every backend's cache.
struct PageLayout {
  std::vector<int64_t> k_off, v_off, ik_off;  // per layer; ik_off is −1 for dense layers
  int64_t page_floats = 0;                    // unit size, rounded up to a multiple of align_floats
  static PageLayout of(const M3Config& cfg, int64_t align_floats = 1);
};

class KVCache {
 public:
  KVCache(const M3Config& cfg, int32_t num_pages);

  static int64_t page_floats(const M3Config& cfg);
  int block_size() const { return block_size_; }
  PagePool& pool() { return pool_; }
  const PagePool& pool() const { return pool_; }

  // Pointers into page `page` for layer `layer` (index-K only for sparse layers).
  float* k(int32_t page, int layer);
  float* v(int32_t page, int layer);
  float* index_k(int32_t page, int layer);

  cpu::PagedKV layer_view(int layer) const;
  cpu::PagedIndexK index_view(int layer) const;

 private:
  int block_size_, num_kv_heads_, head_dim_, index_dim_;
  int64_t page_floats_ = 0;
  std::vector<int64_t> k_off_, v_off_, ik_off_;  // PageLayout::of(cfg)
  std::vector<float> data_;                       // [num_pages, page_floats]
  PagePool pool_;
};

}  // namespace m3
