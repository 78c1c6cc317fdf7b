// One sequence's cache state for the simple single-request paths (CLI generate/score, tests): its tokens, the
// pages holding their K/V/index-K, and how many tokens are already in the cache.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"

namespace m3 {

class SequenceKV {
 public:
  explicit SequenceKV(KVCache& cache) : cache_(cache) {}
  ~SequenceKV();  // returns every page to the pool
  SequenceKV(const SequenceKV&) = delete;
  SequenceKV& operator=(const SequenceKV&) = delete;

  // Makes sure pages cover `num_tokens` positions; throws m3::Error when the pool is exhausted.
  void reserve(int64_t num_tokens);
  const std::vector<int32_t>& pages() const { return pages_; }

 private:
  KVCache& cache_;
  std::vector<int32_t> pages_;
};

}  // namespace m3
