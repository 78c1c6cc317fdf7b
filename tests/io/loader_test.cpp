// Loading: config layouts (released VL, text-only, HF flat), safetensors (single, sharded, dtypes, MXFP8),
// name spellings, and clear errors naming the tensor and file for every malformed input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "test_model_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace m3 {
namespace {

class TempDir {
 public:
  TempDir() {
    static int n = 0;
    path_ = fs::temp_directory_path() / fmt::format("m3_loader_test_{}_{}", ::getpid(), n++);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& f) const { return (path_ / f).string(); }

 private:
  fs::path path_;
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

json text_config_json(const M3Config& c) {
  json flags_attn = json::array(), flags_moe = json::array();
  for (int l = 0; l < c.num_layers; ++l) {
    flags_attn.push_back(c.attn_kinds[l] == AttnKind::Sparse ? 1 : 0);
    flags_moe.push_back(c.mlp_kinds[l] == MlpKind::MoE ? 1 : 0);
  }
  return {{"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_layers},
          {"num_attention_heads", c.num_q_heads},
          {"num_key_value_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rms_norm_eps", 1e-6},
          {"use_gemma_norm", true},
          {"rope_theta", c.rope_theta},
          {"rotary_dim", c.rotary_dim},
          {"hidden_act", "swigluoai"},
          {"dense_intermediate_size", c.dense_intermediate_size},
          {"intermediate_size", c.moe_intermediate_size},
          {"shared_intermediate_size", c.shared_intermediate_size},
          {"num_local_experts", c.num_experts},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"scoring_func", "sigmoid"},
          {"use_routing_bias", true},
          {"routed_scaling_factor", c.routed_scaling_factor},
          {"moe_layer_freq", flags_moe},
          {"sparse_attention_config",
           {{"use_sparse_attention", true},
            {"sparse_attention_freq", flags_attn},
            {"sparse_num_index_heads", c.index_num_heads},
            {"sparse_index_dim", c.index_head_dim},
            {"sparse_block_size", c.sparse_block_size},
            {"sparse_topk_blocks", c.sparse_topk_blocks},
            {"sparse_score_type", "max"},
            {"sparse_init_block", 0},
            {"sparse_local_block", 1},
            {"sparse_disable_index_value", flags_attn}}}};
}

json vl_config_json(const M3Config& c) {
  return {{"architectures", {"MiniMaxM3SparseForConditionalGeneration"}},
          {"model_type", "minimax_m3_vl"},
          {"text_config", text_config_json(c)},
          {"vision_config", {{"hidden_size", 32}}}};
}

// Writes weights under released names ("language_model." prefix); dense MLPs as mlp.* or block_sparse_moe.*.
void write_weights(SafeTensorsWriter& w, const M3Config& c, const M3Weights& W, bool hf_dense_spelling = false) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, const float* p) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    w.add_f32("language_model." + name, shape, std::vector<float>(p, p + n));
  };
  add("model.embed_tokens.weight", {c.vocab_size, H}, W.embed.data());
  add("model.norm.weight", {H}, W.final_norm.data());
  w.add_f32("language_model.lm_head.weight", {c.vocab_size, H}, W.lm_head);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = W.layers[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {H}, L.input_norm.data());
    add(p + "post_attention_layernorm.weight", {H}, L.post_attn_norm.data());
    const int64_t q = c.num_q_heads * D, kv = c.num_kv_heads * D;
    add(p + "self_attn.q_proj.weight", {q, H}, L.wqkv.data());
    add(p + "self_attn.k_proj.weight", {kv, H}, L.wqkv.data() + q * H);
    add(p + "self_attn.v_proj.weight", {kv, H}, L.wqkv.data() + (q + kv) * H);
    add(p + "self_attn.o_proj.weight", {H, q}, L.wo.data());
    add(p + "self_attn.q_norm.weight", {D}, L.q_norm.data());
    add(p + "self_attn.k_norm.weight", {D}, L.k_norm.data());
    if (c.attn_kinds[l] == AttnKind::Sparse) {
      const int64_t Di = c.index_head_dim, iq = c.index_num_heads * Di;
      add(p + "self_attn.index_q_proj.weight", {iq, H}, L.w_index_qk.data());
      add(p + "self_attn.index_k_proj.weight", {Di, H}, L.w_index_qk.data() + iq * H);
      add(p + "self_attn.index_q_norm.weight", {Di}, L.index_q_norm.data());
      add(p + "self_attn.index_k_norm.weight", {Di}, L.index_k_norm.data());
    }
    auto add_mlp = [&](const std::string& pre, const char* g, const char* u, const char* d, const MlpWeights& m) {
      const int64_t I = m.intermediate;
      add(pre + g + ".weight", {I, H}, m.gate_up.data());
      add(pre + u + ".weight", {I, H}, m.gate_up.data() + I * H);
      add(pre + d + ".weight", {H, I}, m.down.data());
    };
    if (c.mlp_kinds[l] == MlpKind::Dense) {
      add_mlp(p + (hf_dense_spelling ? "block_sparse_moe." : "mlp."), "gate_proj", "up_proj", "down_proj", L.mlp);
    } else {
      add(p + "block_sparse_moe.gate.weight", {c.num_experts, H}, L.router.data());
      add(p + "block_sparse_moe.e_score_correction_bias", {c.num_experts}, L.router_bias.data());
      for (int e = 0; e < c.num_experts; ++e)
        add_mlp(fmt::format("{}block_sparse_moe.experts.{}.", p, e), "w1", "w3", "w2", L.experts[e]);
      add_mlp(p + "block_sparse_moe.shared_experts.", "gate_proj", "up_proj", "down_proj", L.shared);
    }
  }
}

TEST(Config, ReleasedVlLayoutGivesLayerKindsAndMsaParameters) {
  M3Config want = test::tiny_config();
  M3Config got = parse_m3_config(vl_config_json(want).dump());
  EXPECT_EQ(got.attn_kinds, want.attn_kinds);
  EXPECT_EQ(got.mlp_kinds, want.mlp_kinds);
  EXPECT_EQ(got.sparse_block_size, 16);
  EXPECT_EQ(got.sparse_topk_blocks, 4);
  EXPECT_EQ(got.index_num_heads, 2);
  EXPECT_EQ(got.rotary_dim, 8);
  EXPECT_FLOAT_EQ(got.routed_scaling_factor, 2.0f);
}

TEST(Config, TextOnlyLayoutIsAccepted) {
  M3Config want = test::tiny_config();
  M3Config got = parse_m3_config(text_config_json(want).dump());
  EXPECT_EQ(got.attn_kinds, want.attn_kinds);
  EXPECT_EQ(got.num_experts, 8);
}

TEST(Config, HfFlatLayoutWithLayerTypesAndRopeParameters) {
  json t = text_config_json(test::tiny_config());
  for (const char* k : {"sparse_attention_config", "moe_layer_freq", "rope_theta", "rotary_dim"}) t.erase(k);
  t["layer_types"] = {"full_attention", "full_attention", "full_attention", "minimax_m3_sparse", "minimax_m3_sparse"};
  t["mlp_layer_types"] = {"dense", "dense", "dense", "sparse", "sparse"};
  t["index_n_heads"] = 2;
  t["index_head_dim"] = 16;
  t["index_block_size"] = 16;
  t["index_topk_blocks"] = 4;
  t["index_local_blocks"] = 1;
  t["rope_parameters"] = {{"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}, {"rope_type", "default"}};
  M3Config got = parse_m3_config(json{{"text_config", t}}.dump());
  EXPECT_EQ(got.attn_kinds, test::tiny_config().attn_kinds);
  EXPECT_EQ(got.mlp_kinds, test::tiny_config().mlp_kinds);
  EXPECT_EQ(got.rotary_dim, 8);
  EXPECT_DOUBLE_EQ(got.rope_theta, 10000.0);
  EXPECT_EQ(got.sparse_topk_blocks, 4);
}

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> needles) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Config, ErrorsNameTheKey) {
  expect_error([] { parse_m3_config("{not json", "cfg.json"); }, {"cfg.json", "invalid JSON"});
  json t = text_config_json(test::tiny_config());
  t.erase("vocab_size");
  expect_error([&] { parse_m3_config(t.dump()); }, {"vocab_size"});
  t = text_config_json(test::tiny_config());
  t["moe_layer_freq"] = {0, 1};
  expect_error([&] { parse_m3_config(t.dump()); }, {"moe_layer_freq", "2 entries"});
  t = text_config_json(test::tiny_config());
  t["hidden_size"] = "wide";
  expect_error([&] { parse_m3_config(t.dump()); }, {"hidden_size", "wrong type"});
  t = text_config_json(test::tiny_config());
  t["sparse_attention_config"]["sparse_num_index_heads"] = 3;
  expect_error([&] { parse_m3_config(t.dump()); }, {"sparse_num_index_heads"});
  t = text_config_json(test::tiny_config());
  t["partial_rotary_factor"] = 0.25;  // head_dim 16 · 0.25 = 4, but rotary_dim says 8
  expect_error([&] { parse_m3_config(t.dump()); }, {"rotary_dim", "contradicts"});
}

class Checkpoint : public ::testing::Test {
 protected:
  M3Config cfg = test::tiny_config();
  M3Weights weights = test::random_weights(cfg, 11);
  TempDir dir;
  void write(bool hf_dense_spelling = false) {
    write_text(dir.file("config.json"), vl_config_json(cfg).dump());
    SafeTensorsWriter w;
    write_weights(w, cfg, weights, hf_dense_spelling);
    w.write(dir.file("model.safetensors"));
  }
};

TEST_F(Checkpoint, LoadedModelGivesTheSameLogitsAsTheInMemoryOne) {
  write();
  M3Model loaded = M3Model::load(dir.str());
  M3Model mem(cfg, weights);
  auto ids = test::random_ids(70, cfg.vocab_size, 1);
  EXPECT_EQ(test::run_chunked(loaded, ids, 0), test::run_chunked(mem, ids, 0));
}

TEST_F(Checkpoint, HfDenseMlpSpellingLoadsToo) {
  write(/*hf_dense_spelling=*/true);
  M3Model loaded = M3Model::load(dir.str());
  M3Model mem(cfg, weights);
  auto ids = test::random_ids(20, cfg.vocab_size, 2);
  EXPECT_EQ(test::run_chunked(loaded, ids, 0), test::run_chunked(mem, ids, 0));
}

TEST_F(Checkpoint, ShardedIndexIsFollowed) {
  write_text(dir.file("config.json"), vl_config_json(cfg).dump());
  SafeTensorsWriter all;
  write_weights(all, cfg, weights);
  // Re-split: layers 0-1 and everything else into two shards.
  SafeTensors st = SafeTensors::open(([&] {
    all.write(dir.file("tmp.safetensors"));
    return dir.file("tmp.safetensors");
  })());
  SafeTensorsWriter a, b;
  json map = json::object();
  for (const auto& name : st.names()) {
    const TensorRef& t = st.get(name);
    const bool first = name.find("layers.0.") != std::string::npos || name.find("layers.1.") != std::string::npos;
    std::string raw = name.rfind("lm_head", 0) == 0 ? "language_model." + name : "language_model." + name;
    (first ? a : b).add(raw, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    map[raw] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  a.write(dir.file("model-00001-of-00002.safetensors"));
  b.write(dir.file("model-00002-of-00002.safetensors"));
  fs::remove(dir.file("tmp.safetensors"));
  write_text(dir.file("model.safetensors.index.json"), json{{"weight_map", map}}.dump());
  M3Model loaded = M3Model::load(dir.str());
  M3Model mem(cfg, weights);
  auto ids = test::random_ids(20, cfg.vocab_size, 3);
  EXPECT_EQ(test::run_chunked(loaded, ids, 0), test::run_chunked(mem, ids, 0));
}

TEST_F(Checkpoint, MissingTensorIsNamed) {
  write_text(dir.file("config.json"), vl_config_json(cfg).dump());
  SafeTensorsWriter w;
  write_weights(w, cfg, weights);
  w.write(dir.file("model.safetensors"));
  // Same weights with one layer's k_norm dropped.
  SafeTensors st = SafeTensors::open(dir.file("model.safetensors"));
  SafeTensorsWriter w2;
  for (const auto& name : st.names()) {
    if (name == "model.layers.4.self_attn.k_norm.weight") continue;
    const TensorRef& t = st.get(name);
    w2.add(name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  w2.write(dir.file("model2.safetensors"));
  fs::rename(dir.file("model2.safetensors"), dir.file("model.safetensors"));
  expect_error([&] { M3Model::load(dir.str()); }, {"model.layers.4.self_attn.k_norm.weight", "missing"});
}

TEST_F(Checkpoint, MisShapedTensorNamesTensorFileAndShapes) {
  M3Weights bad = weights;
  cfg.hidden_size = 64;
  write();
  M3Config wrong = cfg;
  wrong.dense_intermediate_size = 100;  // checkpoint says 96
  json j = vl_config_json(wrong);
  write_text(dir.file("config.json"), j.dump());
  expect_error([&] { M3Model::load(dir.str()); }, {"model.layers.0.mlp.gate_proj.weight", "model.safetensors", "[96, 64]", "[100, 64]"});
}

TEST(SafeTensors, MalformedFilesGiveErrorsNotCrashes) {
  TempDir d;
  const std::string f = d.file("x.safetensors");
  auto write_raw = [&](const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
    std::ofstream o(f, std::ios::binary | std::ios::trunc);
    uint64_t n = claimed_len ? claimed_len : header.size();
    o.write(reinterpret_cast<const char*>(&n), 8);
    o << header << std::string(data_bytes, '\0');
  };
  write_raw("", 0, 1ull << 40);
  expect_error([&] { SafeTensors::open(f); }, {"x.safetensors", "header length"});
  write_raw("{bad", 0);
  expect_error([&] { SafeTensors::open(f); }, {"not valid JSON"});
  write_raw(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}})", 2);
  expect_error([&] { SafeTensors::open(f); }, {"'w'", "unsupported dtype"});
  write_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_error([&] { SafeTensors::open(f); }, {"'w'", "outside"});
  write_raw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
  expect_error([&] { SafeTensors::open(f); }, {"'w'", "shape"});
  write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  expect_error([&] { SafeTensors::open(f); }, {"overlap"});
  std::ofstream(f, std::ios::binary | std::ios::trunc) << "abc";
  expect_error([&] { SafeTensors::open(f); }, {"too small"});
  expect_error([&] { SafeTensors::open(d.file("nope.safetensors")); }, {"nope.safetensors"});
}

TEST(SafeTensors, Mxfp8WeightsDequantiseWithUe8m0BlockScales) {
  TempDir d;
  const int rows = 3, cols = 64;  // two 32-wide blocks per row
  std::mt19937 g(5);
  std::uniform_int_distribution<int> code(0, 0x7e), sgn(0, 1), sc(110, 135);
  std::vector<uint8_t> q(rows * cols), s(rows * 2);
  for (auto& v : q) v = uint8_t(code(g) | (sgn(g) << 7));
  for (auto& v : s) v = uint8_t(sc(g));
  SafeTensorsWriter w;
  w.add("language_model.model.layers.0.self_attn.q_proj.weight", DType::F8_E4M3, {rows, cols}, q);
  w.add("language_model.model.layers.0.self_attn.q_proj.weight_scale_inv", DType::U8, {rows, 2}, s);
  w.add("language_model.model.layers.0.self_attn.k_proj.weight", DType::F8_E4M3, {rows, cols}, q);
  w.write(d.file("m.safetensors"));
  SafeTensors st = SafeTensors::open(d.file("m.safetensors"));
  auto v = st.read_f32("model.layers.0.self_attn.q_proj.weight", {rows, cols});
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(v[r * cols + c], e4m3_to_f32(q[r * cols + c]) * std::ldexp(1.f, s[r * 2 + c / 32] - 127));
  expect_error([&] { st.read_f32("model.layers.0.self_attn.k_proj.weight", {rows, cols}); },
               {"k_proj.weight_scale_inv", "missing"});
}

TEST(SafeTensors, NamesAreNormalisedFromReleasedPrefixes) {
  EXPECT_EQ(normalise_tensor_name("language_model.model.layers.3.x"), "model.layers.3.x");
  EXPECT_EQ(normalise_tensor_name("language_model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(normalise_tensor_name("model.language_model.layers.0.y"), "model.layers.0.y");
  EXPECT_EQ(normalise_tensor_name("model.layers.0.y"), "model.layers.0.y");
  EXPECT_EQ(normalise_tensor_name("vision_tower.vision_model.z"), "vision_tower.vision_model.z");
}

}  // namespace
}  // namespace m3
