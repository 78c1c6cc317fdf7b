#include "test_model_util.h"

#include <cmath>
#include <filesystem>
#include <random>

#include "io/safetensors.h"
#include "kv/sequence_kv.h"
#include "model/weight_plan.h"

namespace m3::test {

M3Config tiny_config() {
  M3Config c;
  c.hidden_size = 64;
  c.num_layers = 5;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.max_position_embeddings = 4096;
  c.rope_theta = 10000.0;
  c.rotary_dim = 8;
  c.dense_intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.shared_intermediate_size = 32;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.routed_scaling_factor = 2.0f;
  c.index_num_heads = 2;
  c.index_head_dim = 16;
  c.sparse_block_size = 16;
  c.sparse_topk_blocks = 4;
  c.attn_kinds = {AttnKind::Dense, AttnKind::Dense, AttnKind::Dense, AttnKind::Sparse, AttnKind::Sparse};
  c.mlp_kinds = {MlpKind::Dense, MlpKind::Dense, MlpKind::Dense, MlpKind::MoE, MlpKind::MoE};
  c.validate();
  return c;
}

M3Config tensor_core_config() {
  M3Config c = tiny_config();
  c.hidden_size = 256;
  c.num_layers = 3;
  c.num_q_heads = 32, c.num_kv_heads = 2, c.head_dim = 128, c.rotary_dim = 64;
  c.index_num_heads = 2, c.index_head_dim = 128;
  c.sparse_block_size = 128, c.sparse_topk_blocks = 2;
  c.vocab_size = 512;
  c.attn_kinds = {AttnKind::Dense, AttnKind::Sparse, AttnKind::Sparse};
  c.mlp_kinds = {MlpKind::Dense, MlpKind::MoE, MlpKind::MoE};
  c.validate();
  return c;
}

namespace {
std::vector<float> randn(std::mt19937_64& g, size_t n, float stddev, float mean = 0.f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
MlpWeights random_mlp(std::mt19937_64& g, int64_t H, int64_t I) {
  MlpWeights m;
  m.intermediate = int(I);
  m.gate_up = randn(g, size_t(2 * I * H), 1.0f / std::sqrt(float(H)));
  m.down = randn(g, size_t(H * I), 1.0f / std::sqrt(float(I)));
  return m;
}
}  // namespace

M3Weights random_weights(const M3Config& c, uint64_t seed) {
  std::mt19937_64 g(seed);
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const float s = 1.0f / std::sqrt(float(H));
  M3Weights w;
  w.embed = randn(g, size_t(V * H), 1.0f);
  w.final_norm = randn(g, size_t(H), 0.1f);
  w.lm_head = randn(g, size_t(V * H), s);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights L;
    L.input_norm = randn(g, size_t(H), 0.1f);
    L.post_attn_norm = randn(g, size_t(H), 0.1f);
    L.wqkv = randn(g, size_t((c.num_q_heads + 2 * c.num_kv_heads) * D * H), s);
    L.wo = randn(g, size_t(H * c.num_q_heads * D), 1.0f / std::sqrt(float(c.num_q_heads * D)));
    L.q_norm = randn(g, size_t(D), 0.1f);
    L.k_norm = randn(g, size_t(D), 0.1f);
    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const int64_t Di = c.index_head_dim;
      L.w_index_qk = randn(g, size_t((c.index_num_heads + 1) * Di * H), s);
      L.index_q_norm = randn(g, size_t(Di), 0.1f);
      L.index_k_norm = randn(g, size_t(Di), 0.1f);
    }
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      L.mlp = random_mlp(g, H, c.dense_intermediate_size);
    } else {
      L.router = randn(g, size_t(c.num_experts * H), 3.0f * s);
      L.router_bias = randn(g, size_t(c.num_experts), 0.1f);
      for (int e = 0; e < c.num_experts; ++e) L.experts.push_back(random_mlp(g, H, c.moe_intermediate_size));
      if (c.shared_intermediate_size > 0) L.shared = random_mlp(g, H, c.shared_intermediate_size);
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

std::vector<int32_t> random_ids(int64_t n, int vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(g);
  return ids;
}

std::vector<float> run_chunked(const M3Model& model, const std::vector<int32_t>& ids, int64_t chunk,
                               ForwardTrace* trace) {
  const M3Config& c = model.config();
  const int64_t n = int64_t(ids.size());
  KVCache cache(c, int32_t((n + c.sparse_block_size - 1) / c.sparse_block_size));
  SequenceKV seq(cache);
  seq.reserve(n);
  if (chunk <= 0) chunk = n;
  std::vector<float> logits;
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t len = std::min(chunk, n - s);
    SeqInput in{std::span<const int32_t>(ids.data() + s, size_t(len)), s, seq.pages(), true};
    auto out = model.forward(std::span<const SeqInput>(&in, 1), cache, trace);
    logits.insert(logits.end(), out[0].begin(), out[0].end());
  }
  return logits;
}

void write_checkpoint(const M3Config& c, const M3Weights& w, const std::string& dir,
                      const std::function<bool(int, int)>& keep_expert) {
  std::filesystem::create_directories(dir);
  M3Weights& ww = const_cast<M3Weights&>(w);  // host_slot only locates the array; nothing is written
  SafeTensorsWriter out;
  for (const WeightSlot& s : weight_plan(c)) {
    if (s.expert >= 0 && keep_expert && !keep_expert(s.layer, s.expert)) continue;
    const std::vector<float>& v = host_slot(ww, s);
    size_t at = 0;
    for (const WeightPiece& p : s.pieces) {
      const size_t n = size_t(p.numel());
      out.add_f32(p.names.front(), p.shape, std::vector<float>(v.begin() + int64_t(at), v.begin() + int64_t(at + n)));
      at += n;
    }
  }
  out.write(dir + "/model.safetensors");
}

}  // namespace m3::test
