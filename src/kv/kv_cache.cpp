#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/fp8.h"
#include "base/dtype.h"
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
  stats_.assign(k_off_.size() * 3, {});
}

float KvStorage::scale(KvTensor t, int layer) const {
  const std::vector<float>& s = t == KvTensor::K ? k_scale : t == KvTensor::V ? v_scale : ik_scale;
  return s.empty() ? 1.0f : s.at(size_t(layer));
}

void KVCache::set_storage(KvStorage storage) {
  for (int l = 0; l < int(k_off_.size()); ++l)
    for (KvTensor t : {KvTensor::K, KvTensor::V, KvTensor::IndexK})
      if (storage.dtype_of(t) == KvDtype::E4M3)
        M3_CHECK(storage.scale(t, l) > 0.f && std::isfinite(storage.scale(t, l)),
                 "KV storage: scale of tensor {} layer {} must be finite and > 0", int(t), l);
  storage_ = std::move(storage);
  stats_.assign(k_off_.size() * 3, {});
}

void KVCache::write(KvTensor t, int layer, float* dst, const float* src, int64_t n) {
  KvWriteStats& st = stats_[size_t(layer) * 3 + size_t(t)];
  for (int64_t i = 0; i < n; ++i) st.amax = std::max(st.amax, std::fabs(src[i]));
  st.written += n;
  switch (storage_.dtype_of(t)) {
    case KvDtype::F32:
      std::copy(src, src + n, dst);
      break;
    case KvDtype::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = round_to_bf16(src[i]);
      break;
    case KvDtype::E4M3: {
      const float s = storage_.scale(t, layer);
      codes_.resize(size_t(n));
      cpu::kv_quantize_e4m3(src, n, s, codes_.data());
      cpu::kv_dequantize_e4m3(codes_.data(), n, s, dst);
      for (int64_t i = 0; i < n; ++i) st.saturated += std::fabs(src[i] / s) > 448.0f;
      break;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    st.sum_sq += double(src[i]) * src[i];
    st.err_sq += (double(dst[i]) - src[i]) * (double(dst[i]) - src[i]);
  }
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
