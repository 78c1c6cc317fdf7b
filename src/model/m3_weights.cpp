#include "model/m3_weights.h"

#include <fmt/format.h>

#include "base/error.h"
#include "model/weight_plan.h"

namespace m3 {

M3Weights M3Weights::skeleton(const M3Config& c) {
  M3Weights w;
  w.layers.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    if (c.mlp_kinds[size_t(l)] == MlpKind::Dense) {
      L.mlp.intermediate = c.dense_intermediate_size;
    } else {
      L.experts.resize(size_t(c.num_experts));
      for (auto& e : L.experts) e.intermediate = c.moe_intermediate_size;
      if (c.shared_intermediate_size > 0) L.shared.intermediate = c.shared_intermediate_size;
    }
  }
  return w;
}

M3Weights M3Weights::load(const M3Config& c, const SafeTensors& st, const RankShare& share) {
  // The slots, names, shapes and concatenation order come from the weight plan (model/weight_plan.h), which the
  // streaming CUDA loader walks too; a share keeps the rank's slots and blocks only.
  M3Weights w = skeleton(c);
  w.share = share;
  for (const SlotShare& ss : rank_weight_plan(c, share)) {
    const WeightSlot& s = ss.slot;
    if (s.kind == SlotKind::LmHead && s.may_tie_to_embed && !st.has(s.pieces[0].names[0])) {
      w.lm_head = w.embed;  // the same vocabulary rows: the LM head's blocks are the embedding's
      continue;
    }
    std::vector<float>& dst = host_slot(w, s);
    dst.reserve(size_t(ss.numel()));
    for (size_t i = 0; i < s.pieces.size(); ++i) {
      const WeightPiece& p = s.pieces[i];
      const PieceBlock& b = ss.blocks[i];
      std::vector<float> v = st.read_f32_block(resolve_name(st, p), p.shape, b.row0, b.row1, b.col0, b.col1);
      dst.insert(dst.end(), v.begin(), v.end());
    }
  }
  return w;
}

int64_t M3Weights::bytes() const {
  auto n = [](const std::vector<float>& v) { return int64_t(v.size()); };
  auto mlp = [&](const MlpWeights& m) { return n(m.gate_up) + n(m.down); };
  int64_t e = n(embed) + n(final_norm) + n(lm_head);
  for (const LayerWeights& L : layers) {
    e += n(L.input_norm) + n(L.post_attn_norm) + n(L.wqkv) + n(L.wo) + n(L.q_norm) + n(L.k_norm) + n(L.w_index_qk) +
         n(L.index_q_norm) + n(L.index_k_norm) + mlp(L.mlp) + n(L.router) + n(L.router_bias) + mlp(L.shared);
    for (const MlpWeights& x : L.experts) e += mlp(x);
  }
  return e * 4;
}

}  // namespace m3
