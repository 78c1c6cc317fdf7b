// The GPU sampler (backend/cuda/sampling.cuh) against the CPU sampler (engine/sampler.cpp), which is its definition:
// greedy ties, seeded top-k / top-p / min-p / temperature draws token for token over many seeds, on peaked rows (the
// shared-memory path) and flat rows (the radix-select path), penalties / logit_bias / min_tokens bit for bit on the
// adjusted logits, logprobs within fp tolerance, and the engine generating the same seeded tokens on both devices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/sampling.cuh"
#include "engine/engine.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "io/safetensors.h"
#include "model/cuda_executor.h"
#include "model/device_sampling.h"
#include "model/m3_model.h"

namespace m3 {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

constexpr int kVocab = 200064;

struct Rows {
  std::vector<GenerationParams> params;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int> prompt_len;
  std::vector<uint64_t> seeds;
  std::vector<RowSampling> view() const {
    std::vector<RowSampling> v(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      v[i].params = &params[i];
      v[i].tokens = tokens[i];
      v[i].prompt_len = prompt_len[i];
      v[i].seed = seeds[i];
      v[i].eos_token_id = 7;
    }
    return v;
  }
};

// Runs both samplers on the same logits [R, V]; returns {gpu, cpu} and leaves the GPU-adjusted logits in *adj.
struct Both {
  std::vector<SampledToken> gpu, cpu;
  std::vector<float> gpu_adjusted, cpu_adjusted;
};
Both run_both(cuda::DeviceSampler& ds, const std::vector<float>& lg, int V, const Rows& rows) {
  const std::vector<RowSampling> view = rows.view();
  const int R = int(view.size());
  cuda::DeviceBuffer<float> d(lg.size());
  M3_CUDA_CHECK(cudaMemcpy(d.get(), lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lrows(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) lrows[size_t(r)] = r;
  Both b;
  enqueue_device_sampling(ds, d.get(), V, view, lrows, nullptr);
  b.gpu = finish_device_sampling(ds, view, nullptr);
  b.gpu_adjusted.resize(lg.size());
  M3_CUDA_CHECK(cudaMemcpy(b.gpu_adjusted.data(), d.get(), lg.size() * 4, cudaMemcpyDeviceToHost));
  b.cpu_adjusted = lg;
  for (int r = 0; r < R; ++r)
    b.cpu.push_back(sample_row(std::span<float>(b.cpu_adjusted).subspan(size_t(r) * V, size_t(V)), view[size_t(r)]));
  return b;
}

std::mt19937_64& gen() {
  static std::mt19937_64 g(20261201);
  return g;
}

// Peaked: a few dozen tokens within reach of the top (the shared path). Flat: every token within reach (select).
std::vector<float> logits_rows(int R, int V, float scale, float quantum = 0.f) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> v(size_t(R) * V);
  for (auto& x : v) {
    x = n(gen()) * scale;
    if (quantum > 0.f) x = std::round(x / quantum) * quantum;  // many exact ties: the id order decides
  }
  return v;
}

Rows sampling_rows(int R, uint64_t seed0, float temperature, float top_p, int top_k, float min_p) {
  Rows rows;
  for (int r = 0; r < R; ++r) {
    GenerationParams g;
    g.sampling.temperature = temperature;
    g.sampling.top_p = top_p;
    g.sampling.top_k = top_k;
    g.sampling.min_p = min_p;
    rows.params.push_back(g);
    rows.tokens.push_back({1, 2, 3, int32_t(r % 5)});
    rows.prompt_len.push_back(3);
    rows.seeds.push_back(seed0 + uint64_t(r) * 7919);
  }
  return rows;
}

int count_equal(const Both& b) {
  int eq = 0;
  for (size_t i = 0; i < b.gpu.size(); ++i) eq += b.gpu[i].id == b.cpu[i].id;
  return eq;
}

TEST(GpuSampling, GreedyEqualsTheCpuArgmaxWithTiesToTheLowerId) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  const int R = 8, V = kVocab;
  std::vector<float> lg = logits_rows(R, V, 3.f);
  for (int r = 0; r < R; ++r) {
    float* row = lg.data() + size_t(r) * V;
    const int a = 1000 + 17 * r, b = a + 5000 * (r + 1) % (V - a);
    row[a] = row[b] = 50.f;  // a tie at the top: the lower id wins
  }
  std::vector<float>& z = lg;  // row 7: all zeros of both signs, the lowest id wins
  for (int i = 0; i < V; ++i) z[size_t(7) * V + size_t(i)] = (i % 2) ? -0.f : 0.f;
  Rows rows = sampling_rows(R, 1, 0.f, 1.f, -1, 0.f);
  rows.params[3].sampling.temperature = 1.f, rows.params[3].sampling.top_k = 1;  // top_k 1 is greedy too
  const Both b = run_both(ds, lg, V, rows);
  for (int r = 0; r < R; ++r) EXPECT_EQ(b.gpu[size_t(r)].id, b.cpu[size_t(r)].id) << "row " << r;
  EXPECT_EQ(b.gpu[7].id, 0);
}

struct Case {
  const char* name;
  float scale, quantum, temperature, top_p;
  int top_k;
  float min_p;
};

TEST(GpuSampling, SeededDrawsEqualTheCpuSamplerTokenForToken) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  // Scale 25: ~100 tokens within reach of the top (x ≥ −28: shared memory, rank by counting); 14: ~1,500 (shared
  // memory, block radix sort); 4 (LM-like) and 0.3 (flat): most of the row (radix select over global memory).
  const Case cases[] = {
      {"peaked top_p 0.9", 25.f, 0.f, 1.f, 0.9f, -1, 0.f},
      {"peaked plain T 0.7", 25.f, 0.f, 0.7f, 1.f, -1, 0.f},
      {"peaked top_k 40 top_p 0.95", 25.f, 0.f, 1.f, 0.95f, 40, 0.f},
      {"peaked min_p 0.05", 25.f, 0.f, 1.f, 1.f, -1, 0.05f},
      {"peaked ties (quantum 2)", 25.f, 2.f, 1.f, 0.8f, -1, 0.f},
      {"medium top_p 0.97", 14.f, 0.f, 1.f, 0.97f, -1, 0.f},
      {"medium top_k 1000 T 1.5", 14.f, 0.f, 1.5f, 1.f, 1000, 0.f},
      {"lm-like top_p 0.9", 4.f, 0.f, 1.f, 0.9f, -1, 0.f},
      {"lm-like top_k 50 T 0.8", 4.f, 0.f, 0.8f, 1.f, 50, 0.f},
      {"flat top_p 0.9", 0.3f, 0.f, 1.f, 0.9f, -1, 0.f},
      {"flat plain T 1.3", 0.3f, 0.f, 1.3f, 1.f, -1, 0.f},
      {"flat top_k 6000", 0.3f, 0.f, 1.f, 1.f, 6000, 0.f},
      {"flat top_k 3000 top_p 0.5", 0.3f, 0.f, 1.f, 0.5f, 3000, 0.f},
      {"flat min_p 0.5 top_p 0.7", 0.5f, 0.f, 1.f, 0.7f, -1, 0.5f},
      {"flat ties (quantum 0.25)", 0.3f, 0.25f, 1.f, 0.6f, -1, 0.f},
  };
  const int R = 48, V = kVocab;
  uint64_t seed = 11;
  for (const Case& c : cases) {
    const std::vector<float> lg = logits_rows(R, V, c.scale, c.quantum);
    const Rows rows = sampling_rows(R, seed += 1000, c.temperature, c.top_p, c.top_k, c.min_p);
    const Both b = run_both(ds, lg, V, rows);
    const int eq = count_equal(b);
    std::printf("[gpu-sampling] %-30s %d/%d rows equal\n", c.name, eq, R);
    EXPECT_EQ(eq, R) << c.name;
  }
}

TEST(GpuSampling, AFlatRowOfEqualLogitsDrawsByIdOrderOnBothDevices) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  const int R = 16, V = kVocab;
  std::vector<float> lg(size_t(R) * V, 1.25f);
  const Rows rows = sampling_rows(R, 5, 1.f, 0.5f, -1, 0.f);
  const Both b = run_both(ds, lg, V, rows);
  EXPECT_EQ(count_equal(b), R);
  for (int r = 0; r < R; ++r) EXPECT_LT(b.gpu[size_t(r)].id, V / 2 + 1);  // top_p 0.5 of equal weights: lower half
}

TEST(GpuSampling, PenaltiesBiasAndMinTokensAdjustTheLogitsBitForBit) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  const int R = 6, V = kVocab;
  const std::vector<float> lg = logits_rows(R, V, 2.f);
  Rows rows = sampling_rows(R, 99, 0.8f, 0.95f, -1, 0.f);
  std::uniform_int_distribution<int32_t> tok(0, 300);
  for (int r = 0; r < R; ++r) {
    auto& t = rows.tokens[size_t(r)];
    t.clear();
    for (int i = 0; i < 400; ++i) t.push_back(tok(gen()));  // repeats on purpose
    rows.prompt_len[size_t(r)] = 150;
  }
  rows.params[0].repetition_penalty = 1.3f;
  rows.params[1].presence_penalty = 0.7f, rows.params[1].frequency_penalty = 0.35f;
  rows.params[2].repetition_penalty = 0.8f, rows.params[2].frequency_penalty = -0.5f;
  rows.params[3].logit_bias = {{5, 3.5f}, {12, -100.f}, {5, 0.25f}, {199000, 7.f}};
  rows.params[4].min_tokens = 1000, rows.params[4].stop_token_ids = {3, 44};
  rows.params[4].sampling.temperature = 0.f;
  rows.params[5].min_tokens = 1000, rows.params[5].ignore_eos = true, rows.params[5].repetition_penalty = 1.1f;
  rows.params[5].presence_penalty = 0.2f;
  const Both b = run_both(ds, lg, V, rows);
  size_t diff = 0;
  for (size_t i = 0; i < lg.size(); ++i)
    diff += std::memcmp(&b.gpu_adjusted[i], &b.cpu_adjusted[i], 4) != 0;
  EXPECT_EQ(diff, 0u) << "adjusted logits differ";
  EXPECT_EQ(count_equal(b), R);
  EXPECT_TRUE(std::isinf(b.gpu_adjusted[size_t(4) * V + 7]));   // EOS masked before min_tokens
  EXPECT_FALSE(std::isinf(b.gpu_adjusted[size_t(5) * V + 7]));  // ignore_eos keeps it
}

// Constrained decoding (issue 14 item 2): the grammar bitmask goes up with the staging and masks on the device;
// adjusted logits bit for bit and the chosen ids equal the CPU sampler's, and every chosen id is allowed.
TEST(GpuSampling, GrammarBitmaskMasksOnTheDeviceLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  const int R = 5, V = kVocab, W = (V + 31) / 32;
  const std::vector<float> lg = logits_rows(R, V, 3.f);
  Rows rows = sampling_rows(R, 4242, 0.9f, 0.95f, 40, 0.f);
  rows.params[1].sampling.temperature = 0.f;
  rows.params[3].repetition_penalty = 1.2f, rows.params[3].logit_bias = {{150, 5.f}, {151, 50.f}};
  std::vector<std::vector<uint32_t>> masks(size_t(R), std::vector<uint32_t>(size_t(W), 0u));
  auto allow = [&](int r, int id) { masks[size_t(r)][size_t(id) >> 5] |= 1u << (id & 31); };
  for (int id : {3, 7, 70000, 200063}) allow(0, id);                         // a handful, as after a '{'
  std::bernoulli_distribution half(0.5);
  for (int id = 0; id < V; ++id) if (half(gen())) allow(1, id);             // dense, as inside a string
  for (int id = 100; id <= 200; ++id) allow(3, id);                          // a range; bias favours 151
  allow(4, 7);                                                               // only EOS: a finished document
  std::vector<RowSampling> view = rows.view();
  for (int r = 0; r < R; ++r) if (r != 2) view[size_t(r)].allowed = masks[size_t(r)].data();
  cuda::DeviceBuffer<float> d(lg.size());
  M3_CUDA_CHECK(cudaMemcpy(d.get(), lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lrows(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) lrows[size_t(r)] = r;
  enqueue_device_sampling(ds, d.get(), V, view, lrows, nullptr);
  const std::vector<SampledToken> gpu = finish_device_sampling(ds, view, nullptr);
  std::vector<float> gpu_adj(lg.size());
  M3_CUDA_CHECK(cudaMemcpy(gpu_adj.data(), d.get(), lg.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<float> cpu_adj = lg;
  for (int r = 0; r < R; ++r) {
    const SampledToken c = sample_row(std::span<float>(cpu_adj).subspan(size_t(r) * V, size_t(V)), view[size_t(r)]);
    EXPECT_EQ(gpu[size_t(r)].id, c.id) << "row " << r;
    if (r != 2) {
      const int id = gpu[size_t(r)].id;
      EXPECT_TRUE((masks[size_t(r)][size_t(id) >> 5] >> (id & 31)) & 1u) << "row " << r << " chose " << id;
    }
  }
  size_t diff = 0;
  for (size_t i = 0; i < lg.size(); ++i) diff += std::memcmp(&gpu_adj[i], &cpu_adj[i], 4) != 0;
  EXPECT_EQ(diff, 0u) << "adjusted logits differ";
  EXPECT_EQ(gpu[4].id, 7);
  EXPECT_EQ(gpu[3].id, 151);  // the bias wins inside the allowed range
}

TEST(GpuSampling, LogprobsOfTheRawLogitsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  const int R = 5, V = kVocab;
  const std::vector<float> lg = logits_rows(R, V, 3.f);
  Rows rows = sampling_rows(R, 3, 1.f, 0.9f, -1, 0.f);
  rows.params[0].top_logprobs = 0;
  rows.params[1].top_logprobs = 5;
  rows.params[2].top_logprobs = 20, rows.params[2].repetition_penalty = 1.5f;  // logprobs stay on the raw logits
  rows.params[3].sampling.temperature = 0.f, rows.params[3].top_logprobs = 3;
  const Both b = run_both(ds, lg, V, rows);
  EXPECT_EQ(count_equal(b), R);
  for (int r = 0; r < R; ++r) {
    const auto& g = b.gpu[size_t(r)].logprob;
    const auto& c = b.cpu[size_t(r)].logprob;
    ASSERT_EQ(g.has_value(), c.has_value()) << r;
    if (!g) continue;
    EXPECT_NEAR(g->logprob, c->logprob, 1e-4f) << r;
    ASSERT_EQ(g->top.size(), c->top.size()) << r;
    for (size_t j = 0; j < g->top.size(); ++j) {
      EXPECT_EQ(g->top[j].first, c->top[j].first) << r << " top " << j;
      EXPECT_NEAR(g->top[j].second, c->top[j].second, 1e-4f) << r << " top " << j;
    }
  }
}

TEST(GpuSampling, RowsWithoutParamsAndLogitRowMapping) {
  SKIP_WITHOUT_GPU();
  cuda::DeviceSampler ds;
  const int V = 1000;  // a small vocabulary and an unaligned row length path (V % 4 = 0, but rows reordered)
  const std::vector<float> lg = logits_rows(3, V, 2.f);
  Rows rows = sampling_rows(2, 1, 0.f, 1.f, -1, 0.f);
  std::vector<RowSampling> view = rows.view();
  view.insert(view.begin(), RowSampling{});  // a row that needs no token
  cuda::DeviceBuffer<float> d(lg.size());
  M3_CUDA_CHECK(cudaMemcpy(d.get(), lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> lrows = {0, 2, 1};
  enqueue_device_sampling(ds, d.get(), V, view, lrows, nullptr);
  const std::vector<SampledToken> got = finish_device_sampling(ds, view, nullptr);
  EXPECT_EQ(got[0].id, -1);
  EXPECT_EQ(got[1].id, argmax(std::span<const float>(lg).subspan(2 * V, V)));
  EXPECT_EQ(got[2].id, argmax(std::span<const float>(lg).subspan(1 * V, V)));
}

TEST(GpuSampling, SeededEngineGenerationOnTheGpuEqualsTheCpuEngine) {
  if (!CudaExecutor::available()) GTEST_SKIP() << "no CUDA device";
  const std::string fx = std::string(M3_SOURCE_DIR) + "/tests/golden/fixtures/tiny_sparse_f32";
  const M3Config cfg = load_m3_config(fx + "/config.json");
  SafeTensors st = SafeTensors::open(fx);
  const M3Weights w = M3Weights::load(cfg, st);
  M3Model cpu(cfg, w);
  CudaExecutorOptions opt;
  opt.bf16_weights = false;  // fp32: logits equal to ~1e-6, so seeded draws agree
  CudaExecutor gpu(cfg, w, 64, opt);
  std::map<std::string, std::vector<int32_t>> outs[2];
  for (int which = 0; which < 2; ++which) {
    std::unique_ptr<Engine> e = which == 0 ? std::make_unique<Engine>(cpu, EngineConfig{.num_pages = 64})
                                           : std::make_unique<Engine>(gpu, EngineConfig{});
    std::mt19937 gg(7);
    std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
    for (int r = 0; r < 4; ++r) {
      EngineRequest req;
      req.id = "r" + std::to_string(r);
      req.prompt.resize(size_t(40 + 30 * r));
      for (auto& x : req.prompt) x = tok(gg);
      req.params.max_tokens = 16;
      req.params.sampling.temperature = 1.f;
      req.params.sampling.top_p = r == 1 ? 0.8f : 1.f;
      req.params.sampling.top_k = r == 2 ? 20 : -1;
      req.params.sampling.min_p = r == 3 ? 0.05f : 0.f;
      req.params.sampling.seed = 1234 + r;
      req.params.ignore_eos = true;
      req.params.frequency_penalty = r == 3 ? 0.5f : 0.f;
      auto* out = &outs[which][req.id];
      e->submit(req, [out](const EngineOutput& o) { out->insert(out->end(), o.tokens.begin(), o.tokens.end()); });
    }
    while (e->step()) {
    }
  }
  for (auto& [id, toks] : outs[0]) {
    std::printf("[gpu-sampling] engine %s: %zu tokens, cpu == gpu: %s\n", id.c_str(), toks.size(),
                toks == outs[1][id] ? "yes" : "no");
    EXPECT_EQ(toks.size(), 16u);
    EXPECT_EQ(toks, outs[1][id]) << id;
  }
}

// Constrained decoding through both engines (the CUDA one on its decode-graph path after the first steps): the
// grammar masks give the same seeded tokens as on the CPU, and a finished document is valid JSON of the schema.
TEST(GpuSampling, ConstrainedEngineGenerationOnTheGpuEqualsTheCpuEngine) {
  if (!CudaExecutor::available()) GTEST_SKIP() << "no CUDA device";
  const std::string fx = std::string(M3_SOURCE_DIR) + "/tests/golden/fixtures/tiny_sparse_f32";
  M3Config cfg = load_m3_config(fx + "/config.json");
  SafeTensors st = SafeTensors::open(fx);
  const M3Weights w = M3Weights::load(cfg, st);
  cfg.eos_token_id = 5;  // the fixture has none; the grammar needs one to end the document
  M3Model cpu(cfg, w);
  CudaExecutorOptions opt;
  opt.bf16_weights = false;
  CudaExecutor gpu(cfg, w, 64, opt);
  // Every id stands for a JSON-ish piece; id 5 is EOS.
  // (The bare key letters are there so the grammar can always continue after a '"': a vocabulary without them
  // would end the requests with an error, tests/engine/engine_grammar_test.cpp.)
  const char* pieces[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "0", "1", "7", "-", "true", "false",
                          "null", "\"a\"", "\"b\"", "\"c\"", "x", "yz", "\"x\"", "{\"a\": ", "12", ", \"b\": ",
                          "a", "b", "c", "y", "z"};
  std::vector<std::string> bytes(size_t(cfg.vocab_size));
  std::vector<uint8_t> usable(bytes.size(), 1);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = pieces[i % (sizeof(pieces) / sizeof(pieces[0]))];
  bytes[5] = "<eos>", usable[5] = 0;
  auto vocab = std::make_shared<const grammar::TokenVocab>(bytes, usable, 5, int32_t(cfg.vocab_size));
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"enum": ["x", "yz"]}, "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
      "required": ["a", "b"], "additionalProperties": false})");
  auto spec = std::make_shared<grammar::ConstraintSpec>();
  spec->grammar = std::make_shared<grammar::CompiledGrammar>(grammar::json_schema_grammar(schema), vocab);
  std::map<std::string, std::vector<int32_t>> outs[2];
  for (int which = 0; which < 2; ++which) {
    std::unique_ptr<Engine> e = which == 0 ? std::make_unique<Engine>(cpu, EngineConfig{.num_pages = 64})
                                           : std::make_unique<Engine>(gpu, EngineConfig{});
    for (int r = 0; r < 6; ++r) {
      EngineRequest req;
      req.id = "r" + std::to_string(r);
      req.prompt = {int32_t(10 + r), 20, 30, int32_t(40 + r)};
      req.params.max_tokens = 120;
      req.params.sampling.temperature = r == 0 ? 0.f : 1.f;
      req.params.sampling.seed = 77 + r;
      req.constraint = spec;
      auto* out = &outs[which][req.id];
      e->submit(req, [out](const EngineOutput& o) { out->insert(out->end(), o.tokens.begin(), o.tokens.end()); });
    }
    while (e->step()) {
    }
  }
  for (auto& [id, toks] : outs[0]) {
    EXPECT_EQ(toks, outs[1][id]) << id;
    std::string text;
    for (int32_t t : toks)
      if (t != 5) text += bytes[size_t(t)];
    std::printf("[gpu-sampling] constrained %s: %zu tokens, cpu == gpu: %s, %s\n", id.c_str(), toks.size(),
                toks == outs[1][id] ? "yes" : "no", text.c_str());
    grammar::Matcher m(spec->grammar);
    EXPECT_TRUE(m.accept_bytes(text)) << text;  // every prefix the engines wrote is in the language
    if (!toks.empty() && toks.back() == 5) {
      EXPECT_TRUE(m.accepting()) << text;
      EXPECT_FALSE(nlohmann::json::parse(text, nullptr, false).is_discarded()) << text;
    }
  }
}

}  // namespace
}  // namespace m3
