// One sequence's pages for the simple single-request paths (CLI generate/score, tests): the pages holding its
// K/V/index-K, taken from a pool as the sequence grows and all returned when it is destroyed.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/page_pool.h"

namespace m3 {

class SequenceKV {
 public:
  SequenceKV(PagePool& pool, int block_size) : pool_(pool), block_size_(block_size) {}
  explicit SequenceKV(KVCache& cache) : SequenceKV(cache.pool(), cache.block_size()) {}
  ~SequenceKV();  // returns every page to the pool
  SequenceKV(const SequenceKV&) = delete;
  SequenceKV& operator=(const SequenceKV&) = delete;

  // Makes sure pages cover `num_tokens` positions; throws m3::Error when the pool is exhausted.
  void reserve(int64_t num_tokens);
  const std::vector<int32_t>& pages() const { return pages_; }

 private:
  PagePool& pool_;
  int block_size_;
  std::vector<int32_t> pages_;
};

}  // namespace m3
