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

M3Weights M3Weights::load(const M3Config& c, const SafeTensors& st) {
  // The slots, names, shapes and concatenation order come from the weight plan (model/weight_plan.h), which the
  // streaming CUDA loader walks too.
  M3Weights w = skeleton(c);
  for (const WeightSlot& s : weight_plan(c)) {
    if (s.kind == SlotKind::LmHead && s.may_tie_to_embed && !st.has(s.pieces[0].names[0])) {
      w.lm_head = w.embed;
      continue;
    }
    std::vector<float>& dst = host_slot(w, s);
    dst.reserve(size_t(s.numel()));
    for (const WeightPiece& p : s.pieces) {
      std::vector<float> v = st.read_f32(resolve_name(st, p), p.shape);
      dst.insert(dst.end(), v.begin(), v.end());
    }
  }
  return w;
}

}  // namespace m3
