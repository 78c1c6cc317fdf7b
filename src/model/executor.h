// A model executor runs forwards for the engine over a paged cache it owns. The CPU executor wraps M3Model and a
// host KVCache; the CUDA executor (issue 5) holds device weights and device pages. The engine only sees page ids:
// it allocates them from pool() and passes page tables in SeqInput. Serving steps go through forward_sample()
// (tokens out); forward() returns logits for `score`, tests and traces.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "kv/page_pool.h"
#include "model/expert_parallel.h"
#include "model/m3_model.h"

namespace m3 {

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual const M3Config& config() const = 0;
  virtual PagePool& pool() = 0;
  // Same contract as M3Model::forward: writes the new tokens' K/V/index-K, returns logits per sequence.
  virtual std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace = nullptr) = 0;
  // Runs the step and samples: rows[i] belongs to seqs[i] (its last logits row); rows without params get id −1.
  // This version samples the forward()'s logits on the host (engine/sampler.h); a device sampler overrides it.
  // before_sampling (optional) runs after the forward is issued and before the rows are read: the engine fills
  // the grammar masks (RowSampling::allowed) there, so on a device they are computed while the forward runs.
  virtual std::vector<SampledToken> forward_sample(std::span<const SeqInput> seqs, std::span<const RowSampling> rows,
                                                   const std::function<void()>& before_sampling = {});
  // Expert parallelism (model/expert_parallel.h): this executor is one rank of a data-parallel group whose MoE
  // layers exchange rows. Then every step is collective: a rank without rows calls idle_step() instead of forward.
  virtual bool expert_parallel() const { return false; }
  virtual void idle_step();  // throws when the executor is not in an expert-parallel group
  virtual std::string describe() const = 0;  // for the startup line, e.g. "cpu fp32, 512 pages × 16 tokens"
  // Bytes of one KV page unit in this executor's cache (what a KV memory budget is divided by).
  virtual int64_t page_bytes() const = 0;
};

// KV pages the CPU executor gets when no size is given: 8 sequences of min(max_position_embeddings, 4096) tokens.
int32_t default_cpu_pages(const M3Config& c);

class CpuExecutor final : public ModelExecutor {
 public:
  // The cache holds the KV heads of the model's share (all of them unless its attention is split over KV heads).
  CpuExecutor(const M3Model& model, int32_t num_pages)
      : model_(model), cache_(model.kv_config(), num_pages) {}
  // Owns the model (make_executor).
  CpuExecutor(std::unique_ptr<const M3Model> model, int32_t num_pages)
      : owned_(std::move(model)), model_(*owned_), cache_(model_.kv_config(), num_pages) {}
  // c: the config of the cache (RankShare::kv_config for a KV-head split).
  static int64_t page_bytes_for(const M3Config& c) { return KVCache::page_floats(c) * int64_t(sizeof(float)); }
  const M3Config& config() const override { return model_.config(); }
  const M3Model& model() const { return model_; }
  PagePool& pool() override { return cache_.pool(); }
  // Makes this executor rank ep.comm->rank() of an expert-parallel group (ep.comm outlives the executor); every
  // step's tokens must then stay within ep.max_tokens.
  void set_expert_parallel(const ExpertParallel& ep) { ep_ = ep; }
  bool expert_parallel() const override { return ep_.comm != nullptr; }
  void idle_step() override;
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace) override {
    return model_.forward(seqs, cache_, trace, ep_.comm ? &ep_ : nullptr);
  }
  std::string describe() const override;
  int64_t page_bytes() const override { return page_bytes_for(model_.kv_config()); }

 private:
  std::unique_ptr<const M3Model> owned_;
  const M3Model& model_;
  KVCache cache_;
  ExpertParallel ep_;  // comm == nullptr: one rank
};

}  // namespace m3
