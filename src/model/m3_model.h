// The M3 decoder forward on the CPU reference backend:
//   x = embed[ids]; per layer: h = x + Attn(norm(x)); x = h + FFN(norm(h)); logits = lm_head(norm(x)).
// Attn is dense causal GQA or MSA (index branch → block scores → top-k → sparse attention) per the config;
// FFN is the dense SwiGLU-OAI MLP or the sigmoid-routed MoE with a shared expert.
// A step is a ragged batch of sequences, each bringing n new tokens on top of start_pos cached ones.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "io/config.h"
#include "kv/kv_cache.h"
#include "model/expert_parallel.h"
#include "model/m3_weights.h"
#include "model/step_plan.h"

namespace m3 {

// Optional capture of intermediate results (tests, `m3serve score`). Vectors are indexed by layer.
struct ForwardTrace {
  bool capture_hidden = false;     // residual stream after each layer: [T_total, H]
  bool capture_selection = false;  // sparse layers, per sequence: [Hidx, n_seq, top_k] (ids ascending, local last)
  bool capture_block_scores = false;  // sparse layers, per sequence: [Hidx, n_seq, max_blocks]
  bool capture_sparse_queries = false;  // sparse layers, the step's rows: q [T_total, Hq, D], index-q [T_total, Hidx, Di]
  std::vector<std::vector<float>> hidden;
  std::vector<std::vector<float>> q, index_q;  // [layer] (empty for dense layers), post-norm post-RoPE
  std::vector<std::vector<std::vector<int32_t>>> selection;  // [layer][seq]
  std::vector<std::vector<std::vector<float>>> block_scores;  // [layer][seq]
  std::vector<int64_t> block_scores_cols;                      // [seq] max_blocks used for that sequence
};

class M3Model {
 public:
  M3Model(M3Config cfg, M3Weights weights);
  // Loads config.json and the safetensors of a model directory (load_checkpoint).
  static M3Model load(const std::string& model_dir);

  const M3Config& config() const { return cfg_; }
  const RankShare& share() const { return w_.share; }  // what part of the model these weights are
  M3Config kv_config() const { return w_.share.kv_config(cfg_); }  // the config of this share's KV cache

  // Runs one step. Writes K, V, index-K of the new tokens into `cache` through each sequence's page table.
  // Returns logits per sequence: [rows, V] with rows = n (all_logits) or 1.
  // ep: expert parallelism (model/expert_parallel.h) — this rank runs the routed experts it owns and exchanges
  // token rows with the other ranks at every MoE layer; with a vocabulary-split share (vocab_parts = world) the
  // embedding and LM head rows are exchanged too (model/vocab_parallel.h). The logits equal a one-rank forward's
  // bit for bit. With attention split over KV heads (share.attn_tp = world) every rank runs the same rows on a cache
  // of its own KV heads (RankShare::kv_config) and the o projection is all-reduced over `ep`'s group: the logits
  // equal one rank's up to the order of that sum.
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, KVCache& cache,
                                          ForwardTrace* trace = nullptr, const ExpertParallel* ep = nullptr) const;
  // A step of a rank that has no tokens while other ranks of its expert-parallel group run one: takes part in
  // every exchange of a forward (with no rows): the embedding and LM head ones of a vocabulary split, every MoE
  // layer's, and runs its experts and vocabulary rows for the others.
  void idle_step(const ExpertParallel& ep) const;

 private:
  M3Config cfg_;
  M3Weights w_;
  void check_share(const ExpertParallel* ep) const;  // throws when w_.share cannot run with `ep`
};

}  // namespace m3
