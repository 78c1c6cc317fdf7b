// Physical KV pages: a fixed pool with reference counts. A page is the cache unit of m3serve: for every layer it
// holds the K and V of `block_size` tokens and, for every sparse layer, their index keys. Those are allocated,
// shared, and freed together (docs/KV_CACHE.md).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace m3 {

class PagePool {
 public:
  explicit PagePool(int32_t num_pages);

  // Takes a free page with refcount 1, or nullopt when none is free.
  std::optional<int32_t> alloc();
  void retain(int32_t page);   // one more owner (prefix sharing)
  void release(int32_t page);  // drops one owner; the page is free again at zero

  int32_t capacity() const { return int32_t(refcount_.size()); }
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_used() const { return capacity() - num_free(); }
  int32_t refcount(int32_t page) const { return refcount_.at(page); }

 private:
  std::vector<int32_t> free_;  // stack of free page ids
  std::vector<int32_t> refcount_;
};

}  // namespace m3
