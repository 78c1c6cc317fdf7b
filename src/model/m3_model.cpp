#include "model/m3_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "model/checkpoint.h"
#include "model/vocab_parallel.h"

namespace m3 {

namespace {

// Copies column block [c0, c0 + width) of a [T, ld] matrix into a dense [T, width] one.
std::vector<float> take_cols(const std::vector<float>& src, int64_t T, int64_t ld, int64_t c0, int64_t width) {
  std::vector<float> out(size_t(T * width));
  for (int64_t t = 0; t < T; ++t) std::memcpy(&out[t * width], &src[t * ld + c0], size_t(width) * 4);
  return out;
}

// SwiGLU-OAI MLP on x [T, H] → y [T, H].
std::vector<float> run_mlp(const MlpWeights& m, const float* x, int64_t T, int64_t H, const M3Config& c) {
  const int64_t I = m.intermediate;
  std::vector<float> gu(size_t(T * 2 * I)), a(size_t(T * I)), y(size_t(T * H));
  cpu::matmul_nt(x, T, H, m.gate_up.data(), 2 * I, gu.data());
  cpu::swiglu_oai(gu.data(), T, I, c.swiglu_alpha, c.swiglu_limit, a.data());
  cpu::matmul_nt(a.data(), T, I, m.down.data(), H, y.data());
  return y;
}

// Per-head Gemma RMSNorm then partial NeoX RoPE, in place. x: [T, heads, D].
void norm_rope(float* x, int64_t T, int64_t heads, int64_t D, const std::vector<float>& w, const M3Config& c,
               const int32_t* pos) {
  cpu::rms_norm_gemma(x, T * heads, D, w.data(), c.rms_norm_eps, x);
  cpu::rope_neox_partial(x, T, heads, D, c.rotary_dim, pos, c.rope_theta);
}

}  // namespace

M3Model::M3Model(M3Config cfg, M3Weights weights) : cfg_(std::move(cfg)), w_(std::move(weights)) {}

void M3Model::check_share(const ExpertParallel* ep) const {
  // A rank's weights (model/rank_share.h) run only in their place: an expert-parallel share needs the exchange of
  // its own rank (another rank's experts are empty here); attention split over KV heads runs as one TP group of all
  // ranks (each holds its heads' q/k/v rows and o columns; the o projections are summed over the group).
  const RankShare& s = w_.share;
  M3_CHECK((s.attn_tp == 1 || s.attn_tp == s.world) && (s.vocab_parts == 1 || s.vocab_parts == s.world),
           "the CPU forward runs attention whole or split over the KV heads of every rank, and the vocabulary whole "
           "or split over every rank (weights of rank {} of {} are split over KV heads ({}) and vocabulary ({}))",
           s.rank, s.world, s.attn_tp, s.vocab_parts);
  if (s.whole()) return;
  M3_CHECK(s.vocab_parts == 1 || s.expert_parallel || s.attn_tp > 1,
           "weights of rank {} of {}: a vocabulary split runs with the expert-parallel or KV-head layout only", s.rank,
           s.world);
  M3_CHECK(ep != nullptr && ep->comm->size() == s.world && ep->comm->rank() == s.rank,
           "weights of rank {} of {} (routed experts, KV heads or vocabulary split) need the parallel group of that "
           "rank", s.rank, s.world);
}


M3Model M3Model::load(const std::string& model_dir) {
  Checkpoint ck = load_checkpoint(model_dir);
  return M3Model(std::move(ck.config), std::move(ck.weights));
}

std::vector<std::vector<float>> M3Model::forward(std::span<const SeqInput> seqs, KVCache& cache,
                                                 ForwardTrace* trace, const ExpertParallel* ep) const {
  const M3Config& c = cfg_;
  // TP over KV heads (attn_tp > 1): this rank's heads only — Hq / tp query, Hkv / tp KV and Hidx / tp index heads in
  // the weights' row order (model/rank_share.h) — and its o projection is a partial sum, all-reduced over the group.
  // Every rank of the group runs the same rows.
  const int64_t tp = w_.share.attn_tp;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_q_heads / tp, Hkv = c.num_kv_heads / tp;
  const int64_t B = c.sparse_block_size, V = c.vocab_size;
  M3_CHECK(cache.block_size() == B, "KV cache page size {} differs from the model's block size {}",
           cache.block_size(), B);
  check_share(ep);
  // The MoE rows go through the expert-parallel exchange with a group (DP ranks: each its own rows). A KV-head split
  // runs the same rows on every rank: with every expert held each rank computes them locally; with the experts split
  // each rank runs its own experts and the slot outputs are all-reduced (each slot has one owner, the others add
  // zeros: the sums are exact).
  const bool moe_exchange = ep != nullptr && tp == 1;
  const bool moe_tp_reduce = tp > 1 && w_.share.expert_parallel;
  M3_CHECK(c.num_layers == 0 || cache.layer_view(0).num_kv_heads == Hkv,
           "KV cache of {} KV heads for a rank holding {} (attention split {} ways: RankShare::kv_config)",
           cache.layer_view(0).num_kv_heads, Hkv, tp);

  // The ragged batch flattened: row t of the step is token ids[t] of sequence row_seq[t] at position pos[t].
  const StepRows rows = StepRows::build(c, seqs, cache.pool().capacity());
  const std::vector<int64_t>& seq_begin = rows.seq_begin;
  const std::vector<int32_t>& pos = rows.pos;
  const int64_t T = rows.num_rows();

  std::vector<float> x(size_t(T * H));
  const bool vocab_split = w_.share.vocab_parts > 1;
  if (vocab_split && tp > 1) {  // a KV-head group: every rank has the same rows
    const auto [v0, v1] = w_.share.vocab_rows(V);
    embed_vocab_split_same_rows(*ep, w_.embed.data(), v0, v1, V, H, rows.ids.data(), T, x.data());
  } else if (vocab_split) {
    const auto [v0, v1] = w_.share.vocab_rows(V);
    embed_vocab_parallel(*ep, w_.embed.data(), v0, v1, V, H, rows.ids.data(), T, x.data());
  } else {
    for (int64_t t = 0; t < T; ++t) std::memcpy(&x[t * H], &w_.embed[size_t(rows.ids[t]) * H], size_t(H) * 4);
  }
  // Vision features replace the slot rows, in order (HF masked_scatter; docs/M3_MODEL.md §5.6).
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto& me = seqs[s].media_embeds;
    if (me.empty()) continue;
    size_t used = 0;
    for (int64_t t = seq_begin[s]; t < seq_begin[s + 1]; ++t) {
      const int32_t id = rows.ids[t];
      if (id < 0 || (id != c.image_token_id && id != c.video_token_id)) continue;
      M3_CHECK((used + 1) * size_t(H) <= me.size(), "sequence {}: more image/video slot tokens than media rows", s);
      std::memcpy(&x[t * H], me.data() + used * size_t(H), size_t(H) * 4);
      ++used;
    }
    M3_CHECK(used * size_t(H) == me.size(), "sequence {}: {} image/video slot tokens but {} media rows", s, used,
             me.size() / size_t(H));
  }
  if (trace) {
    trace->hidden.assign(trace->capture_hidden ? c.num_layers : 0, {});
    trace->selection.assign(c.num_layers, {});
    trace->block_scores.assign(c.num_layers, {});
    trace->block_scores_cols.assign(seqs.size(), 0);
    trace->q.assign(c.num_layers, {});
    trace->index_q.assign(c.num_layers, {});
  }

  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t qkv_w = (Hq + 2 * Hkv) * D;
  std::vector<float> xn(size_t(T * H)), qkv(size_t(T * qkv_w)), attn(size_t(T * Hq * D)), o(size_t(T * H));

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    // ---- attention -------------------------------------------------------------------------------------
    cpu::rms_norm_gemma(x.data(), T, H, L.input_norm.data(), c.rms_norm_eps, xn.data());
    cpu::matmul_nt(xn.data(), T, H, L.wqkv.data(), qkv_w, qkv.data());
    std::vector<float> q = take_cols(qkv, T, qkv_w, 0, Hq * D);             // [T, Hq, D]
    std::vector<float> k = take_cols(qkv, T, qkv_w, Hq * D, Hkv * D);       // [T, Hkv, D]
    std::vector<float> v = take_cols(qkv, T, qkv_w, (Hq + Hkv) * D, Hkv * D);  // [T, Hkv, D]
    norm_rope(q.data(), T, Hq, D, L.q_norm, c, pos.data());
    norm_rope(k.data(), T, Hkv, D, L.k_norm, c, pos.data());
    // K/V of the new tokens go into the cache before anyone attends (queries see their own chunk).
    for (int64_t t = 0; t < T; ++t) {
      const int32_t page = rows.slot[t];
      const int64_t off = pos[t] % B;
      for (int64_t h = 0; h < Hkv; ++h) {
        // Rounded as the cache's storage says (kv/kv_cache.h KvStorage: fp32 by default, bf16, e4m3 + scale).
        cache.write(KvTensor::K, l, cache.k(page, l) + (h * B + off) * D, &k[(t * Hkv + h) * D], D);
        cache.write(KvTensor::V, l, cache.v(page, l) + (h * B + off) * D, &v[(t * Hkv + h) * D], D);
      }
    }
    const cpu::PagedKV kv = cache.layer_view(l);

    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const int64_t Hi = c.index_num_heads / tp, Di = c.index_head_dim, K = c.sparse_topk_blocks;
      const int64_t iw = (Hi + 1) * Di;
      std::vector<float> iqk(size_t(T * iw));
      cpu::matmul_nt(xn.data(), T, H, L.w_index_qk.data(), iw, iqk.data());
      std::vector<float> iq = take_cols(iqk, T, iw, 0, Hi * Di);  // [T, Hidx, Di]
      std::vector<float> ik = take_cols(iqk, T, iw, Hi * Di, Di);  // [T, Di]: one key shared by all index heads
      norm_rope(iq.data(), T, Hi, Di, L.index_q_norm, c, pos.data());
      norm_rope(ik.data(), T, 1, Di, L.index_k_norm, c, pos.data());
      for (int64_t t = 0; t < T; ++t)
        cache.write(KvTensor::IndexK, l, cache.index_k(rows.slot[t], l) + (pos[t] % B) * Di, &ik[t * Di], Di);
      const cpu::PagedIndexK ikv = cache.index_view(l);
      if (trace && trace->capture_sparse_queries) {
        trace->q[l] = q;
        trace->index_q[l] = iq;
      }
      for (size_t s = 0; s < seqs.size(); ++s) {
        const int64_t t0 = seq_begin[s], n = seq_begin[s + 1] - t0;
        const int64_t max_blocks = pos[t0 + n - 1] / B + 1;
        std::vector<float> scores(size_t(Hi * n * max_blocks));
        std::vector<int32_t> sel(size_t(Hi * n * K));
        cpu::msa_block_scores(&iq[t0 * Hi * Di], n, int(Hi), &pos[t0], ikv, seqs[s].page_table.data(), max_blocks,
                              scores.data());
        cpu::msa_topk(scores.data(), n, int(Hi), &pos[t0], int(B), max_blocks, int(K), sel.data());
        cpu::attention_sparse(&q[t0 * Hq * D], n, int(Hq), &pos[t0], kv, seqs[s].page_table.data(), sel.data(),
                              int(K), scale, &attn[t0 * Hq * D]);
        if (trace && trace->capture_selection) trace->selection[l].push_back(sel);
        if (trace && trace->capture_block_scores) {
          trace->block_scores[l].push_back(std::move(scores));
          trace->block_scores_cols[s] = max_blocks;
        }
      }
    } else {
      for (size_t s = 0; s < seqs.size(); ++s) {
        const int64_t t0 = seq_begin[s], n = seq_begin[s + 1] - t0;
        cpu::attention_dense_causal(&q[t0 * Hq * D], n, int(Hq), &pos[t0], kv, seqs[s].page_table.data(), scale,
                                    &attn[t0 * Hq * D]);
      }
    }
    cpu::matmul_nt(attn.data(), T, Hq * D, L.wo.data(), H, o.data());
    if (tp > 1) ep->comm->all_reduce_sum(o.data(), size_t(T * H));  // the group's heads, summed in rank order
    for (int64_t i = 0; i < T * H; ++i) x[i] += o[i];

    // ---- feed-forward ----------------------------------------------------------------------------------
    cpu::rms_norm_gemma(x.data(), T, H, L.post_attn_norm.data(), c.rms_norm_eps, xn.data());
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      std::vector<float> y = run_mlp(L.mlp, xn.data(), T, H, c);
      for (int64_t i = 0; i < T * H; ++i) x[i] += y[i];
    } else {
      const int64_t E = c.num_experts, Kx = c.num_experts_per_tok;
      std::vector<float> logits(size_t(T * E)), weights(size_t(T * Kx));
      std::vector<int32_t> ids(size_t(T * Kx));
      cpu::matmul_nt(xn.data(), T, H, L.router.data(), E, logits.data());
      cpu::moe_route(logits.data(), T, E, L.router_bias.empty() ? nullptr : L.router_bias.data(), int(Kx),
                     c.routed_scaling_factor, ids.data(), weights.data());
      // Expert outputs per (token, slot); summed afterwards in slot order so a token's result does not depend on
      // which other tokens share the step.
      std::vector<float> slot_out(size_t(T * Kx * H));
      if (moe_exchange) {
        moe_slots_expert_parallel(
            *ep, E, Kx, H, xn.data(), T, ids.data(),
            [&](int64_t e, const float* xe, int64_t n) { return run_mlp(L.experts[size_t(e)], xe, n, H, c); },
            slot_out.data());
      }
      for (int64_t e = 0; e < E && !moe_exchange; ++e) {
        if (moe_tp_reduce && !w_.share.owns_expert(e)) continue;  // another rank's expert: its slots stay 0 here
        std::vector<int64_t> rows;  // (t·Kx + k) of the slots routed to expert e
        for (int64_t r = 0; r < T * Kx; ++r)
          if (ids[r] == e) rows.push_back(r);
        if (rows.empty()) continue;
        std::vector<float> xe(rows.size() * H);
        for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&xe[i * H], &xn[(rows[i] / Kx) * H], size_t(H) * 4);
        std::vector<float> ye = run_mlp(L.experts[e], xe.data(), int64_t(rows.size()), H, c);
        for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&slot_out[rows[i] * H], &ye[i * H], size_t(H) * 4);
      }
      if (moe_tp_reduce) ep->comm->all_reduce_sum(slot_out.data(), slot_out.size());
      std::vector<float> shared;
      if (!L.shared.gate_up.empty()) shared = run_mlp(L.shared, xn.data(), T, H, c);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          float acc = 0.f;
          for (int64_t k2 = 0; k2 < Kx; ++k2) acc += weights[t * Kx + k2] * slot_out[(t * Kx + k2) * H + h];
          if (!shared.empty()) acc += shared[t * H + h];
          x[t * H + h] += acc;
        }
    }
    if (trace && trace->capture_hidden) trace->hidden[l] = x;
  }

  // ---- head: final norm + LM head on the rows that need logits -------------------------------------------
  // The output rows of every sequence (its last row, or all of them), normed into one buffer; each sequence's
  // logits come from its own product (no step-wide copy of the logits), or from one vocabulary-parallel exchange.
  std::vector<int64_t> first(seqs.size()), count(seqs.size());
  int64_t n = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    first[s] = seqs[s].all_logits ? seq_begin[s] : seq_begin[s + 1] - 1;
    count[s] = seq_begin[s + 1] - first[s];
    n += count[s];
  }
  std::vector<float> hn(size_t(n * H));
  for (size_t s = 0, r = 0; s < seqs.size(); r += size_t(count[s]), ++s)
    cpu::rms_norm_gemma(&x[first[s] * H], count[s], H, w_.final_norm.data(), c.rms_norm_eps, &hn[r * size_t(H)]);
  std::vector<std::vector<float>> out(seqs.size());
  if (vocab_split) {
    std::vector<float> lg(size_t(n * V));
    const auto [v0, v1] = w_.share.vocab_rows(V);
    if (tp > 1)
      lm_head_vocab_split_same_rows(*ep, w_.lm_head.data(), V, H, hn.data(), n, lg.data());
    else
      lm_head_vocab_parallel(*ep, w_.lm_head.data(), v0, v1, V, H, hn.data(), n, lg.data());
    for (size_t s = 0, r = 0; s < seqs.size(); r += size_t(count[s]), ++s)
      out[s].assign(lg.begin() + int64_t(r) * V, lg.begin() + int64_t(r + size_t(count[s])) * V);
  } else {
    for (size_t s = 0, r = 0; s < seqs.size(); r += size_t(count[s]), ++s) {
      out[s].resize(size_t(count[s] * V));
      cpu::matmul_nt(&hn[r * size_t(H)], count[s], H, w_.lm_head.data(), V, out[s].data());
    }
  }
  return out;
}

void M3Model::idle_step(const ExpertParallel& ep) const {
  const M3Config& c = cfg_;
  check_share(&ep);
  M3_CHECK(w_.share.attn_tp == 1,
           "rank {} of {}: a rank of a KV-head split cannot sit out a step (every rank of the group runs the same rows)",
           w_.share.rank, w_.share.world);
  // The same collectives as a forward, in the same order, with no rows: embedding, MoE layers, LM head.
  const bool vocab_split = w_.share.vocab_parts > 1;
  const auto [v0, v1] = w_.share.vocab_rows(c.vocab_size);
  if (vocab_split) embed_vocab_parallel(ep, w_.embed.data(), v0, v1, c.vocab_size, c.hidden_size, nullptr, 0, nullptr);
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.mlp_kinds[l] != MlpKind::MoE) continue;
    const LayerWeights& L = w_.layers[size_t(l)];
    moe_slots_expert_parallel(
        ep, c.num_experts, c.num_experts_per_tok, c.hidden_size, nullptr, 0, nullptr,
        [&](int64_t e, const float* xe, int64_t n) { return run_mlp(L.experts[size_t(e)], xe, n, c.hidden_size, c); },
        nullptr);
  }
  if (vocab_split)
    lm_head_vocab_parallel(ep, w_.lm_head.data(), v0, v1, c.vocab_size, c.hidden_size, nullptr, 0, nullptr);
}

}  // namespace m3
