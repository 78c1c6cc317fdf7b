#include "engine/sequence.h"

#include "base/error.h"

namespace m3 {

SequenceKV::~SequenceKV() {
  for (int32_t p : pages_) cache_.pool().release(p);
}

void SequenceKV::reserve(int64_t num_tokens) {
  const int64_t B = cache_.block_size();
  while (int64_t(pages_.size()) * B < num_tokens) {
    auto p = cache_.pool().alloc();
    M3_CHECK(p.has_value(), "KV cache is full: {} pages cannot hold {} tokens", cache_.pool().capacity(), num_tokens);
    pages_.push_back(*p);
  }
}

}  // namespace m3
