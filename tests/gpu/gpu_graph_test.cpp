// Decode steps through CUDA graphs (issue 9 item 4; docs/ENGINE_STEP.md). The proof the issue asks for: the whole
// decode step — plans, every layer, the LM head and the sampler — is captured (a capture fails on any host sync or
// allocation) and its replays give the tokens of the same step run eagerly, bit for bit, across bucket sizes and a
// batch that grows and shrinks while a bucket's graph is replayed with new contents.
//
// Model: a small config on the tensor-core paths (bf16 cache, head dim 128, 128-token pages, G = 16, index dim 128,
// top-2), one dense and two MSA/MoE layers; prompts past 256 tokens, so the MSA layers choose between history blocks.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "model/cuda_executor.h"
#include "test_model_util.h"

namespace m3 {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!CudaExecutor::available()) GTEST_SKIP() << "no CUDA device"

M3Config graph_config() { return test::tensor_core_config(); }

using Streams = std::map<std::string, std::vector<int32_t>>;

// Requests of different prompt lengths and output lengths, so the decode batch shrinks as they finish (buckets 8 →
// 4 → 2 → 1), and two late arrivals, so it grows again while earlier buckets' graphs exist. Seeded sampling at
// temperature 0.8 / top-p 0.9 for odd requests (the sampler is inside the graph), greedy for even ones.
Streams run_engine(CudaExecutor& ex) {
  Engine e(ex, EngineConfig{.max_num_batched_tokens = 1024});
  Streams out;
  std::mt19937 g(5);
  const int V = int(ex.config().vocab_size);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  auto submit = [&](int r) {
    EngineRequest req;
    req.id = "r" + std::to_string(r);
    req.prompt.resize(size_t(120 + 97 * r));  // 120 … 1089 tokens: 1 to 9 pages
    for (auto& x : req.prompt) x = tok(g);
    req.params.max_tokens = 6 + 5 * r;
    req.params.ignore_eos = true;
    if (r % 2) {
      req.params.sampling.temperature = 0.8f, req.params.sampling.top_p = 0.9f;
      req.params.sampling.seed = 1000 + uint64_t(r);
    } else {
      req.params.sampling.temperature = 0.f;
    }
    auto* o = &out[req.id];
    e.submit(req, [o](const EngineOutput& x) { o->insert(o->end(), x.tokens.begin(), x.tokens.end()); });
  };
  for (int r = 0; r < 7; ++r) submit(r);
  int steps = 0;
  while (e.step()) {
    if (++steps == 12) submit(7), submit(8);
  }
  return out;
}

TEST(GpuGraph, DecodeGraphReplaysEqualTheEagerStepBitForBitAcrossBucketsAndAChangingBatch) {
  SKIP_WITHOUT_GPU();
  const M3Config c = graph_config();
  const M3Weights w = test::random_weights(c, 11);
  CudaExecutorOptions replay;  // defaults: bf16, graphs on
  CudaExecutorOptions twin = replay;
  twin.capture_graphs = false;  // the same padded, device-planned steps, run eagerly
  CudaExecutor a(c, w, 256, replay), b(c, w, 256, twin);
  const Streams sa = run_engine(a), sb = run_engine(b);
  const GraphStats ga = a.graph_stats(), gb = b.graph_stats();
  std::printf("[gpu-graph] graphs: %lld replays, %lld captures, %lld graph-form eager, %lld other steps, %lld "
              "invalidations, %lld failed captures | twin: %lld graph-form eager, %lld replays\n",
              (long long)ga.replays, (long long)ga.captures, (long long)ga.eager_graph_form, (long long)ga.eager_steps,
              (long long)ga.invalidations, (long long)ga.capture_failures, (long long)gb.eager_graph_form,
              (long long)gb.replays);
  EXPECT_EQ(ga.capture_failures, 0) << "a decode step could not be captured (a host sync or allocation inside)";
  EXPECT_GE(ga.captures, 4) << "buckets 8, 4, 2 and 1 at least";
  EXPECT_GE(ga.replays, 20);
  EXPECT_EQ(gb.replays, 0);
  ASSERT_EQ(sa.size(), 9u);
  for (const auto& [id, toks] : sb) {
    EXPECT_FALSE(toks.empty()) << id;
    EXPECT_EQ(sa.at(id), toks) << id << ": graph replay differs from the eager step";
  }
}

// `--dtype fp8` with dummy FP8 weights (issue 15): the FP8 projections inside decode graphs. fp8_lt_min_rows = 4 so
// buckets 1 and 2 run W8A16 (whole lines) and buckets 4 and 8 cuBLASLt FP8×FP8 (activation quantisation included):
// both capture (no allocation or host sync per call) and replay bit for bit like the eager graph-form twin.
TEST(GpuGraph, Fp8WeightsDecodeGraphReplaysEqualTheEagerStepBitForBit) {
  SKIP_WITHOUT_GPU();
  const M3Config c = graph_config();
  CudaExecutorOptions replay;
  replay.fp8_weights = true;
  replay.fp8_lt_min_rows = 4;
  CudaExecutorOptions twin = replay;
  twin.capture_graphs = false;
  auto a = CudaExecutor::dummy(c, 21, 256, replay), b = CudaExecutor::dummy(c, 21, 256, twin);
  std::printf("[gpu-graph] fp8: %s; %d FP8 matrices, %.2f MiB of weights\n", a->describe().c_str(),
              a->fp8_matrices(), double(a->weight_device_bytes()) / (1 << 20));
  EXPECT_GT(a->fp8_matrices(), 0);
  const Streams sa = run_engine(*a), sb = run_engine(*b);
  const GraphStats ga = a->graph_stats();
  std::printf("[gpu-graph] fp8 graphs: %lld replays, %lld captures, %lld invalidations, %lld failed captures\n",
              (long long)ga.replays, (long long)ga.captures, (long long)ga.invalidations,
              (long long)ga.capture_failures);
  EXPECT_EQ(ga.capture_failures, 0) << "an FP8 decode step could not be captured";
  EXPECT_GE(ga.captures, 4);
  EXPECT_GE(ga.replays, 20);
  ASSERT_EQ(sa.size(), 9u);
  for (const auto& [id, toks] : sb) {
    EXPECT_FALSE(toks.empty()) << id;
    EXPECT_EQ(sa.at(id), toks) << id << ": FP8 graph replay differs from the eager step";
  }
}

// --kv-cache-dtype fp8 (issue 15 item 4): the decode graphs read the e4m3 pools (PagedDecodeTc / MsaDecodeIndex e4m3
// instantiations with the layers' scales) and the prefills in between run through the bf16 staging pool; replays
// equal the eager graph-form twin bit for bit. Non-unit scales, so the graphs carry them.
TEST(GpuGraph, Fp8KvDecodeGraphReplaysEqualTheEagerStepBitForBit) {
  SKIP_WITHOUT_GPU();
  const M3Config c = graph_config();
  const M3Weights w = test::random_weights(c, 11);
  CudaExecutorOptions replay;
  replay.fp8_kv = true;
  replay.kv_k_scale = 0.0297f, replay.kv_v_scale = 0.0213f, replay.kv_index_scale = 0.0271f;
  CudaExecutorOptions twin = replay;
  twin.capture_graphs = false;
  CudaExecutor a(c, w, 256, replay), b(c, w, 256, twin);
  std::printf("[gpu-graph] fp8 kv: %s\n", a.describe().c_str());
  const Streams sa = run_engine(a), sb = run_engine(b);
  const GraphStats ga = a.graph_stats(), gb = b.graph_stats();
  std::printf("[gpu-graph] fp8 kv graphs: %lld replays, %lld captures, %lld invalidations, %lld failed captures | "
              "twin: %lld graph-form eager\n",
              (long long)ga.replays, (long long)ga.captures, (long long)ga.invalidations,
              (long long)ga.capture_failures, (long long)gb.eager_graph_form);
  EXPECT_EQ(ga.capture_failures, 0) << "an FP8-KV decode step could not be captured";
  EXPECT_GE(ga.captures, 4);
  EXPECT_GE(ga.replays, 20);
  EXPECT_EQ(gb.replays, 0);
  ASSERT_EQ(sa.size(), 9u);
  for (const auto& [id, toks] : sb) {
    EXPECT_FALSE(toks.empty()) << id;
    EXPECT_EQ(sa.at(id), toks) << id << ": FP8-KV graph replay differs from the eager step";
  }
}

TEST(GpuGraph, GraphDecodeAgreesWithThePlainEagerPathTokenForToken) {
  SKIP_WITHOUT_GPU();
  // The graph form differs from the plain eager step in padding (GEMMs of another M) and in how split-K attention
  // cuts its pages (dynamic per request vs fixed per step): float summation order only. Teacher-forced greedy
  // decode (both executors get the plain path's token each step) so one near-tie does not fork the rest; bf16
  // noise between two orders flips a greedy choice rarely (the bf16 path agrees with the fp32 CPU on ~98 % of rows,
  // gpu_model_test), a wrong graph plan on most rows.
  const M3Config c = graph_config();
  const M3Weights w = test::random_weights(c, 12);
  CudaExecutorOptions graphs, eager;
  eager.cuda_graphs = false;
  CudaExecutor a(c, w, 256, graphs), b(c, w, 256, eager);
  const int S = 7, V = int(c.vocab_size);
  std::mt19937 g(3);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<std::vector<int32_t>> seq(S), pages(S);
  for (int s = 0; s < S; ++s) {
    seq[size_t(s)].resize(size_t(130 + 150 * s));  // 130 … 1030 tokens
    for (auto& x : seq[size_t(s)]) x = tok(g);
    for (int p = 0; p < 12; ++p) pages[size_t(s)].push_back(s * 12 + p);
  }
  GenerationParams greedy;
  greedy.sampling.temperature = 0.f;
  // Prefill (eager on both), then decode steps over a batch that changes: all 7, then 5, 3, 1, then 6 again.
  auto step = [&](const std::vector<int>& who, bool prefill, int& agree, int& rows) {
    std::vector<SeqInput> in;
    std::vector<RowSampling> rs;
    std::vector<std::vector<int32_t>> last(who.size());
    for (size_t k = 0; k < who.size(); ++k) {
      const auto& q = seq[size_t(who[k])];
      SeqInput si;
      if (prefill) {
        si.tokens = q, si.start_pos = 0;
      } else {
        last[k] = {q.back()};
        si.tokens = last[k], si.start_pos = int64_t(q.size()) - 1;
      }
      si.page_table = pages[size_t(who[k])];
      in.push_back(si);
      RowSampling r;
      r.params = &greedy, r.tokens = q, r.prompt_len = int(q.size());
      rs.push_back(r);
    }
    const auto ta = a.forward_sample(in, rs), tb = b.forward_sample(in, rs);
    for (size_t k = 0; k < who.size(); ++k) {
      agree += ta[k].id == tb[k].id, ++rows;
      seq[size_t(who[k])].push_back(tb[k].id);  // teacher forcing: both continue from the plain path's token
    }
  };
  int agree = 0, rows = 0, pa = 0, pr = 0;
  for (int s = 0; s < S; ++s) step({s}, true, pa, pr);
  const std::vector<std::vector<int>> batches{{0, 1, 2, 3, 4, 5, 6}, {0, 2, 3, 5, 6}, {1, 4, 6}, {3}, {0, 1, 2, 4, 5, 6}};
  for (const auto& who : batches)
    for (int rep = 0; rep < 6; ++rep) step(who, false, agree, rows);
  const GraphStats ga = a.graph_stats();
  std::printf("[gpu-graph] graph vs plain eager, teacher-forced greedy: %d of %d decode rows choose the same token "
              "(%lld replays)\n", agree, rows, (long long)ga.replays);
  EXPECT_GE(ga.replays, 20);
  EXPECT_EQ(b.graph_stats().replays, 0);
  EXPECT_GE(double(agree), 0.95 * double(rows));
}

}  // namespace
}  // namespace m3
