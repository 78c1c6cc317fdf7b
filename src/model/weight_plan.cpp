#include "model/weight_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/counter_hash.h"
#include "base/error.h"

namespace m3 {

int64_t WeightPiece::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int64_t WeightSlot::numel() const {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.numel();
  return n;
}

int64_t WeightSlot::rows() const {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.shape.empty() ? 1 : p.shape[0];
  return n;
}

namespace {

const char* kind_name(SlotKind k) {
  switch (k) {
    case SlotKind::Embed: return "embed";
    case SlotKind::FinalNorm: return "final_norm";
    case SlotKind::LmHead: return "lm_head";
    case SlotKind::InputNorm: return "input_norm";
    case SlotKind::PostAttnNorm: return "post_attn_norm";
    case SlotKind::Wqkv: return "wqkv";
    case SlotKind::Wo: return "wo";
    case SlotKind::QNorm: return "q_norm";
    case SlotKind::KNorm: return "k_norm";
    case SlotKind::WIndexQk: return "w_index_qk";
    case SlotKind::IndexQNorm: return "index_q_norm";
    case SlotKind::IndexKNorm: return "index_k_norm";
    case SlotKind::MlpGateUp: return "mlp.gate_up";
    case SlotKind::MlpDown: return "mlp.down";
    case SlotKind::Router: return "router";
    case SlotKind::RouterBias: return "router_bias";
    case SlotKind::ExpertGateUp: return "gate_up";
    case SlotKind::ExpertDown: return "down";
    case SlotKind::SharedGateUp: return "shared.gate_up";
    case SlotKind::SharedDown: return "shared.down";
  }
  return "?";
}

using Shape = std::vector<int64_t>;

WeightSlot slot(SlotKind k, int layer, bool matrix, std::vector<WeightPiece> pieces, int expert = -1) {
  WeightSlot s;
  s.kind = k, s.layer = layer, s.expert = expert, s.matrix = matrix, s.pieces = std::move(pieces);
  // Dummy scale: matrices ~ 1/sqrt(fan_in) so activations keep their size through a layer; norm weights (applied as
  // 1 + w by the Gemma-style norms) and the router bias small.
  const Shape& sh = s.pieces[0].shape;
  if (k == SlotKind::Embed || k == SlotKind::LmHead)
    s.dummy_scale = k == SlotKind::Embed ? 1.f : float(1.0 / std::sqrt(double(sh.back())));
  else if (matrix || k == SlotKind::Router)
    s.dummy_scale = float(1.0 / std::sqrt(double(sh.back())));
  else
    s.dummy_scale = 0.1f;
  return s;
}

WeightPiece piece(std::vector<std::string> names, Shape shape) { return WeightPiece{std::move(names), std::move(shape)}; }

}  // namespace

std::string WeightSlot::label() const {
  if (layer < 0) return kind_name(kind);
  if (expert >= 0) return fmt::format("layers.{}.experts.{}.{}", layer, expert, kind_name(kind));
  return fmt::format("layers.{}.{}", layer, kind_name(kind));
}

uint64_t WeightSlot::stream_id() const {
  return (uint64_t(kind) << 48) | (uint64_t(layer + 1) << 24) | uint64_t(expert + 1);
}

std::vector<WeightSlot> weight_plan(const M3Config& c) {
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  std::vector<WeightSlot> plan;
  plan.push_back(slot(SlotKind::Embed, -1, true, {piece({"model.embed_tokens.weight"}, {V, H})}));
  plan.push_back(slot(SlotKind::FinalNorm, -1, false, {piece({"model.norm.weight"}, {H})}));
  plan.push_back(slot(SlotKind::LmHead, -1, true, {piece({"lm_head.weight"}, {V, H})}));
  plan.back().may_tie_to_embed = c.tie_word_embeddings;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    plan.push_back(slot(SlotKind::InputNorm, l, false, {piece({p + "input_layernorm.weight"}, {H})}));
    plan.push_back(slot(SlotKind::PostAttnNorm, l, false, {piece({p + "post_attention_layernorm.weight"}, {H})}));
    plan.push_back(slot(SlotKind::Wqkv, l, true,
                        {piece({p + "self_attn.q_proj.weight"}, {int64_t(c.num_q_heads) * D, H}),
                         piece({p + "self_attn.k_proj.weight"}, {int64_t(c.num_kv_heads) * D, H}),
                         piece({p + "self_attn.v_proj.weight"}, {int64_t(c.num_kv_heads) * D, H})}));
    plan.push_back(slot(SlotKind::Wo, l, true, {piece({p + "self_attn.o_proj.weight"}, {H, int64_t(c.num_q_heads) * D})}));
    plan.push_back(slot(SlotKind::QNorm, l, false, {piece({p + "self_attn.q_norm.weight"}, {D})}));
    plan.push_back(slot(SlotKind::KNorm, l, false, {piece({p + "self_attn.k_norm.weight"}, {D})}));
    if (c.attn_kinds[size_t(l)] == AttnKind::Sparse) {
      const int64_t Di = c.index_head_dim;
      plan.push_back(slot(SlotKind::WIndexQk, l, true,
                          {piece({p + "self_attn.index_q_proj.weight"}, {int64_t(c.index_num_heads) * Di, H}),
                           piece({p + "self_attn.index_k_proj.weight"}, {Di, H})}));
      plan.push_back(slot(SlotKind::IndexQNorm, l, false, {piece({p + "self_attn.index_q_norm.weight"}, {Di})}));
      plan.push_back(slot(SlotKind::IndexKNorm, l, false, {piece({p + "self_attn.index_k_norm.weight"}, {Di})}));
    }
    if (c.mlp_kinds[size_t(l)] == MlpKind::Dense) {
      const int64_t I = c.dense_intermediate_size;
      // Released checkpoints say mlp.*, HF's save_pretrained says block_sparse_moe.* for dense layers.
      auto names = [&](const char* proj) {
        return std::vector<std::string>{p + "mlp." + proj + ".weight", p + "block_sparse_moe." + proj + ".weight"};
      };
      plan.push_back(slot(SlotKind::MlpGateUp, l, true, {piece(names("gate_proj"), {I, H}), piece(names("up_proj"), {I, H})}));
      plan.push_back(slot(SlotKind::MlpDown, l, true, {piece(names("down_proj"), {H, I})}));
    } else {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      const std::string m = p + "block_sparse_moe.";
      plan.push_back(slot(SlotKind::Router, l, false, {piece({m + "gate.weight"}, {E, H})}));
      if (c.use_routing_bias) plan.push_back(slot(SlotKind::RouterBias, l, false, {piece({m + "e_score_correction_bias"}, {E})}));
      for (int e = 0; e < int(E); ++e) {
        const std::string x = fmt::format("{}experts.{}.", m, e);
        plan.push_back(slot(SlotKind::ExpertGateUp, l, true, {piece({x + "w1.weight"}, {I, H}), piece({x + "w3.weight"}, {I, H})}, e));
        plan.push_back(slot(SlotKind::ExpertDown, l, true, {piece({x + "w2.weight"}, {H, I})}, e));
      }
      if (c.shared_intermediate_size > 0) {
        const int64_t S = c.shared_intermediate_size;
        auto names = [&](const char* proj) {
          return std::vector<std::string>{m + "shared_experts." + proj + ".weight", m + "shared_expert." + proj + ".weight"};
        };
        plan.push_back(slot(SlotKind::SharedGateUp, l, true, {piece(names("gate_proj"), {S, H}), piece(names("up_proj"), {S, H})}));
        plan.push_back(slot(SlotKind::SharedDown, l, true, {piece(names("down_proj"), {H, S})}));
      }
    }
  }
  return plan;
}

int64_t plan_bytes(const std::vector<WeightSlot>& plan, int matrix_bytes) {
  int64_t b = 0;
  for (const auto& s : plan) b += s.numel() * (s.matrix ? matrix_bytes : 4);
  return b;
}

std::string resolve_name(const SafeTensors& st, const WeightPiece& p) {
  for (const auto& n : p.names)
    if (st.has(n)) return n;
  return p.names.front();
}

std::vector<float>& host_slot(M3Weights& w, const WeightSlot& s) {
  if (s.layer < 0) {
    switch (s.kind) {
      case SlotKind::Embed: return w.embed;
      case SlotKind::FinalNorm: return w.final_norm;
      default: return w.lm_head;
    }
  }
  M3_CHECK(s.layer < int(w.layers.size()), "host_slot: layer {} of {}", s.layer, w.layers.size());
  LayerWeights& L = w.layers[size_t(s.layer)];
  switch (s.kind) {
    case SlotKind::InputNorm: return L.input_norm;
    case SlotKind::PostAttnNorm: return L.post_attn_norm;
    case SlotKind::Wqkv: return L.wqkv;
    case SlotKind::Wo: return L.wo;
    case SlotKind::QNorm: return L.q_norm;
    case SlotKind::KNorm: return L.k_norm;
    case SlotKind::WIndexQk: return L.w_index_qk;
    case SlotKind::IndexQNorm: return L.index_q_norm;
    case SlotKind::IndexKNorm: return L.index_k_norm;
    case SlotKind::MlpGateUp: return L.mlp.gate_up;
    case SlotKind::MlpDown: return L.mlp.down;
    case SlotKind::Router: return L.router;
    case SlotKind::RouterBias: return L.router_bias;
    case SlotKind::SharedGateUp: return L.shared.gate_up;
    case SlotKind::SharedDown: return L.shared.down;
    case SlotKind::ExpertGateUp:
    case SlotKind::ExpertDown: {
      M3_CHECK(s.expert < int(L.experts.size()), "host_slot: expert {} of {}", s.expert, L.experts.size());
      MlpWeights& e = L.experts[size_t(s.expert)];
      return s.kind == SlotKind::ExpertGateUp ? e.gate_up : e.down;
    }
    default: break;
  }
  fail("host_slot: slot {} has no host storage", s.label());
}

std::vector<float> dummy_slot_values(const WeightSlot& s, uint64_t seed) {
  const uint64_t key = counter_key(seed, s.stream_id());
  std::vector<float> v(size_t(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = counter_uniform(key, i, s.dummy_scale);
  return v;
}

M3Weights dummy_weights(const M3Config& c, uint64_t seed, const RankShare& share) {
  M3Weights w = M3Weights::skeleton(c);
  w.share = share;
  for (const SlotShare& ss : rank_weight_plan(c, share)) {
    const WeightSlot& s = ss.slot;
    if (s.kind == SlotKind::LmHead && s.may_tie_to_embed) {
      w.lm_head = w.embed;
      continue;
    }
    if (ss.whole()) {
      host_slot(w, s) = dummy_slot_values(s, seed);
      continue;
    }
    // Element (r, c) of piece i is element offset(i) + r·cols + c of the whole slot's counter stream, so a rank's
    // block equals the same block of the whole model's dummy weights.
    const uint64_t key = counter_key(seed, s.stream_id());
    std::vector<float>& dst = host_slot(w, s);
    dst.reserve(size_t(ss.numel()));
    int64_t offset = 0;
    for (size_t i = 0; i < s.pieces.size(); ++i) {
      const WeightPiece& p = s.pieces[i];
      const PieceBlock& b = ss.blocks[i];
      const int64_t cols = p.shape.empty() ? 1 : p.shape.back();
      for (int64_t r = b.row0; r < b.row1; ++r)
        for (int64_t col = b.col0; col < b.col1; ++col)
          dst.push_back(counter_uniform(key, uint64_t(offset + r * cols + col), s.dummy_scale));
      offset += p.numel();
    }
  }
  return w;
}

int64_t SlotShare::numel() const {
  int64_t n = 0;
  for (const auto& b : blocks) n += b.numel();
  return n;
}

bool SlotShare::whole() const { return numel() == slot.numel(); }

std::vector<SlotShare> rank_weight_plan(const M3Config& c, const RankShare& share) {
  share.validate(c);
  const int64_t D = c.head_dim, G = c.num_q_heads / c.num_kv_heads, T = share.attn_tp, j = share.tp_index();
  const int64_t k0 = j * c.num_kv_heads / T, k1 = (j + 1) * c.num_kv_heads / T;  // the rank's KV heads
  const int64_t i0 = j * c.index_num_heads / T, i1 = (j + 1) * c.index_num_heads / T;  // its index-q heads
  const auto [v0, v1] = share.vocab_rows(c.vocab_size);  // its vocabulary rows
  std::vector<SlotShare> out;
  for (WeightSlot& s : weight_plan(c)) {
    if ((s.kind == SlotKind::ExpertGateUp || s.kind == SlotKind::ExpertDown) && !share.owns_expert(s.expert)) continue;
    SlotShare ss;
    for (const WeightPiece& p : s.pieces) {
      const int64_t cols = p.shape.empty() ? 1 : p.shape.back(), rows = p.numel() / std::max<int64_t>(cols, 1);
      ss.blocks.push_back(PieceBlock{0, rows, 0, cols});
    }
    switch (s.kind) {
      case SlotKind::Embed:
      case SlotKind::LmHead:
        ss.blocks[0].row0 = v0, ss.blocks[0].row1 = v1;
        break;
      case SlotKind::Wqkv:  // pieces q [Hq·D, H], k [Hkv·D, H], v [Hkv·D, H]
        ss.blocks[0].row0 = k0 * G * D, ss.blocks[0].row1 = k1 * G * D;
        for (size_t i = 1; i < 3; ++i) ss.blocks[i].row0 = k0 * D, ss.blocks[i].row1 = k1 * D;
        break;
      case SlotKind::Wo:  // [H, Hq·D]: the columns that read the rank's q heads
        ss.blocks[0].col0 = k0 * G * D, ss.blocks[0].col1 = k1 * G * D;
        break;
      case SlotKind::WIndexQk:  // pieces index_q [Hidx·Di, H] (the rank's heads), index_k [Di, H] (whole)
        ss.blocks[0].row0 = i0 * c.index_head_dim, ss.blocks[0].row1 = i1 * c.index_head_dim;
        break;
      default: break;
    }
    ss.slot = std::move(s);
    out.push_back(std::move(ss));
  }
  return out;
}

int64_t share_bytes(const std::vector<SlotShare>& plan, WeightBytes model) {
  int64_t b = 0;
  for (const SlotShare& ss : plan) {
    const WeightSlot& s = ss.slot;
    if (!s.matrix || model == WeightBytes::Fp32) {
      b += ss.numel() * 4;
    } else if (model == WeightBytes::Bf16 || s.kind == SlotKind::Embed || s.kind == SlotKind::LmHead ||
               (model == WeightBytes::Fp8Bf16Experts && s.expert >= 0)) {
      b += ss.numel() * 2;
    } else {  // MXFP8: one e4m3 byte per element, one UE8M0 byte per 32 elements of a row
      for (const PieceBlock& pb : ss.blocks) b += pb.numel() + (pb.row1 - pb.row0) * ((pb.col1 - pb.col0 + 31) / 32);
    }
  }
  return b;
}

}  // namespace m3
