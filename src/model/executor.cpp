#include "model/executor.h"

#include <fmt/format.h>

#include "base/error.h"

namespace m3 {

std::vector<SampledToken> ModelExecutor::forward_sample(std::span<const SeqInput> seqs,
                                                        std::span<const RowSampling> rows) {
  M3_CHECK(rows.size() == seqs.size(), "forward_sample: {} sampling rows for {} sequences", rows.size(), seqs.size());
  std::vector<std::vector<float>> logits = forward(seqs);
  std::vector<SampledToken> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!rows[i].params) continue;
    const int64_t V = config().vocab_size;
    out[i] = sample_row(std::span<float>(logits[i]).last(size_t(V)), rows[i]);
  }
  return out;
}

std::string CpuExecutor::describe() const {
  const M3Config& c = model_.config();
  const double mib = double(KVCache::page_floats(c)) * 4.0 * cache_.pool().capacity() / (1 << 20);
  return fmt::format("cpu fp32, KV cache {} pages × {} tokens = {} tokens ({:.1f} MiB)", cache_.pool().capacity(),
                     c.sparse_block_size, int64_t(cache_.pool().capacity()) * c.sparse_block_size, mib);
}

}  // namespace m3
