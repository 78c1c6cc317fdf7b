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

// What a cache write stores (issue 15 items 4–5; docs/FP8.md §8.1). The CPU cache always holds fp32 slots; BF16 and
// E4M3 round each written value to what the device cache of that element type holds (bf16 RNE; e4m3 codes with a
// per-tensor fp32 scale, cpu::kv_quantize_e4m3 then kv_dequantize_e4m3 — the twins of the GPU cache writer and of the
// e4m3 decode kernels' loads), so every read sees exactly the values the GPU kernels read. Default F32: unchanged.
enum class KvDtype { F32, BF16, E4M3 };
enum class KvTensor { K = 0, V = 1, IndexK = 2 };

struct KvStorage {
  KvDtype dtype = KvDtype::F32;        // K and V
  KvDtype index_dtype = KvDtype::F32;  // index-K (MSA's own cache stores it e4m3 whatever K/V are)
  // E4M3 only, one scale per layer and tensor (value = e4m3(q) · scale, vLLM's k_scale / v_scale); empty = 1 for
  // every layer. Index-K: MSA stores it unscaled (scale 1); a calibrated scale may be given too.
  std::vector<float> k_scale, v_scale, ik_scale;
  float scale(KvTensor t, int layer) const;
  KvDtype dtype_of(KvTensor t) const { return t == KvTensor::IndexK ? index_dtype : dtype; }
  static KvStorage all(KvDtype d) { return KvStorage{d, d, {}, {}, {}}; }
};

// What the writes of one (tensor, layer) saw: max|x| before rounding, values written, values that saturated (E4M3:
// |x / scale| > 448), the rounding error — a calibration run reads amax, a check reads saturated.
struct KvWriteStats {
  float amax = 0.f;
  int64_t written = 0, saturated = 0;
  double sum_sq = 0, err_sq = 0;  // Σx², Σ(stored − x)²: the storage's RMS relative error is sqrt(err_sq / sum_sq)
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

  // Storage of later writes (see KvStorage); resets the write statistics.
  void set_storage(KvStorage storage);
  const KvStorage& storage() const { return storage_; }
  // Stores n values of tensor t of `layer` at dst (a pointer from k / v / index_k) with the storage's rounding.
  void write(KvTensor t, int layer, float* dst, const float* src, int64_t n);
  const KvWriteStats& write_stats(KvTensor t, int layer) const { return stats_[size_t(layer) * 3 + size_t(t)]; }

  cpu::PagedKV layer_view(int layer) const;
  cpu::PagedIndexK index_view(int layer) const;

 private:
  int block_size_, num_kv_heads_, head_dim_, index_dim_;
  int64_t page_floats_ = 0;
  std::vector<int64_t> k_off_, v_off_, ik_off_;  // PageLayout::of(cfg)
  std::vector<float> data_;                       // [num_pages, page_floats]
  KvStorage storage_;
  std::vector<KvWriteStats> stats_;  // [layer][K, V, index-K]
  std::vector<uint8_t> codes_;       // e4m3 scratch of one write
  PagePool pool_;
};

}  // namespace m3
