// Expert parallelism for the MoE layers (issue 17; docs/PARALLEL.md). Every rank runs the attention of its own
// requests (data-parallel attention) and the routed experts it owns; a MoE layer exchanges token rows:
//   1. each rank routes its own T_r tokens (the router is replicated);
//   2. all_gather of [xn rows | expert ids | count], padded to max_tokens rows per rank (fixed sizes: a GPU step
//      with the same shape stays capturable);
//   3. each rank runs its experts over the rows of every rank routed to them — one batch per expert;
//   4. reduce_scatter (sum) of the per-slot outputs [rank, max_tokens, top_k, H] back to the rows' owners: each
//      slot has exactly one non-zero contribution, so the owner receives the slot outputs bit for bit as one rank
//      computes them, and combines them in slot order itself (with the shared expert, which every rank holds).
// Expert e belongs to rank e mod size. The slot exchange moves top_k times the bytes of a combined-output exchange;
// it keeps the CPU reference exact, and the GPU path can combine before the reduce-scatter instead.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dist/communicator.h"

namespace m3 {

struct ExpertParallel {
  dist::Communicator* comm = nullptr;
  int64_t max_tokens = 0;  // tokens per rank per step at most: the exchange's fixed row count
  bool owns(int64_t expert) const { return expert % comm->size() == comm->rank(); }
};

// Runs expert e on rows x [n, H] → [n, H].
using RunExpert = std::function<std::vector<float>(int64_t e, const float* x, int64_t n)>;

// The routed slot outputs of this rank's T tokens: slot_out [T, top_k, H] with slot_out[t, k] = expert ids[t, k]
// applied to xn[t]. xn: [T, H]; ids: [T, top_k] (every rank's ids in [0, E)). Collective: every rank calls it for
// every MoE layer of a step in the same order (T = 0 for a rank without tokens). Throws when T > max_tokens.
void moe_slots_expert_parallel(const ExpertParallel& ep, int64_t E, int64_t top_k, int64_t H, const float* xn,
                               int64_t T, const int32_t* ids, const RunExpert& run_expert, float* slot_out);

}  // namespace m3
