// Prefix cache over full KV pages. Page i of a token sequence is keyed by a hash chain
//   h_i = XXH3(tokens of page i, seed = h_{i−1} ^ extra_key ^ m_i)
// where m_i folds in the content hash and placement of every image / video whose placeholder span overlaps page i
// (0 when none: text-only keys are unchanged). Placeholder tokens are the same ids for every image, so without m_i
// a different image with the same size would hit the first one's K/V (issue 12 item 6). A hit is confirmed by
// comparing the parent hash, the page's tokens and m_i (never trust a 64-bit hash alone).
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

// One image / video in a prompt: its placeholder rows are tokens [start, start + length), and `hash` is the media
// gateway's content hash of the item (media::PreparedItem::content_hash).
struct MediaSpan {
  int64_t start = 0;
  int64_t length = 0;
  uint64_t hash = 0;
};

// m_i of page [page_start, page_start + block_size): 0 when no span overlaps it. Spans in any order.
uint64_t media_page_key(std::span<const MediaSpan> media, int64_t page_start, int block_size);

class PrefixCache {
 public:
  PrefixCache(PagePool& pool, int block_size, bool enabled);

  bool enabled() const { return enabled_; }
  // The cached pages that hold the longest full-page prefix of `tokens`, each retained for the caller. At most
  // floor((n − 1) / B) pages, so at least the last token is always recomputed (its logits are needed).
  std::vector<int32_t> match(std::span<const int32_t> tokens, uint64_t extra_key = 0,
                             std::span<const MediaSpan> media = {});
  // How many pages match() would return, without retaining them or touching the LRU order: the data-parallel
  // engine asks every rank's cache to place a request where its prefix already is (engine/engine.h).
  int64_t peek(std::span<const int32_t> tokens, uint64_t extra_key = 0, std::span<const MediaSpan> media = {}) const;
  // Registers page `page_index` (tokens [i·B, (i+1)·B) of `tokens`, all computed) held in `page`. No-op when the
  // page is already cached under that key (another sequence computed the same prefix first).
  void insert(std::span<const int32_t> tokens, int page_index, int32_t page, uint64_t extra_key = 0,
              std::span<const MediaSpan> media = {});
  // Allocates a page with refcount 1, evicting LRU unreferenced cached pages when the free list is empty.
  std::optional<int32_t> alloc();
  // Drops every cached page nobody else references.
  void evict_all_unreferenced();

  int32_t num_cached() const { return int32_t(by_page_.size()); }
  int32_t num_evictable() const;

 private:
  struct Entry {
    uint64_t parent;
    uint64_t media;  // m_i
    int32_t page;
    std::vector<int32_t> tokens;
    uint64_t last_use;
  };
  uint64_t page_hash(uint64_t parent, uint64_t media, std::span<const int32_t> page_tokens) const;
  // Walks the hash chain of `tokens`; calls hit(entry) for each matching page, in order, until the first miss.
  template <class Hit>
  void walk(std::span<const int32_t> tokens, uint64_t extra_key, std::span<const MediaSpan> media, Hit&& hit) const;
  bool evict_one();

  PagePool& pool_;
  int block_size_;
  bool enabled_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> by_hash_;
  std::unordered_map<int32_t, uint64_t> by_page_;
};

}  // namespace m3
