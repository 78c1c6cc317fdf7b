// Whole tiny model on the GPU against the CPU reference engine (tests/golden/fixtures/tiny_sparse_f32: 5 layers,
// 3 dense + 2 MSA/MoE, block 16, top-4, head dim 32): chunked prefill past many blocks (selection matters), a mixed
// decode + prefill batch, greedy decode, the MSA selections of every sparse layer, and the engine on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <filesystem>
#include <numeric>
#include <random>
#include <span>

#include "base/dtype.h"
#include "base/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "io/safetensors.h"
#include "model/cuda_executor.h"
#include "model/m3_model.h"
#include "test_model_util.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU() \
  if (!CudaExecutor::available()) GTEST_SKIP() << "no CUDA device"

// The source tree: $M3_SOURCE_DIR when set (binaries carried to another machine), else the one this was built from.
std::string fixture(const char* name = "tiny_sparse_f32") {
  const char* env = std::getenv("M3_SOURCE_DIR");
  return (fs::path(env && *env ? env : M3_SOURCE_DIR) / "tests/golden/fixtures" / name).string();
}

struct Loaded {
  M3Config cfg;
  M3Weights w;
};
// The matrices the GPU stores in bf16 (norms and the router stay fp32).
void round_weights_bf16(M3Weights& w) {
  auto r = [](std::vector<float>& v) {
    for (auto& x : v) x = round_to_bf16(x);
  };
  r(w.embed), r(w.lm_head);
  for (auto& L : w.layers) {
    r(L.wqkv), r(L.wo), r(L.w_index_qk), r(L.mlp.gate_up), r(L.mlp.down), r(L.shared.gate_up), r(L.shared.down);
    for (auto& e : L.experts) r(e.gate_up), r(e.down);
  }
}
Loaded load_weights(bool round_bf16) {
  Loaded l;
  l.cfg = load_m3_config(fixture() + "/config.json");
  SafeTensors st = SafeTensors::open(fixture());
  l.w = M3Weights::load(l.cfg, st);
  if (round_bf16) round_weights_bf16(l.w);
  return l;
}

// A config whose attention runs on the tensor-core kernels (bf16 cache, head dim 128, 128-token pages, G = 16,
// index 128): fused decode indexer + paged decode (docs/KERNELS.md §9) and union-tile prefill (§8). Top-2 of 128-token
// blocks, so rows past position 256 choose one of two history blocks (the script reaches ~330).
Loaded tensor_core_model() {
  Loaded l;
  l.cfg = test::tensor_core_config();
  l.w = test::random_weights(l.cfg, 7);
  round_weights_bf16(l.w);
  return l;
}

// What one scripted run measured. Errors are per logits row: max |gpu − cpu| over the row / max |cpu| over the row,
// so a bug confined to a few rows is not diluted by the rest of the step.
constexpr float kDecisiveGap = 2e-2f;

struct RunStats {
  int selection_rows = 0;
  int selection_flips = 0;   // rows whose GPU selection differs from the CPU's
  int untied_flips = 0;      // of those, flips where a swapped block was not a near-tie of the k-th CPU score
  int argmax_agree = 0, rows = 0;
  // Rows where the reference is decisive: its top-2 logit gap exceeds kDecisiveGap of its largest |logit| (about
  // twice the bf16 path's p90 per-row error), so a flip there is a real error and not rounding at a near-tie.
  int decisive_rows = 0, decisive_agree = 0;
  // Of those, the rows whose MSA selections matched in every layer (a selection flip at an indexer near-tie changes
  // the attended blocks: the same exemption the logit error statistics make).
  int decisive_unflipped_rows = 0, decisive_unflipped_agree = 0;
  int flipped_rows = 0;      // logits rows of a token whose selection flipped in some layer (exempt from row_errs)
  std::vector<double> row_errs;  // rows without a flip
  double worst_row = 0;          // max of row_errs
};

// A selection row differs: accepted only when every block in the symmetric difference scored (on the CPU) within
// tol·max(1, |s_k|) of s_k, the k-th best history score — i.e. the CPU itself was at a near-tie there.
bool flip_is_near_tie(std::span<const int32_t> cpu_sel, std::span<const int32_t> gpu_sel, std::span<const float> scores,
                      double tol) {
  const size_t K = cpu_sel.size();
  float kth = INFINITY;
  for (size_t j = 0; j + 1 < K; ++j)  // history blocks (local last); −1 pads rows with fewer blocks than K
    if (cpu_sel[j] >= 0 && size_t(cpu_sel[j]) < scores.size()) kth = std::min(kth, scores[size_t(cpu_sel[j])]);
  if (cpu_sel[K - 1] != gpu_sel[K - 1]) return false;  // the local block is always selected, last
  auto tied = [&](int32_t b) {
    return b >= 0 && size_t(b) < scores.size() && size_t(b) != size_t(cpu_sel[K - 1]) &&
           std::fabs(double(scores[size_t(b)]) - kth) <= tol * std::max(1.0, std::fabs(double(kth)));
  };
  for (size_t j = 0; j + 1 < K; ++j) {
    const bool in_gpu = std::find(gpu_sel.begin(), gpu_sel.end() - 1, cpu_sel[j]) != gpu_sel.end() - 1;
    const bool in_cpu = std::find(cpu_sel.begin(), cpu_sel.end() - 1, gpu_sel[j]) != cpu_sel.end() - 1;
    if ((!in_gpu && !tied(cpu_sel[j])) || (!in_cpu && !tied(gpu_sel[j]))) return false;
  }
  return true;
}

// Runs the same scripted steps on the CPU model and the GPU executor.
// Steps: A prefill 0..199 (all logits) → A prefill 200..319 → A decode ×3 → [A decode + B prefill 150] → A decode ×4.
// make: builds the GPU executor for (options, pages) instead of uploading l.w (e.g. streamed MXFP8 as FP8).
using MakeGpu = std::function<std::unique_ptr<CudaExecutor>(const CudaExecutorOptions&, int32_t)>;
// cpu_kv: what the CPU reference cache stores (KVCache::set_storage; e4m3 for the --kv-cache-dtype fp8 tests).
RunStats run_script(const Loaded& l, bool bf16, double tie_tol,
                    AttentionBackend attention = AttentionBackend::Msa, const MakeGpu& make = {},
                    const char* tag = nullptr, const KvStorage& cpu_kv = {}) {
  const M3Config& c = l.cfg;
  const int32_t P = 64;
  M3Model cpu(c, l.w);
  KVCache cache(c, P);
  cache.set_storage(cpu_kv);
  CudaExecutorOptions opt;
  opt.bf16_weights = bf16;
  opt.attention = attention;
  opt.validate = true;
  std::unique_ptr<CudaExecutor> gpu_own =
      make ? make(opt, P) : std::make_unique<CudaExecutor>(c, l.w, P, opt);
  CudaExecutor& gpu = *gpu_own;
  if (!tag) tag = bf16 ? "bf16" : "fp32";
  std::mt19937 g(1234);
  std::vector<int32_t> perm(P);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  std::vector<int32_t> pt_a(perm.begin(), perm.begin() + 32), pt_b(perm.begin() + 32, perm.begin() + 44);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> a(320), b(150);
  for (auto& x : a) x = tok(g);
  for (auto& x : b) x = tok(g);
  RunStats st;
  const size_t V = static_cast<size_t>(c.vocab_size);
  auto step = [&](std::vector<SeqInput> in) {
    ForwardTrace tc, tg;
    tc.capture_selection = tg.capture_selection = true;
    tc.capture_block_scores = true;
    auto lc = cpu.forward(in, cache, &tc);
    auto lg = gpu.forward(in, &tg);
    // Selections: [Hidx, n, K] per sequence; CPU scores [Hidx, n, max_blocks].
    std::vector<std::vector<bool>> flipped(in.size());
    const size_t K = size_t(c.sparse_topk_blocks);
    for (size_t s = 0; s < in.size(); ++s) flipped[s].assign(in[s].tokens.size(), false);
    for (size_t l2 = 0; l2 < tc.selection.size(); ++l2)
      for (size_t s = 0; s < tc.selection[l2].size(); ++s) {
        const auto& x = tc.selection[l2][s];
        const auto& y = tg.selection[l2][s];
        EXPECT_EQ(x.size(), y.size());
        const size_t n = in[s].tokens.size(), cols = size_t(tc.block_scores_cols[s]);
        for (size_t r = 0; (r + 1) * K <= std::min(x.size(), y.size()); ++r) {
          ++st.selection_rows;
          std::span<const int32_t> xs(x.data() + r * K, K), ys(y.data() + r * K, K);
          if (std::equal(xs.begin(), xs.end(), ys.begin())) continue;
          ++st.selection_flips;
          flipped[s][r % n] = true;
          std::span<const float> sc(tc.block_scores[l2][s].data() + r * cols, cols);
          if (!flip_is_near_tie(xs, ys, sc, tie_tol)) {
            ++st.untied_flips;  // each test decides how many it allows
            std::printf("[gpu-model] %s layer %zu seq %zu token %zu head %zu: other blocks than the CPU's, not a "
                        "near-tie\n", tag, l2, s, r % n, r / n);
          }
        }
      }
    for (size_t s = 0; s < in.size(); ++s) {
      const size_t rows = lc[s].size() / V, n = in[s].tokens.size();
      double step_worst = 0;
      for (size_t r = 0; r < rows; ++r) {
        std::span<const float> rc(&lc[s][r * V], V), rg(&lg[s][r * V], V);
        const bool agree = argmax(rc) == argmax(rg);
        st.argmax_agree += agree;
        ++st.rows;
        {
          float top1 = -INFINITY, top2 = -INFINITY, mx = 0.f;
          for (float v : rc) {
            if (v > top1) top2 = top1, top1 = v;
            else if (v > top2) top2 = v;
            mx = std::max(mx, std::fabs(v));
          }
          const size_t tok = rows == n ? r : n - 1;
          if (top1 - top2 > kDecisiveGap * mx) {
            ++st.decisive_rows, st.decisive_agree += agree;
            if (!flipped[s][tok]) ++st.decisive_unflipped_rows, st.decisive_unflipped_agree += agree;
          }
        }
        double m = 0, ref = 0;
        for (size_t i = 0; i < V; ++i) {
          m = std::max(m, std::isfinite(rg[i]) ? double(std::fabs(rc[i] - rg[i])) : INFINITY);
          ref = std::max(ref, double(std::fabs(rc[i])));
        }
        const double e = m / ref;
        const size_t token = rows == n ? r : n - 1;  // all_logits rows, else only the last token's
        if (flipped[s][token]) {
          ++st.flipped_rows;
          continue;
        }
        st.row_errs.push_back(e);
        st.worst_row = std::max(st.worst_row, e);
        step_worst = std::max(step_worst, e);
      }
      std::printf("[gpu-model] %s seq %zu start %lld n %zu rows %zu: worst row rel err %.3e\n", tag,
                  s, (long long)in[s].start_pos, n, rows, step_worst);
    }
    return lc;
  };
  auto seq = [](const std::vector<int32_t>& ids, int64_t s, int64_t n, const std::vector<int32_t>& pt, bool all) {
    return SeqInput{std::span<const int32_t>(ids.data() + s, static_cast<size_t>(n)), s, pt, all};
  };
  step({seq(a, 0, 200, pt_a, true)});
  auto lc = step({seq(a, 200, 120, pt_a, true)});
  std::vector<int32_t> gen = a;
  int32_t next = argmax(std::span<const float>(&lc[0][static_cast<size_t>(119) * V], V));
  for (int i = 0; i < 8; ++i) {
    gen.push_back(next);
    std::vector<SeqInput> in{seq(gen, int64_t(gen.size()) - 1, 1, pt_a, false)};
    if (i == 3) in.push_back(seq(b, 0, 150, pt_b, true));
    lc = step(in);
    next = argmax(lc[0]);
  }
  std::printf("[gpu-model] %s: selection rows differing %d of %d (%d not near-ties); %d logits rows exempt after a "
              "flip; worst row rel err %.3e; argmax agree %d/%d; on rows where the reference's top-2 gap > %.0e of "
              "its max |logit|: %d/%d, of them without a selection flip: %d/%d\n", tag,
              st.selection_flips, st.selection_rows, st.untied_flips, st.flipped_rows, st.worst_row, st.argmax_agree,
              st.rows, double(kDecisiveGap), st.decisive_agree, st.decisive_rows, st.decisive_unflipped_agree,
              st.decisive_unflipped_rows);
  return st;
}

// bf16 bounds shared by the bf16 model tests (see the test above for where they come from).
void expect_bf16_bounds(RunStats st, const char* what) {
  std::sort(st.row_errs.begin(), st.row_errs.end());
  ASSERT_FALSE(st.row_errs.empty()) << what;
  const double p50 = st.row_errs[st.row_errs.size() / 2], p90 = st.row_errs[st.row_errs.size() * 9 / 10];
  std::printf("[gpu-model] %s: per-row logits rel err p50 %.3e p90 %.3e max %.3e (rows without a flip)\n", what, p50,
              p90, st.worst_row);
  EXPECT_LE(st.untied_flips, st.selection_rows / 50) << what;
  EXPECT_LE(st.selection_flips, st.selection_rows / 20) << what;
  EXPECT_LT(p50, 2e-2) << what;
  EXPECT_LT(p90, 5e-2) << what;
  EXPECT_GE(st.argmax_agree, st.rows * 95 / 100) << what;
  // The GPU serving issue's top-1 target (≥ 99 %), on the rows where the reference decides and the indexer chose
  // the same blocks; on every decisive row ≥ 98 % (measured 98.96–99.26 % on the H200).
  EXPECT_GE(st.decisive_unflipped_agree * 100, st.decisive_unflipped_rows * 99) << what;
  EXPECT_GE(st.decisive_agree * 100, st.decisive_rows * 98) << what;
}

TEST(GpuModel, TinySparseModelMatchesCpuLogitsAndSelectionsInFp32) {
  SKIP_WITHOUT_GPU();
  const Loaded l = load_weights(false);
  // Measured (docs/KERNELS.md): worst row 1.6e-6, no selection differs. Any flip must be a near-tie in fp32.
  const RunStats st = run_script(l, false, /*tie_tol=*/1e-4);
  EXPECT_EQ(st.untied_flips, 0);
  EXPECT_LE(st.flipped_rows, st.rows / 100);
  EXPECT_LT(st.worst_row, 1e-4);  // every row without a flip, each against its own max |logit|
  EXPECT_GE(st.argmax_agree, st.rows - st.flipped_rows);
}

TEST(GpuModel, TinySparseModelWithBf16WeightsStaysCloseToCpuOnRoundedWeights) {
  SKIP_WITHOUT_GPU();
  const Loaded l = load_weights(true);
  // The GPU rounds activations to bf16 at every GEMM input, the CPU keeps them in fp32. The index scores then drift
  // through the layers, some selections flip — not all at near-ties of the CPU's scores — and a flipped prefill row
  // changes its K/V, which later tokens read: so a single worst row is no bound here (measured on the H200 at
  // b20b984: 53 of 1912 rows flip, 16 of them outside 5 % of the k-th score, worst row 0.67, p50 7.5e-3,
  // p90 1.1e-2, argmax 468/478). The bounds below hold those numbers with margin and still fail on a broken
  // bf16 path (garbage logits, wrong blocks). Top-1 ≥ 99 % against the reference is the GPU serving issue's target.
  expect_bf16_bounds(run_script(l, true, /*tie_tol=*/5e-2), "bf16");
}

TEST(GpuModel, TensorCoreAttentionPathStaysCloseToCpuOnRoundedWeights) {
  SKIP_WITHOUT_GPU();
  const Loaded l = tensor_core_model();
  expect_bf16_bounds(run_script(l, true, 5e-2), "tensor-core msa");
  // The same model through the v1 kernels over the same bf16 cache: both paths are held to the same bounds.
  expect_bf16_bounds(run_script(l, true, 5e-2, AttentionBackend::MsaV1), "v1 msa, bf16 cache");
}

TEST(GpuModel, DenseAttentionBackendEqualsMsaWhileEveryBlockIsSelected) {
  SKIP_WITHOUT_GPU();
  // Below top_k·B = 64 tokens an MSA layer selects every block, so --attention dense computes the same function.
  const Loaded l = load_weights(false);
  M3Model cpu(l.cfg, l.w);
  KVCache cache(l.cfg, 8);
  CudaExecutorOptions opt;
  opt.bf16_weights = false;
  opt.attention = AttentionBackend::Dense;
  CudaExecutor gpu(l.cfg, l.w, 8, opt);
  const std::vector<int32_t> ids = test::random_ids(60, l.cfg.vocab_size, 5), pt{3, 1, 6, 0};
  const std::vector<SeqInput> in{SeqInput{ids, 0, pt, true}};
  const auto lc = cpu.forward(in, cache);
  const auto lg = gpu.forward(in);
  double m = 0, ref = 0;
  for (size_t i = 0; i < lc[0].size(); ++i)
    m = std::max(m, double(std::fabs(lc[0][i] - lg[0][i]))), ref = std::max(ref, double(std::fabs(lc[0][i])));
  std::printf("[gpu-model] --attention dense, 60 tokens: rel err %.3e\n", m / ref);
  EXPECT_LT(m / ref, 1e-4);
}

// Three greedy requests (random prompts of 90, 150, 210 tokens from a fixed seed, 12 new tokens each) run to the end
// on `e`; their tokens by request id.
std::map<std::string, std::vector<int32_t>> run_three_greedy_requests(Engine& e, int vocab, bool ignore_eos) {
  std::map<std::string, std::vector<int32_t>> outs;
  std::mt19937 gg(99);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  for (int r = 0; r < 3; ++r) {
    EngineRequest req;
    req.id = "r" + std::to_string(r);
    req.prompt.resize(static_cast<size_t>(90 + 60 * r));
    for (auto& x : req.prompt) x = tok(gg);
    req.params.max_tokens = 12;
    req.params.ignore_eos = ignore_eos;
    req.params.sampling.temperature = 0;
    auto* out = &outs[req.id];
    e.submit(req, [out](const EngineOutput& o) { out->insert(out->end(), o.tokens.begin(), o.tokens.end()); });
  }
  while (e.step()) {
  }
  return outs;
}

TEST(GpuModel, EngineOnTheCudaExecutorGeneratesTheCpuEnginesGreedyTokens) {
  SKIP_WITHOUT_GPU();
  const Loaded l = load_weights(false);
  M3Model cpu(l.cfg, l.w);
  CudaExecutorOptions opt;
  opt.bf16_weights = false;
  CudaExecutor gpu(l.cfg, l.w, 0, opt);  // 0: the KV pool is sized from free device memory
  std::printf("[gpu-model] %s\n", gpu.describe().c_str());
  EXPECT_GE(gpu.pool().capacity(), 48);
  std::map<std::string, std::vector<int32_t>> outs[2];
  for (int which = 0; which < 2; ++which) {
    std::unique_ptr<Engine> e = which == 0 ? std::make_unique<Engine>(cpu, EngineConfig{.num_pages = 48})
                                           : std::make_unique<Engine>(gpu, EngineConfig{});
    outs[which] = run_three_greedy_requests(*e, l.cfg.vocab_size, /*ignore_eos=*/false);
  }
  for (auto& [id, toks] : outs[0]) {
    std::printf("[gpu-model] engine %s: %zu tokens, cpu == gpu: %s\n", id.c_str(), toks.size(),
                toks == outs[1][id] ? "yes" : "no");
    EXPECT_EQ(toks.size(), 12u);
    EXPECT_EQ(toks, outs[1][id]) << id;
  }
}

// ---- --dtype fp8 (issue 15 items 1–2, 5): the MXFP8 fixture streamed with its projections kept FP8 -----------------
// The CPU reference runs the same checkpoint dequantised exactly (M3Weights::load), with the matrices the GPU keeps
// in bf16 rounded as the GPU stores them (embeddings, LM head; the routed experts' MXFP8 values are exact in bf16).
// What the FP8 path adds to the bf16 path: the 128×128 requantisation (≤ 4e-6 of ‖y‖ per GEMM, docs/FP8.md §3) and,
// on the cuBLASLt path only, e4m3 activations (1.6–2.4e-2 of ‖y‖ per GEMM — as large as MXFP8's own error).
Loaded load_mxfp8_reference() {
  Loaded l;
  l.cfg = load_m3_config(fixture("tiny_sparse_mxfp8") + "/config.json");
  const SafeTensors st = SafeTensors::open(fixture("tiny_sparse_mxfp8"));
  l.w = M3Weights::load(l.cfg, st);
  round_weights_bf16(l.w);
  return l;
}

MakeGpu mxfp8_maker(bool fp8, int lt_min_rows, int* fp8_matrices = nullptr) {
  return [=](const CudaExecutorOptions& base, int32_t P) {
    CudaExecutorOptions o = base;
    o.fp8_weights = fp8;
    o.fp8_lt_min_rows = lt_min_rows;
    const std::string dir = fixture("tiny_sparse_mxfp8");
    auto ex = CudaExecutor::load(load_m3_config(dir + "/config.json"), dir, P, o);
    std::printf("[gpu-model] %s\n", ex->describe().c_str());
    if (fp8_matrices) *fp8_matrices = ex->fp8_matrices();
    return ex;
  };
}

// The matrices `--dtype fp8` keeps FP8 on this fixture: q/k/v/o of 5 layers, index q/k of 2, the dense MLPs of 3,
// the shared experts of 2 (every K here is a multiple of 64, so none falls back to bf16) and the routed experts of
// the 2 MoE layers (gate_up and down, each counted once for its stack of 8 experts).
constexpr int kFixtureFp8Matrices = 5 * 2 + 2 + 3 * 2 + 2 * 2 + 2 * 2;

// The bf16 bounds of expect_bf16_bounds as a verdict (printed, not asserted), and the numbers the FP8 tests compare.
struct Summary {
  double p50 = 0, p90 = 0, argmax = 0, decisive = 0;  // argmax, decisive: fractions of rows
  bool bf16_bounds = false;
};
Summary summarize(RunStats st, const char* what) {
  std::sort(st.row_errs.begin(), st.row_errs.end());
  Summary m;
  if (st.row_errs.empty()) return m;
  m.p50 = st.row_errs[st.row_errs.size() / 2], m.p90 = st.row_errs[st.row_errs.size() * 9 / 10];
  m.argmax = double(st.argmax_agree) / std::max(st.rows, 1);
  m.decisive = double(st.decisive_agree) / std::max(st.decisive_rows, 1);
  m.bf16_bounds = st.untied_flips <= st.selection_rows / 50 && st.selection_flips <= st.selection_rows / 20 &&
                  m.p50 < 2e-2 && m.p90 < 5e-2 && st.argmax_agree >= st.rows * 95 / 100 &&
                  st.decisive_unflipped_agree * 100 >= st.decisive_unflipped_rows * 99 &&
                  st.decisive_agree * 100 >= st.decisive_rows * 98;
  std::printf("[gpu-model] %s: per-row logits rel err p50 %.3e p90 %.3e max %.3e; argmax %d/%d (%.1f %%); decisive "
              "rows %d/%d (%.1f %%), unflipped %d/%d; selection flips %d/%d (%d not near-ties); within the bf16 "
              "test's bounds: %s\n", what, m.p50, m.p90, st.worst_row, st.argmax_agree, st.rows, 100 * m.argmax,
              st.decisive_agree, st.decisive_rows, 100 * m.decisive, st.decisive_unflipped_agree,
              st.decisive_unflipped_rows, st.selection_flips, st.selection_rows, st.untied_flips,
              m.bf16_bounds ? "yes" : "no");
  return m;
}

TEST(GpuModel, Mxfp8FixtureWithFp8WeightsW8A16StaysWhereTheBf16PathIs) {
  SKIP_WITHOUT_GPU();
  const Loaded l = load_mxfp8_reference();
  // Calibration: the same checkpoint as bf16 weights (MXFP8 → bf16 exactly) through the same kernels otherwise.
  const Summary b = summarize(run_script(l, true, 5e-2, AttentionBackend::Msa, mxfp8_maker(false, 0), "mxfp8 as bf16"),
                              "mxfp8 as bf16");
  // W8A16 only (bf16 activations): the weights are the same values up to the 128×128 requantisation (≤ 4e-6 of ‖y‖
  // per GEMM), so it must stay where the bf16 path is: within the bf16 test's bounds when the calibration is, and
  // never more than 25 % (+ 1e-3) above its median / p90 error or 2 points below its argmax agreement.
  int n8 = 0;
  const RunStats st = run_script(l, true, 5e-2, AttentionBackend::Msa, mxfp8_maker(true, 0, &n8), "fp8 w8a16");
  const Summary f = summarize(st, "fp8 w8a16");
  EXPECT_EQ(n8, kFixtureFp8Matrices);
  if (b.bf16_bounds) expect_bf16_bounds(st, "fp8 w8a16");
  EXPECT_LE(f.p50, 1.25 * b.p50 + 1e-3);
  EXPECT_LE(f.p90, 1.25 * b.p90 + 1e-3);
  EXPECT_GE(f.argmax, b.argmax - 0.02);
}

TEST(GpuModel, Mxfp8FixtureWithFp8WeightsCublasLtPrefillIsMeasured) {
  SKIP_WITHOUT_GPU();
  const Loaded l = load_mxfp8_reference();
  // The default threshold: decode rows (≤ 15) through W8A16, prefill rows through cuBLASLt FP8×FP8 with e4m3
  // activations. docs/FP8.md §3 predicts (CPU emulation on this fixture, 128×128 + e4m3 activations): median row
  // error 1.1e-1, argmax 67.6 % — far outside the bf16 bounds, so this test holds it to "not broken" bounds only
  // (garbage logits would give p50 ≈ 1 and argmax ≈ 1/V) and prints the numbers.
  int n8 = 0;
  const Summary f =
      summarize(run_script(l, true, 5e-2, AttentionBackend::Msa, mxfp8_maker(true, 16, &n8), "fp8 lt>=16"),
                "fp8 cublaslt prefill (lt >= 16)");
  EXPECT_EQ(n8, kFixtureFp8Matrices);
  EXPECT_LT(f.p50, 0.4);
  EXPECT_GE(f.argmax, 0.5);
}

TEST(GpuModel, EngineGeneratesGreedyTokensWithFp8Weights) {
  SKIP_WITHOUT_GPU();
  const Loaded l = load_mxfp8_reference();
  M3Model cpu(l.cfg, l.w);
  std::map<std::string, std::vector<int32_t>> outs[3];
  const char* names[3] = {"cpu", "fp8 w8a16", "fp8 default"};
  for (int which = 0; which < 3; ++which) {
    std::unique_ptr<CudaExecutor> gpu;
    std::unique_ptr<Engine> e;
    if (which == 0) {
      e = std::make_unique<Engine>(cpu, EngineConfig{.num_pages = 48});
    } else {
      CudaExecutorOptions o;
      gpu = mxfp8_maker(true, which == 1 ? 0 : 16)(o, 64);
      e = std::make_unique<Engine>(*gpu, EngineConfig{});
    }
    outs[which] = run_three_greedy_requests(*e, l.cfg.vocab_size, /*ignore_eos=*/true);
  }
  for (int which = 1; which < 3; ++which)
    for (auto& [id, toks] : outs[0]) {
      const auto& g = outs[which][id];
      size_t same = 0;
      while (same < std::min(toks.size(), g.size()) && toks[same] == g[same]) ++same;
      std::printf("[gpu-model] engine %s %s: %zu tokens, first %zu equal to the CPU's greedy tokens\n", names[which],
                  id.c_str(), g.size(), same);
      EXPECT_EQ(g.size(), 12u) << names[which] << " " << id;
    }
}

}  // namespace
}  // namespace m3

namespace m3 {
namespace {

// ---- --kv-cache-dtype fp8 (issue 15 item 4): e4m3 K/V and index-K pools on the executor ------------------------
// The tensor-core model through the script (chunked prefill past two blocks, decode, a mixed decode + prefill
// step) with an e4m3 cache, against the CPU model whose cache stores e4m3 with the same per-tensor scales
// (KVCache::set_storage: the twins of the cache writer and the readers). Prefill reads the bf16 staging copy, decode
// the e4m3 pools, so both paths are compared. Run at scale 1 (vLLM's default without calibration) and at
// non-power-of-two scales, where a scale dropped or applied twice anywhere (writer, decode reader, staging,
// softmax scale) moves every logit.
// Bounds: the two sides round to e4m3 from values that differ by the bf16 activations (the bf16 test's noise), so a
// value near a rounding boundary lands on a neighbouring code (one e4m3 step, 6–12 %) on one side only — the noise
// is larger than with a bf16 cache. The test holds fp8 to bounds somewhat looser than expect_bf16_bounds and prints
// whether the bf16 bounds would hold.
void expect_fp8_kv_bounds(RunStats st, const char* what) {
  std::sort(st.row_errs.begin(), st.row_errs.end());
  ASSERT_FALSE(st.row_errs.empty()) << what;
  const double p50 = st.row_errs[st.row_errs.size() / 2], p90 = st.row_errs[st.row_errs.size() * 9 / 10];
  const bool bf16_like = st.untied_flips <= st.selection_rows / 50 && st.selection_flips <= st.selection_rows / 20 &&
                         p50 < 2e-2 && p90 < 5e-2 && st.argmax_agree >= st.rows * 95 / 100 &&
                         st.decisive_unflipped_agree * 100 >= st.decisive_unflipped_rows * 99;
  std::printf("[gpu-model] %s: per-row logits rel err p50 %.3e p90 %.3e max %.3e; argmax %d/%d; decisive %d/%d, "
              "unflipped %d/%d; selection flips %d/%d (%d not near-ties); within the bf16 bounds: %s\n",
              what, p50, p90, st.worst_row, st.argmax_agree, st.rows, st.decisive_agree, st.decisive_rows,
              st.decisive_unflipped_agree, st.decisive_unflipped_rows, st.selection_flips, st.selection_rows,
              st.untied_flips, bf16_like ? "yes" : "no");
  EXPECT_LE(st.untied_flips, st.selection_rows / 25) << what;
  EXPECT_LE(st.selection_flips, st.selection_rows / 10) << what;
  EXPECT_LT(p50, 3e-2) << what;
  EXPECT_LT(p90, 8e-2) << what;
  EXPECT_GE(st.argmax_agree, st.rows * 93 / 100) << what;
  EXPECT_GE(st.decisive_unflipped_agree * 100, st.decisive_unflipped_rows * 97) << what;
}

TEST(GpuModel, Fp8KvCacheMatchesTheCpuModelStoringE4m3AtUnitAndCalibratedScales) {
  SKIP_WITHOUT_GPU();
  const Loaded l = tensor_core_model();
  struct Scales {
    float k, v, ik;
    const char* tag;
  };
  for (const Scales sc : {Scales{1.f, 1.f, 1.f, "fp8 kv, scales 1"},
                          Scales{0.0297f, 0.0213f, 0.0271f, "fp8 kv, scales k 0.0297 v 0.0213 ik 0.0271"}}) {
    KvStorage st = KvStorage::all(KvDtype::E4M3);
    st.k_scale.assign(size_t(l.cfg.num_layers), sc.k);
    st.v_scale.assign(size_t(l.cfg.num_layers), sc.v);
    st.ik_scale.assign(size_t(l.cfg.num_layers), sc.ik);
    const MakeGpu make = [&](const CudaExecutorOptions& o, int32_t P) {
      CudaExecutorOptions f = o;
      f.fp8_kv = true;
      f.kv_k_scale = sc.k, f.kv_v_scale = sc.v, f.kv_index_scale = sc.ik;
      auto ex = std::make_unique<CudaExecutor>(l.cfg, l.w, P, f);
      std::printf("[gpu-model] %s: %s\n", sc.tag, ex->describe().c_str());
      return ex;
    };
    expect_fp8_kv_bounds(run_script(l, true, 5e-2, AttentionBackend::Msa, make, sc.tag, st), sc.tag);
  }
}

// The capacity change: an e4m3 page costs half the bf16 pools plus its share of one layer's bf16 staging.
TEST(GpuModel, Fp8KvPageBytesAreHalfTheBf16PoolsPlusOneLayerOfStaging) {
  const M3Config c = test::tensor_core_config();
  CudaExecutorOptions bf, f8;
  f8.fp8_kv = true;
  const int64_t kv = 2 * c.num_kv_heads * c.sparse_block_size * c.head_dim,
                ik = c.sparse_block_size * c.index_head_dim;
  const int64_t pools_bf16 = 2 * (c.num_layers * kv + c.num_sparse_layers() * ik);
  EXPECT_EQ(CudaExecutor::page_bytes_for(c, bf), pools_bf16);
  EXPECT_EQ(CudaExecutor::page_bytes_for(c, f8), pools_bf16 / 2 + 2 * (kv + ik));
}

// What fp8 KV cannot run with is refused at construction with the reason, never a crash.
TEST(GpuModel, Fp8KvCacheRefusesFp32WeightsMsaV1AndOtherShapes) {
  SKIP_WITHOUT_GPU();
  const Loaded l = tensor_core_model();
  auto message = [&](const M3Config& c, CudaExecutorOptions o) -> std::string {
    o.fp8_kv = true;
    try {
      CudaExecutor ex(c, test::random_weights(c, 3), 8, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  CudaExecutorOptions o;
  o.bf16_weights = false;
  EXPECT_NE(message(l.cfg, o).find("needs bf16 (or fp8) weights"), std::string::npos);
  o = {};
  o.attention = AttentionBackend::MsaV1;
  EXPECT_NE(message(l.cfg, o).find("msa-v1"), std::string::npos);
  o = {};
  o.kv_v_scale = 0.f;
  EXPECT_NE(message(l.cfg, o).find("must be finite and > 0"), std::string::npos);
  const M3Config tiny = load_m3_config(fixture() + "/config.json");  // head dim 32, 16-token pages
  EXPECT_NE(message(tiny, {}).find("needs head dim 128"), std::string::npos);
}

}  // namespace
}  // namespace m3
