// Vocabulary-parallel embedding and LM head (issue 17 item 2; docs/PARALLEL.md): in the data-parallel attention +
// expert-parallel layout, rank r of P holds only the vocabulary rows [V·r/P, V·(r+1)/P) of the embedding and of the
// LM head (model/rank_share.h vocab_parts = P), so the 2 × V × H tables are not replicated on every rank. Each rank
// still owns its own tokens; two exchanges on the expert-parallel group (model/expert_parallel.h) serve them:
//   - embedding: all_gather of every rank's ids (padded to max_tokens), each rank writes the rows of the ids in its
//     range (zeros elsewhere) for every rank's tokens, reduce_scatter (sum) back to the owners;
//   - LM head: all_gather of every rank's normed hidden rows, each rank computes the logits of its vocabulary columns
//     for all of them, reduce_scatter (sum) of [rank, max_tokens, V] with each rank's columns filled back to the
//     owners, which then sample from full logits exactly as one rank does.
// Every element has exactly one non-zero contribution, so the owner receives the one-rank values bit for bit (the
// CPU GEMM's result per element does not depend on which columns share the call). The LM head moves P × max_tokens
// × V floats per rank — fine for the CPU reference; a GPU path would exchange per-slice top candidates instead.
// Collective: every rank calls each function once per step in the same order (T or n = 0 on an idle rank).
#pragma once

#include <cstdint>

#include "model/expert_parallel.h"

namespace m3 {

// x [T, H] = rows ids[t] of the embedding, of which this rank holds rows [v0, v1) (`rows`: [v1 − v0, H]).
void embed_vocab_parallel(const ExpertParallel& ep, const float* rows, int64_t v0, int64_t v1, int64_t V, int64_t H,
                          const int32_t* ids, int64_t T, float* x);

// logits [n, V] = hn [n, H] · lm_headᵀ, of which this rank holds rows [v0, v1) (`rows`: [v1 − v0, H]).
void lm_head_vocab_parallel(const ExpertParallel& ep, const float* rows, int64_t v0, int64_t v1, int64_t V,
                            int64_t H, const float* hn, int64_t n, float* logits);

// The same tables split over a KV-head group (model/rank_share.h attn_tp = vocab_parts = P), whose ranks all run the
// same rows — no row exchange, no max_tokens:
//   - embedding: each rank writes the rows of the ids in its range (zeros elsewhere), all_reduce (sum): exact;
//   - LM head: each rank computes its columns for every row, all_gather of [n, ⌈V/P⌉] blocks (zero padded), every
//     rank assembles the full logits — each element computed by one rank, so the one-rank values bit for bit.
void embed_vocab_split_same_rows(const ExpertParallel& ep, const float* rows, int64_t v0, int64_t v1, int64_t V,
                                 int64_t H, const int32_t* ids, int64_t T, float* x);
void lm_head_vocab_split_same_rows(const ExpertParallel& ep, const float* rows, int64_t V, int64_t H, const float* hn,
                                   int64_t n, float* logits);

}  // namespace m3
