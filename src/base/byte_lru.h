// A thread-safe LRU map from 64-bit content keys to shared, immutable values, bounded by the values' bytes: the
// media gateway's processed items and the vision feature cache (src/media/). A value larger than the whole budget
// is never kept; a key already present keeps its first value.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace m3 {

template <typename V>
class ByteLru {
 public:
  using Ptr = std::shared_ptr<const V>;
  ByteLru(int64_t max_bytes, std::function<int64_t(const V&)> bytes_of)
      : max_bytes_(max_bytes), bytes_of_(std::move(bytes_of)) {}

  // The value, now the newest entry; null on a miss. Counts hits and misses.
  Ptr get(uint64_t key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }

  // Inserts as the newest entry and evicts the oldest ones past the budget.
  void put(uint64_t key, Ptr v) {
    const int64_t b = bytes_of_(*v);
    std::lock_guard<std::mutex> lk(mu_);
    if (index_.count(key) || b > max_bytes_) return;
    lru_.emplace_front(key, std::move(v));
    index_[key] = lru_.begin();
    bytes_ += b;
    while (bytes_ > max_bytes_ && !lru_.empty()) {
      bytes_ -= bytes_of_(*lru_.back().second);
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }

  struct Stats {
    int64_t hits = 0, misses = 0, items = 0, bytes = 0;
  };
  Stats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return {hits_, misses_, int64_t(lru_.size()), bytes_};
  }

 private:
  const int64_t max_bytes_;
  const std::function<int64_t(const V&)> bytes_of_;
  mutable std::mutex mu_;
  std::list<std::pair<uint64_t, Ptr>> lru_;  // front = newest
  std::unordered_map<uint64_t, typename std::list<std::pair<uint64_t, Ptr>>::iterator> index_;
  int64_t bytes_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace m3
