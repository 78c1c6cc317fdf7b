// Loading options and the weight plan (issue 9 item 5), on the CPU: the load flags parse (and reject bad values),
// --num-layers keeps the config's layer pattern, the weight plan names exactly the text-model tensors of real
// fixture checkpoints, the CPU executor refuses what it cannot run, and the dummy weights are deterministic.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <filesystem>
#include <functional>
#include <set>

#include "base/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/executor_factory.h"
#include "model/load_options.h"
#include "model/weight_plan.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;

std::string fixture(const char* name) { return (fs::path(M3_SOURCE_DIR) / "tests/golden/fixtures" / name).string(); }

LoadOptions parse(const std::string& args) {
  CLI::App app;
  LoadOptions o;
  add_load_flags(app, o);
  app.parse(args, false);
  return o;
}

TEST(LoadFlags, DefaultsAreAutoAllLayersMsa) {
  const LoadOptions o = parse("");
  EXPECT_EQ(o.dtype, LoadDType::Auto);
  EXPECT_EQ(o.load_format, LoadFormat::Auto);
  EXPECT_EQ(o.num_layers, 0);
  EXPECT_EQ(o.attention, LoadAttention::Msa);
  EXPECT_FALSE(o.dummy());
}

TEST(LoadFlags, ParseEveryValue) {
  LoadOptions o = parse("--dtype bfloat16 --load-format dummy --num-layers 5 --attention msa-v1");
  EXPECT_EQ(o.dtype, LoadDType::BFloat16);
  EXPECT_TRUE(o.dummy());
  EXPECT_EQ(o.num_layers, 5);
  EXPECT_EQ(o.attention, LoadAttention::MsaV1);
  o = parse("--dtype float32 --load-format safetensors --attention dense");
  EXPECT_EQ(o.dtype, LoadDType::Float32);
  EXPECT_EQ(o.load_format, LoadFormat::Safetensors);
  EXPECT_EQ(o.attention, LoadAttention::Dense);
  EXPECT_STREQ(name(o.attention), "dense");
}

TEST(LoadFlags, Fp8DtypeParsesAndTheCpuRefusesIt) {
  LoadOptions o = parse("--dtype fp8 --load-format dummy");
  EXPECT_EQ(o.dtype, LoadDType::Fp8);
  EXPECT_STREQ(name(o.dtype), "fp8");
  EXPECT_EQ(o.fp8_prefill_gemm, LoadFp8Gemm::CublasLt);
  EXPECT_EQ(parse("--dtype fp8 --fp8-prefill-gemm w8a16").fp8_prefill_gemm, LoadFp8Gemm::W8A16);
  EXPECT_STREQ(name(LoadFp8Gemm::W8A16), "w8a16");
  EXPECT_THROW(parse("--fp8-prefill-gemm fp16"), CLI::ParseError);
  try {
    check_cpu_load_options(o);
    ADD_FAILURE() << "the CPU executor accepted --dtype fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype fp8 needs --device cuda"), std::string::npos) << e.what();
  }
}

TEST(LoadFlags, KvCacheDtypeParsesAutoFp8AndFp8E4m3) {
  EXPECT_EQ(parse("").kv_cache_dtype, LoadKvDtype::Auto);
  EXPECT_EQ(parse("--kv-cache-dtype auto").kv_cache_dtype, LoadKvDtype::Auto);
  EXPECT_EQ(parse("--kv-cache-dtype fp8").kv_cache_dtype, LoadKvDtype::Fp8);
  EXPECT_EQ(parse("--kv-cache-dtype fp8_e4m3").kv_cache_dtype, LoadKvDtype::Fp8);  // vLLM's alias
  EXPECT_STREQ(name(LoadKvDtype::Fp8), "fp8");
  EXPECT_THROW(parse("--kv-cache-dtype fp8_e5m2"), CLI::ParseError);
  EXPECT_THROW(parse("--kv-cache-dtype bfloat16"), CLI::ParseError);
}

// The combinations fp8 KV cannot run with fail with a message naming the flags, before any weight loads.
TEST(LoadFlags, Fp8KvCacheRefusesFloat32MsaV1AndTheCpu) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  LoadOptions o = parse("--kv-cache-dtype fp8");
  EXPECT_NO_THROW(check_kv_cache_options(o));
  EXPECT_NO_THROW(check_kv_cache_options(parse("--kv-cache-dtype fp8 --dtype fp8 --attention dense")));
  EXPECT_NO_THROW(check_kv_cache_options(parse("--dtype float32 --attention msa-v1")));  // auto KV: unchanged
  EXPECT_NE(message([&] { check_kv_cache_options(parse("--kv-cache-dtype fp8 --dtype float32")); })
                .find("--kv-cache-dtype fp8 does not run with --dtype float32"),
            std::string::npos);
  EXPECT_NE(message([&] { check_kv_cache_options(parse("--kv-cache-dtype fp8 --attention msa-v1")); })
                .find("--kv-cache-dtype fp8 does not run with --attention msa-v1"),
            std::string::npos);
  EXPECT_NE(message([&] { check_cpu_load_options(o); }).find("--kv-cache-dtype fp8 needs --device cuda"),
            std::string::npos);
  const std::string m = message([&] { make_executor(fixture("tiny_sparse_f32"), "cpu", {}, o); });
  EXPECT_NE(m.find("--kv-cache-dtype fp8 needs --device cuda"), std::string::npos) << m;
}

TEST(LoadFlags, BadValuesAreParseErrors) {
  EXPECT_THROW(parse("--dtype float16"), CLI::ParseError);
  EXPECT_THROW(parse("--load-format pt"), CLI::ParseError);
  EXPECT_THROW(parse("--attention sparse"), CLI::ParseError);
  EXPECT_THROW(parse("--num-layers -1"), CLI::ParseError);
  EXPECT_THROW(parse("--num-layers two"), CLI::ParseError);
}

TEST(TruncateLayers, KeepsTheFirstLayersPattern) {
  const M3Config c = load_m3_config(fixture("tiny_sparse_f32") + "/config.json");
  ASSERT_GE(c.num_layers, 4);
  for (int n = 1; n <= c.num_layers; ++n) {
    const M3Config t = truncate_layers(c, n);
    EXPECT_EQ(t.num_layers, n);
    ASSERT_EQ(int(t.attn_kinds.size()), n);
    for (int l = 0; l < n; ++l) {
      EXPECT_EQ(t.attn_kinds[size_t(l)], c.attn_kinds[size_t(l)]) << l;
      EXPECT_EQ(t.mlp_kinds[size_t(l)], c.mlp_kinds[size_t(l)]) << l;
    }
    EXPECT_EQ(t.vocab_size, c.vocab_size);
    EXPECT_EQ(t.hidden_size, c.hidden_size);
  }
}

TEST(TruncateLayers, RejectsOutOfRangeWithAClearMessage) {
  const M3Config c = load_m3_config(fixture("tiny_sparse_f32") + "/config.json");
  try {
    truncate_layers(c, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--num-layers must be at least 1"), std::string::npos) << e.what();
  }
  try {
    truncate_layers(c, c.num_layers + 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the model's"), std::string::npos) << e.what();
  }
}

// Every text-model tensor of the checkpoint is in the plan with its shape, and every planned tensor is present
// (lm_head excepted when tied). Scales of MXFP8 weights travel with their weight, so they are not planned.
void expect_plan_matches(const char* name) {
  SCOPED_TRACE(name);
  const M3Config c = load_m3_config(fixture(name) + "/config.json");
  const SafeTensors st = SafeTensors::open(fixture(name));
  std::set<std::string> planned;
  for (const WeightSlot& s : weight_plan(c))
    for (const WeightPiece& p : s.pieces) {
      const std::string n = resolve_name(st, p);
      if (s.kind == SlotKind::LmHead && s.may_tie_to_embed && !st.has(n)) continue;
      ASSERT_TRUE(st.has(n)) << n;
      EXPECT_EQ(st.get(n).shape, p.shape) << n;
      EXPECT_TRUE(planned.insert(n).second) << n << " planned twice";
    }
  for (const std::string& n : st.names()) {
    const bool text = n.rfind("model.", 0) == 0 || n.rfind("lm_head.", 0) == 0;
    if (!text || (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0)) continue;
    EXPECT_TRUE(planned.count(n)) << n << " is in the checkpoint but not in the weight plan";
  }
}

TEST(WeightPlan, MatchesTheFixtureCheckpoints) {
  expect_plan_matches("tiny_sparse_f32");
  expect_plan_matches("tiny_sparse_mxfp8");
  expect_plan_matches("tiny_hf_layout");
}

TEST(WeightPlan, TruncatedPlanIsAPrefixAndBytesAddUp) {
  const M3Config c = load_m3_config(fixture("tiny_sparse_f32") + "/config.json");
  const auto full = weight_plan(c), two = weight_plan(truncate_layers(c, 2));
  ASSERT_LT(two.size(), full.size());
  for (size_t i = 0; i < two.size(); ++i) EXPECT_EQ(two[i].label(), full[i].label());
  int64_t elems = 0;
  for (const auto& s : full) elems += s.numel();
  EXPECT_EQ(plan_bytes(full, 4), elems * 4);
  EXPECT_LT(plan_bytes(full, 2), plan_bytes(full, 4));
}

TEST(DummyWeights, DeterministicPerSeedAndPrefixOfTheFullModel) {
  const M3Config c = load_m3_config(fixture("tiny_sparse_f32") + "/config.json");
  const M3Weights a = dummy_weights(c, 7), b = dummy_weights(c, 7), other = dummy_weights(c, 8);
  EXPECT_EQ(a.embed, b.embed);
  EXPECT_EQ(a.layers.back().experts.back().down, b.layers.back().experts.back().down);
  EXPECT_NE(a.embed, other.embed);
  EXPECT_NE(a.layers[0].wqkv, a.layers[1].wqkv);  // per-slot streams differ
  const M3Weights t = dummy_weights(truncate_layers(c, 2), 7);
  EXPECT_EQ(t.layers[1].wqkv, a.layers[1].wqkv);
  EXPECT_EQ(t.lm_head, a.lm_head);
  float lo = 0, hi = 0;
  for (float v : a.embed) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GE(lo, -1.f);
  EXPECT_LT(hi, 1.f);
  EXPECT_LT(lo, -0.9f);
  EXPECT_GT(hi, 0.9f);
}

TEST(CpuLoad, RefusesBfloat16AndOtherAttention) {
  LoadOptions o;
  o.dtype = LoadDType::BFloat16;
  try {
    make_executor(fixture("tiny_sparse_f32"), "cpu", {}, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype bfloat16 needs --device cuda"), std::string::npos) << e.what();
  }
  o = {};
  o.attention = LoadAttention::Dense;
  EXPECT_THROW(make_executor(fixture("tiny_sparse_f32"), "cpu", {}, o), Error);
  o = {};
  o.num_layers = 99;
  EXPECT_THROW(make_executor(fixture("tiny_sparse_f32"), "cpu", {}, o), Error);
}

TEST(CpuLoad, DummyAndTruncatedModelsRun) {
  LoadOptions o;
  o.load_format = LoadFormat::Dummy;
  o.num_layers = 4;
  o.dtype = LoadDType::Float32;
  auto ex = make_executor(fixture("tiny_sparse_f32"), "cpu", KvBudget{0, 64}, o);
  EXPECT_EQ(ex->config().num_layers, 4);
  o = {};
  o.num_layers = 2;
  auto ex2 = make_executor(fixture("tiny_sparse_f32"), "cpu", KvBudget{0, 64}, o);
  EXPECT_EQ(ex2->config().num_layers, 2);
}

}  // namespace
}  // namespace m3
