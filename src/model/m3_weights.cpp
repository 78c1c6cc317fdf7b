#include "model/m3_weights.h"

#include <fmt/format.h>

#include "base/error.h"

namespace m3 {

namespace {

using Shape = std::vector<int64_t>;

void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

// The first of several accepted spellings that exists (released vs HF save_pretrained names).
std::string first_present(const SafeTensors& st, std::initializer_list<std::string> names) {
  for (const auto& n : names)
    if (st.has(n)) return n;
  return *names.begin();  // get() then reports it missing
}

MlpWeights load_mlp(const SafeTensors& st, const std::string& gate, const std::string& up, const std::string& down,
                    int64_t H, int64_t I) {
  MlpWeights m;
  m.intermediate = int(I);
  m.gate_up = st.read_f32(gate, {I, H});
  append(m.gate_up, st.read_f32(up, {I, H}));
  m.down = st.read_f32(down, {H, I});
  return m;
}

}  // namespace

M3Weights M3Weights::load(const M3Config& c, const SafeTensors& st) {
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  M3Weights w;
  w.embed = st.read_f32("model.embed_tokens.weight", {V, H});
  w.final_norm = st.read_f32("model.norm.weight", {H});
  if (st.has("lm_head.weight") || !c.tie_word_embeddings)
    w.lm_head = st.read_f32("lm_head.weight", {V, H});
  else
    w.lm_head = w.embed;
  w.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& L = w.layers[l];
    L.input_norm = st.read_f32(p + "input_layernorm.weight", {H});
    L.post_attn_norm = st.read_f32(p + "post_attention_layernorm.weight", {H});
    L.wqkv = st.read_f32(p + "self_attn.q_proj.weight", {int64_t(c.num_q_heads) * D, H});
    append(L.wqkv, st.read_f32(p + "self_attn.k_proj.weight", {int64_t(c.num_kv_heads) * D, H}));
    append(L.wqkv, st.read_f32(p + "self_attn.v_proj.weight", {int64_t(c.num_kv_heads) * D, H}));
    L.wo = st.read_f32(p + "self_attn.o_proj.weight", {H, int64_t(c.num_q_heads) * D});
    L.q_norm = st.read_f32(p + "self_attn.q_norm.weight", {D});
    L.k_norm = st.read_f32(p + "self_attn.k_norm.weight", {D});
    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const int64_t Di = c.index_head_dim;
      L.w_index_qk = st.read_f32(p + "self_attn.index_q_proj.weight", {int64_t(c.index_num_heads) * Di, H});
      append(L.w_index_qk, st.read_f32(p + "self_attn.index_k_proj.weight", {Di, H}));
      L.index_q_norm = st.read_f32(p + "self_attn.index_q_norm.weight", {Di});
      L.index_k_norm = st.read_f32(p + "self_attn.index_k_norm.weight", {Di});
    }
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      const int64_t I = c.dense_intermediate_size;
      // Released checkpoints say mlp.*, HF's save_pretrained says block_sparse_moe.* for dense layers.
      auto name = [&](const char* proj) {
        return first_present(st, {p + "mlp." + proj + ".weight", p + "block_sparse_moe." + proj + ".weight"});
      };
      L.mlp = load_mlp(st, name("gate_proj"), name("up_proj"), name("down_proj"), H, I);
    } else {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      const std::string m = p + "block_sparse_moe.";
      L.router = st.read_f32(m + "gate.weight", {E, H});
      if (c.use_routing_bias)
        L.router_bias = st.read_f32(m + "e_score_correction_bias", {E});
      L.experts.reserve(E);
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}experts.{}.", m, e);
        L.experts.push_back(load_mlp(st, x + "w1.weight", x + "w3.weight", x + "w2.weight", H, I));
      }
      if (c.shared_intermediate_size > 0) {
        const int64_t S = c.shared_intermediate_size;
        auto name = [&](const char* proj) {
          return first_present(st, {m + "shared_experts." + proj + ".weight", m + "shared_expert." + proj + ".weight"});
        };
        L.shared = load_mlp(st, name("gate_proj"), name("up_proj"), name("down_proj"), H, S);
      }
    }
  }
  return w;
}

}  // namespace m3
