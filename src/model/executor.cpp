#include "model/executor.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace m3 {

std::vector<SampledToken> ModelExecutor::forward_sample(std::span<const SeqInput> seqs,
                                                        std::span<const RowSampling> rows,
                                                        const std::function<void()>& before_sampling) {
  M3_CHECK(rows.size() == seqs.size(), "forward_sample: {} sampling rows for {} sequences", rows.size(), seqs.size());
  std::vector<std::vector<float>> logits = forward(seqs);
  if (before_sampling) before_sampling();
  std::vector<SampledToken> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!rows[i].params) continue;
    const int64_t V = config().vocab_size;
    out[i] = sample_row(std::span<float>(logits[i]).last(size_t(V)), rows[i]);
  }
  return out;
}

void ModelExecutor::idle_step() {
  throw Error("idle_step: this executor is not part of an expert-parallel group");
}

void CpuExecutor::idle_step() {
  M3_CHECK(ep_.comm, "idle_step: this executor is not part of an expert-parallel group");
  model_.idle_step(ep_);
}

int32_t default_cpu_pages(const M3Config& c) {
  // Without an explicit size: room for 8 full-length sequences of at most 4096 tokens.
  const int64_t len = std::min<int64_t>(c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096, 4096);
  return int32_t(8 * ((len + c.sparse_block_size - 1) / c.sparse_block_size));
}

std::string CpuExecutor::describe() const {
  const M3Config& c = model_.config();
  const double mib = double(page_bytes()) * cache_.pool().capacity() / (1 << 20);
  std::string s = fmt::format("cpu fp32, KV cache {} pages × {} tokens = {} tokens ({:.1f} MiB)",
                              cache_.pool().capacity(), c.sparse_block_size,
                              int64_t(cache_.pool().capacity()) * c.sparse_block_size, mib);
  if (ep_.comm) s += fmt::format(", expert-parallel rank {} of {}", ep_.comm->rank(), ep_.comm->size());
  if (model_.share().attn_tp > 1)
    s += fmt::format(", KV heads {} of {} (rank {} of a {}-way split)", model_.kv_config().num_kv_heads,
                     c.num_kv_heads, model_.share().rank, model_.share().attn_tp);
  return s;
}

}  // namespace m3
