#include "kv/kv_cache.h"

#include <cmath>

#include "base/error.h"

namespace m3 {

int64_t KVCache::page_floats(const M3Config& cfg) {
  const int64_t kv = int64_t(cfg.num_kv_heads) * cfg.sparse_block_size * cfg.head_dim;
  const int64_t ik = int64_t(cfg.sparse_block_size) * cfg.index_head_dim;
  return cfg.num_layers * 2 * kv + cfg.num_sparse_layers() * ik;
}

KVCache::KVCache(const M3Config& cfg, int32_t num_pages)
    : block_size_(cfg.sparse_block_size),
      num_kv_heads_(cfg.num_kv_heads),
      head_dim_(cfg.head_dim),
      index_dim_(cfg.index_head_dim),
      pool_(num_pages) {
  const int64_t kv = int64_t(num_kv_heads_) * block_size_ * head_dim_;
  int64_t off = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    k_off_.push_back(off);
    off += kv;
    v_off_.push_back(off);
    off += kv;
  }
  for (int l = 0; l < cfg.num_layers; ++l) {
    if (cfg.attn_kinds[l] == AttnKind::Sparse) {
      ik_off_.push_back(off);
      off += int64_t(block_size_) * index_dim_;
    } else {
      ik_off_.push_back(-1);
    }
  }
  page_floats_ = off;
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
