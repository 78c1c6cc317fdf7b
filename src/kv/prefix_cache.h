// Prefix cache over full KV pages. Page i of a token sequence is keyed by a hash chain
//   h_i = XXH3(tokens of page i, seed = h_{i−1} ^ extra_key)
// and a hit is confirmed by comparing the parent hash and the page's tokens (never trust a 64-bit hash alone).
// The cache holds one reference on every page it lists; a cached page nobody else references is evictable
// (least recently used first) when the pool runs dry. Cached pages are immutable: only full, computed pages are
// inserted, and sequences only ever write positions past their shared full pages.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/page_pool.h"

namespace m3 {

class PrefixCache {
 public:
  PrefixCache(PagePool& pool, int block_size, bool enabled);

  bool enabled() const { return enabled_; }
  // The cached pages that hold the longest full-page prefix of `tokens`, each retained for the caller. At most
  // floor((n − 1) / B) pages, so at least the last token is always recomputed (its logits are needed).
  std::vector<int32_t> match(std::span<const int32_t> tokens, uint64_t extra_key = 0);
  // Registers page `page_index` (tokens [i·B, (i+1)·B) of `tokens`, all computed) held in `page`. No-op when the
  // page is already cached under that key (another sequence computed the same prefix first).
  void insert(std::span<const int32_t> tokens, int page_index, int32_t page, uint64_t extra_key = 0);
  // Allocates a page with refcount 1, evicting LRU unreferenced cached pages when the free list is empty.
  std::optional<int32_t> alloc();
  // Drops every cached page nobody else references.
  void evict_all_unreferenced();

  int32_t num_cached() const { return int32_t(by_page_.size()); }
  int32_t num_evictable() const;

 private:
  struct Entry {
    uint64_t parent;
    int32_t page;
    std::vector<int32_t> tokens;
    uint64_t last_use;
  };
  uint64_t page_hash(uint64_t parent, std::span<const int32_t> page_tokens) const;
  bool evict_one();

  PagePool& pool_;
  int block_size_;
  bool enabled_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> by_hash_;
  std::unordered_map<int32_t, uint64_t> by_page_;
};

}  // namespace m3
