#include "kv/kv_cache.h"

#include <cmath>

#include "base/error.h"

namespace m3 {

PageLayout PageLayout::of(const M3Config& cfg, int64_t align_floats) {
  PageLayout p;
  const int64_t B = cfg.sparse_block_size;
  const int64_t kv = int64_t(cfg.num_kv_heads) * B * cfg.head_dim;
  int64_t off = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    p.k_off.push_back(off);
    off += kv;
    p.v_off.push_back(off);
    off += kv;
  }
  for (int l = 0; l < cfg.num_layers; ++l) {
    if (cfg.attn_kinds[l] == AttnKind::Sparse) {
      p.ik_off.push_back(off);
      off += B * cfg.index_head_dim;
    } else {
      p.ik_off.push_back(-1);
    }
  }
  p.page_floats = (off + align_floats - 1) / align_floats * align_floats;
  return p;
}

int64_t KVCache::page_floats(const M3Config& cfg) { return PageLayout::of(cfg).page_floats; }

KVCache::KVCache(const M3Config& cfg, int32_t num_pages)
    : block_size_(cfg.sparse_block_size),
      num_kv_heads_(cfg.num_kv_heads),
      head_dim_(cfg.head_dim),
      index_dim_(cfg.index_head_dim),
      pool_(num_pages) {
  PageLayout layout = PageLayout::of(cfg);
  k_off_ = std::move(layout.k_off);
  v_off_ = std::move(layout.v_off);
  ik_off_ = std::move(layout.ik_off);
  page_floats_ = layout.page_floats;
  // Poison with NaN: a read of a slot nothing wrote shows up in the output instead of passing as zero.
  data_.assign(size_t(num_pages) * size_t(page_floats_), std::nanf(""));
}

float* KVCache::k(int32_t page, int layer) { return data_.data() + int64_t(page) * page_floats_ + k_off_[layer]; }
float* KVCache::v(int32_t page, int layer) { return data_.data() + int64_t(page) * page_floats_ + v_off_[layer]; }
float* KVCache::index_k(int32_t page, int layer) {
  M3_CHECK(ik_off_[layer] >= 0, "layer {} is dense and has no index keys", layer);
  return data_.data() + int64_t(page) * page_floats_ + ik_off_[layer];
}

cpu::PagedKV KVCache::layer_view(int layer) const {
  return cpu::PagedKV{data_.data() + k_off_[layer], data_.data() + v_off_[layer], page_floats_, num_kv_heads_,
                      block_size_, head_dim_};
}

cpu::PagedIndexK KVCache::index_view(int layer) const {
  return cpu::PagedIndexK{data_.data() + ik_off_[layer], page_floats_, block_size_, index_dim_};
}

}  // namespace m3
