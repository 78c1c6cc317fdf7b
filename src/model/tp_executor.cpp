#include "model/tp_executor.h"

#include <fmt/format.h>

#include <exception>

#include "base/error.h"
#include "model/m3_model.h"

namespace m3 {

TpCpuExecutor::TpCpuExecutor(std::vector<std::unique_ptr<const M3Model>> models, int32_t num_pages)
    : models_(std::move(models)) {
  const int P = int(models_.size());
  M3_CHECK(P >= 2, "tensor parallelism over KV heads needs at least 2 ranks, got {}", P);
  for (int r = 0; r < P; ++r) {
    const RankShare& s = models_[size_t(r)]->share();
    M3_CHECK(s.rank == r && s.world == P && s.attn_tp == P && s.expert_parallel == models_[0]->share().expert_parallel &&
                 s.vocab_parts == models_[0]->share().vocab_parts,
             "rank {} of the KV-head split holds the share of rank {} of {} (KV heads split {} ways, experts {}, "
             "vocabulary in {} parts; experts and vocabulary must be split on every rank or none)",
             r, s.rank, s.world, s.attn_tp, s.expert_parallel ? "split" : "whole", s.vocab_parts);
    M3_CHECK(models_[size_t(r)]->config().num_kv_heads == models_[0]->config().num_kv_heads &&
                 models_[size_t(r)]->config().num_layers == models_[0]->config().num_layers,
             "the ranks of a KV-head split hold different models");
  }
  group_ = std::make_unique<dist::InProcessGroup>(P);
  for (int r = 0; r < P; ++r) {
    ranks_.push_back(std::make_unique<CpuExecutor>(*models_[size_t(r)], num_pages));
    // The group's communicator carries the o all-reduce (with the experts split, the slot outputs'; with the
    // vocabulary split, the embedding rows' and the logits' exchanges); the rows are the same on every rank, so no
    // row exchange runs and max_tokens bounds nothing.
    ranks_.back()->set_expert_parallel(ExpertParallel{&group_->rank(r), 0});
  }
  workers_ = std::make_unique<RankWorkers>(P);
}

TpCpuExecutor::~TpCpuExecutor() {
  for (auto& r : ranks_) r->set_expert_parallel(ExpertParallel{});
}

std::vector<std::vector<float>> TpCpuExecutor::forward(std::span<const SeqInput> seqs, ForwardTrace* trace) {
  const size_t P = ranks_.size();
  std::vector<std::vector<std::vector<float>>> out(P);
  std::vector<std::exception_ptr> err(P);
  workers_->run([&](int rank) {  // catches: every rank returns
    const size_t r = size_t(rank);
    try {
      out[r] = ranks_[r]->forward(seqs, r == 0 ? trace : nullptr);
    } catch (...) {
      err[r] = std::current_exception();
      group_->abort(fmt::format("rank {} of the KV-head split failed", r));  // wake the ranks in a collective
    }
  });
  group_->reset();  // every rank is out of its collectives
  dist::InProcessGroup::rethrow_rank_errors(err);  // the failing rank's own error first
  return std::move(out[0]);
}

int64_t TpCpuExecutor::page_bytes() const {
  int64_t b = 0;
  for (const auto& r : ranks_) b += r->page_bytes();
  return b;
}

std::string TpCpuExecutor::describe() const {
  const M3Config& c = config();
  return fmt::format("cpu fp32, attention split over {} KV-head ranks ({} of {} KV heads each), KV cache {} pages × "
                     "{} tokens per rank ({:.1f} MiB in all)",
                     ranks_.size(), c.num_kv_heads / int64_t(ranks_.size()), c.num_kv_heads,
                     ranks_[0]->pool().capacity(), c.sparse_block_size,
                     double(page_bytes()) * ranks_[0]->pool().capacity() / (1 << 20));
}

}  // namespace m3
