// What one rank of a parallel group holds (issue 17 item 3; docs/PARALLEL.md): the description a sharded load, a
// sharded dummy fill and the forward agree on. The weight plan of a share (model/weight_plan.h rank_weight_plan)
// lists, per slot, the rows and columns the rank reads; everything outside them is never touched.
//   - routed experts (expert_parallel): expert e on rank e mod world; off: every rank holds every expert;
//   - TP over KV heads (attn_tp > 1): groups of attn_tp consecutive ranks share one attention; the rank with TP index
//     j = rank mod attn_tp holds KV heads [j·Hkv/attn_tp, (j+1)·Hkv/attn_tp): those heads' rows of q, k, v (and
//     their q heads: Hq/Hkv per KV head), the matching columns of o, and its index-q heads
//     [j·Hidx/attn_tp, (j+1)·Hidx/attn_tp); index_k (one head, read by every query head's indexer) stays whole;
//   - vocabulary-parallel (vocab_parts > 1): embedding and LM head rows in vocab_parts contiguous ranges, rank r
//     holding range r mod vocab_parts (vocab_parts = attn_tp: within a TP group; = world: over all ranks);
//   - everything else (norms, dense MLP, router and its bias, shared expert) is replicated.
#pragma once

#include <cstdint>
#include <utility>

#include "io/config.h"

namespace m3 {

struct RankShare {
  int rank = 0;
  int world = 1;
  bool expert_parallel = true;
  int attn_tp = 1;
  int vocab_parts = 1;

  // The share of rank `rank` of `world` with expert parallelism only (the DP-attention + EP layout).
  static RankShare ep(int rank, int world) { return RankShare{rank, world, true, 1, 1}; }

  bool owns_expert(int64_t e) const { return !expert_parallel || e % world == rank; }
  int tp_index() const { return rank % attn_tp; }
  int vocab_index() const { return rank % vocab_parts; }
  // [v0, v1): the vocabulary rows (embedding and LM head) this share holds, of V.
  std::pair<int64_t, int64_t> vocab_rows(int64_t V) const {
    return {V * vocab_index() / vocab_parts, V * (vocab_index() + 1) / vocab_parts};
  }
  // Whether this share is the whole model (one rank, or nothing split).
  bool whole() const { return (world == 1 || !expert_parallel) && attn_tp == 1 && vocab_parts == 1; }
  // Whether only routed experts are split (what the CPU forward with model/expert_parallel.h can run).
  bool experts_only() const { return attn_tp == 1 && vocab_parts == 1; }

  // The config of this rank's KV cache: its KV heads only (num_kv_heads / attn_tp); index-K stays one whole head.
  M3Config kv_config(const M3Config& c) const {
    M3Config k = c;
    k.num_kv_heads = c.num_kv_heads / attn_tp;
    return k;
  }

  // Throws m3::Error when the share does not fit the config: rank outside [0, world), attn_tp or vocab_parts not
  // dividing world, KV heads or index heads not dividing by attn_tp, more vocabulary parts than rows.
  void validate(const M3Config& c) const;
};

}  // namespace m3
