#include "kv/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>

namespace m3 {

PrefixCache::PrefixCache(PagePool& pool, int block_size, bool enabled)
    : pool_(pool), block_size_(block_size), enabled_(enabled) {}

uint64_t media_page_key(std::span<const MediaSpan> media, int64_t page_start, int block_size) {
  const int64_t page_end = page_start + block_size;
  uint64_t key = 0;
  for (const MediaSpan& m : media) {
    if (m.length <= 0 || m.start >= page_end || m.start + m.length <= page_start) continue;
    // The item's hash and where its span sits relative to this page (an image shifted by one token is another
    // K/V layout). Summed so the result does not depend on the order spans are listed in.
    const int64_t rec[3] = {int64_t(m.hash), m.start - page_start, m.length};
    key += XXH3_64bits(rec, sizeof(rec)) | 1;
  }
  return key;
}

uint64_t PrefixCache::page_hash(uint64_t parent, uint64_t media, std::span<const int32_t> page_tokens) const {
  return XXH3_64bits_withSeed(page_tokens.data(), page_tokens.size_bytes(), parent ^ media);
}

template <class Hit>
void PrefixCache::walk(std::span<const int32_t> tokens, uint64_t extra_key, std::span<const MediaSpan> media,
                       Hit&& hit) const {
  if (!enabled_ || tokens.empty()) return;
  const size_t B = size_t(block_size_);
  const size_t max_pages = (tokens.size() - 1) / B;
  uint64_t parent = extra_key;
  for (size_t i = 0; i < max_pages; ++i) {
    auto page_tokens = tokens.subspan(i * B, B);
    const uint64_t m = media_page_key(media, int64_t(i * B), block_size_);
    const uint64_t h = page_hash(parent, m, page_tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end() || it->second.parent != parent || it->second.media != m ||
        !std::equal(page_tokens.begin(), page_tokens.end(), it->second.tokens.begin()))
      break;
    hit(h);
    parent = h;
  }
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens, uint64_t extra_key,
                                        std::span<const MediaSpan> media) {
  std::vector<int32_t> pages;
  ++tick_;
  walk(tokens, extra_key, media, [&](uint64_t h) {
    Entry& e = by_hash_.at(h);
    e.last_use = tick_;
    pool_.retain(e.page);
    pages.push_back(e.page);
  });
  return pages;
}

int64_t PrefixCache::peek(std::span<const int32_t> tokens, uint64_t extra_key,
                          std::span<const MediaSpan> media) const {
  int64_t n = 0;
  walk(tokens, extra_key, media, [&](uint64_t) { ++n; });
  return n;
}

void PrefixCache::insert(std::span<const int32_t> tokens, int page_index, int32_t page, uint64_t extra_key,
                         std::span<const MediaSpan> media) {
  if (!enabled_) return;
  const size_t B = size_t(block_size_);
  uint64_t parent = extra_key;
  for (int i = 0; i < page_index; ++i)
    parent = page_hash(parent, media_page_key(media, int64_t(i) * block_size_, block_size_),
                       tokens.subspan(size_t(i) * B, B));
  auto page_tokens = tokens.subspan(size_t(page_index) * B, B);
  const uint64_t m = media_page_key(media, int64_t(page_index) * block_size_, block_size_);
  const uint64_t h = page_hash(parent, m, page_tokens);
  if (by_hash_.count(h) || by_page_.count(page)) return;
  pool_.retain(page);
  by_hash_.emplace(h, Entry{parent, m, page, std::vector<int32_t>(page_tokens.begin(), page_tokens.end()), ++tick_});
  by_page_.emplace(page, h);
}

bool PrefixCache::evict_one() {
  uint64_t best_tick = std::numeric_limits<uint64_t>::max();
  uint64_t best_hash = 0;
  for (const auto& [h, e] : by_hash_)
    if (pool_.refcount(e.page) == 1 && e.last_use < best_tick) {
      best_tick = e.last_use;
      best_hash = h;
    }
  if (best_tick == std::numeric_limits<uint64_t>::max()) return false;
  auto it = by_hash_.find(best_hash);
  const int32_t page = it->second.page;
  by_page_.erase(page);
  by_hash_.erase(it);
  pool_.release(page);
  return true;
}

std::optional<int32_t> PrefixCache::alloc() {
  if (auto p = pool_.alloc()) return p;
  if (!evict_one()) return std::nullopt;
  return pool_.alloc();
}

void PrefixCache::evict_all_unreferenced() {
  while (evict_one()) {
  }
}

int32_t PrefixCache::num_evictable() const {
  int32_t n = 0;
  for (const auto& [h, e] : by_hash_) n += pool_.refcount(e.page) == 1;
  return n;
}

}  // namespace m3
