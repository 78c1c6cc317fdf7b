// Attention split over KV heads on the CPU (issue 17; docs/PARALLEL.md): P ranks, each an M3Model holding its share
// (model/rank_share.h: attn_tp = P — its query, KV and index heads' rows, the matching o columns) and a CpuExecutor
// whose cache holds only its KV heads. Every step runs on all ranks with the same rows (rank 0 on the caller's
// thread, the others on persistent rank threads, base/rank_workers.h); each layer's o projection is all-reduced over an in-process group, and
// rank 0's logits are the step's. The engine sees one executor: one scheduler, one page pool (rank 0's; the other
// ranks' caches use the same page ids).
#pragma once

#include <memory>
#include <vector>

#include "base/rank_workers.h"
#include "dist/inprocess_communicator.h"
#include "model/executor.h"

namespace m3 {

class TpCpuExecutor final : public ModelExecutor {
 public:
  // models[r]: rank r's share (share().attn_tp == models.size(), share().rank == r, the same config; the routed
  // experts whole on every rank, or expert e on rank e mod N: each rank runs its experts on the step's rows and the
  // slot outputs are all-reduced; the vocabulary whole, or split in N ranges: model/vocab_parallel.h
  // *_same_rows); num_pages per rank. Throws m3::Error when the shares do not form one KV-head split.
  TpCpuExecutor(std::vector<std::unique_ptr<const M3Model>> models, int32_t num_pages);
  ~TpCpuExecutor() override;

  const M3Config& config() const override { return ranks_[0]->config(); }
  PagePool& pool() override { return ranks_[0]->pool(); }
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace) override;
  std::string describe() const override;
  // Bytes of one page over all ranks (each holds its KV heads of it, and a whole index-K page).
  int64_t page_bytes() const override;
  int size() const { return int(ranks_.size()); }

 private:
  std::vector<std::unique_ptr<const M3Model>> models_;
  std::unique_ptr<dist::InProcessGroup> group_;
  std::vector<std::unique_ptr<CpuExecutor>> ranks_;
  std::unique_ptr<RankWorkers> workers_;
};

}  // namespace m3
