#include "kv/page_pool.h"

#include "base/error.h"

namespace m3 {

PagePool::PagePool(int32_t num_pages) : refcount_(num_pages, 0) {
  M3_CHECK(num_pages > 0, "KV page pool needs at least one page, got {}", num_pages);
  free_.reserve(num_pages);
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

std::optional<int32_t> PagePool::alloc() {
  if (free_.empty()) return std::nullopt;
  int32_t p = free_.back();
  free_.pop_back();
  refcount_[p] = 1;
  return p;
}

void PagePool::retain(int32_t page) {
  M3_CHECK(page >= 0 && page < capacity() && refcount_[page] > 0, "retain of page {} that is not in use", page);
  ++refcount_[page];
}

void PagePool::release(int32_t page) {
  M3_CHECK(page >= 0 && page < capacity() && refcount_[page] > 0, "release of page {} that is not in use", page);
  if (--refcount_[page] == 0) free_.push_back(page);
}

}  // namespace m3
