#include "kv/sequence_kv.h"

#include "base/error.h"

namespace m3 {

SequenceKV::~SequenceKV() {
  for (int32_t p : pages_) pool_.release(p);
}

void SequenceKV::reserve(int64_t num_tokens) {
  while (int64_t(pages_.size()) * block_size_ < num_tokens) {
    auto p = pool_.alloc();
    M3_CHECK(p.has_value(), "KV cache is full: {} pages cannot hold {} tokens", pool_.capacity(), num_tokens);
    pages_.push_back(*p);
  }
}

}  // namespace m3
