// FP8 vs bf16 on a model with trained weights (issue 15 item 5; docs/FP8.md §3.1): perplexity, top-1 agreement and
// logit error on held-out text, through the CPU model (src/model/m3_model.cpp) with the GPU paths' numerics emulated
// by a cpu::matmul_nt input hook:
//   - the bf16 checkpoint with fp32 activations (the reference) and with bf16 activations (the bf16 GPU path);
//   - the bf16 model with e4m3 K/V and index-K caches (scales 1, and calibrated amax / 448) against the bf16 cache;
//   - the MXFP8 checkpoint dequantised exactly; requantised to 128×128 blocks (what the executor stores) with bf16
//     activations (the decode rows: W8A16 / e4m3 GEMV, f16 in the MoE — bf16 is the coarser of the two); with e4m3
//     activations per 1×128 into the dense projections and MLPs (cuBLASLt FP8×FP8 prefill) and into the experts'
//     gate/up GEMM, per 1×64 into their down GEMM (the e4m3 wgmma MoE, backend/cuda/moe_grouped_wgmma.cuh), or with
//     the experts on bf16
//     activations (`--fp8-prefill-gemm` MoE off: M3_MOE_FP8_E4M3=0).
//   - index-K alone in e4m3 (K/V bf16; scale 1 as MSA stores it, and calibrated amax / 448) against the bf16 cache:
//     the MSA block selections compared with bf16 index-K's (kvacc::compare_selections: the fp32 run's queries and
//     K/V, only the index-K rounding differs — sets identical, history blocks shared, the attention output of the
//     heads whose set differs), and the whole model's rows split by whether any sparse layer's selection differs
//     from the bf16 cache run's (perplexity, top-1 agreement and logit error on each part).
// Text is read as bytes (ids 0–255: tools/fp8_accuracy/train_tiny_m3.py trains a byte-level tiny M3) and cut into
// sequences of --seq-len; every position's next byte is scored.
//   fp8_eval_text --reference BF16_DIR --checkpoint MXFP8_DIR --text FILE [--seq-len 256] [--seqs N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "base/dtype.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "kv/sequence_kv.h"
#include "model/m3_model.h"
#include "model/weight_plan.h"
#include "kv_accuracy.h"
#include "requant_slot.h"

namespace {

using namespace m3;

// How the hook rounds the input of each weight matrix's GEMM: e4m3 per `block` columns (scale = amax / 448), or bf16.
enum class Act { None, Bf16, E4m3 };
struct Rule {
  const float* W;
  Act act;
  int block;
};
struct Hook {
  std::vector<Rule> rules;
  std::vector<float> buf;
};
const float* hook_fn(const float* x, int64_t T, int64_t K, const float* W, void* ctx) {
  Hook& h = *static_cast<Hook*>(ctx);
  const auto it = std::find_if(h.rules.begin(), h.rules.end(), [&](const Rule& r) { return r.W == W; });
  if (it == h.rules.end() || it->act == Act::None) return nullptr;
  h.buf.assign(x, x + T * K);
  if (it->act == Act::Bf16) {
    for (float& v : h.buf) v = round_to_bf16(v);
    return h.buf.data();
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k0 = 0; k0 < K; k0 += it->block) {
      float* b = h.buf.data() + t * K + k0;
      const int64_t n = std::min<int64_t>(it->block, K - k0);
      float amax = 0.f;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(b[i]));
      const float s = amax > 0.f ? amax / 448.0f : 1.0f;
      for (int64_t i = 0; i < n; ++i) b[i] = e4m3_to_f32(cpu::e4m3_rne(b[i] / s)) * s;
    }
  return h.buf.data();
}

bool is_expert(SlotKind k) {
  return k == SlotKind::ExpertGateUp || k == SlotKind::ExpertDown || k == SlotKind::SharedGateUp ||
         k == SlotKind::SharedDown;
}

// All-position logits of each sequence (one-shot prefill each).
// sel (optional): per sequence, every sparse layer's selection [Hidx, T, top_k] concatenated in layer order.
std::vector<std::vector<float>> run(const M3Config& c, M3Weights w, const std::vector<std::vector<int32_t>>& seqs,
                                    Hook* hook, const KvStorage& kv = {},
                                    std::vector<std::vector<int32_t>>* sel = nullptr) {
  M3Model model(c, std::move(w));
  if (hook) cpu::set_matmul_input_hook(hook_fn, hook);
  std::vector<std::vector<float>> out;
  for (const auto& ids : seqs) {
    const int64_t T = int64_t(ids.size());
    KVCache cache(c, int32_t((T + c.sparse_block_size - 1) / c.sparse_block_size));
    cache.set_storage(kv);
    SequenceKV seq(cache);
    seq.reserve(T);
    SeqInput in{std::span<const int32_t>(ids), 0, seq.pages(), true};
    ForwardTrace trace;
    trace.capture_selection = sel != nullptr;
    out.push_back(model.forward(std::span<const SeqInput>(&in, 1), cache, sel ? &trace : nullptr)[0]);
    if (sel) {
      sel->emplace_back();
      for (const auto& layer : trace.selection)
        for (const auto& v : layer) sel->back().insert(sel->back().end(), v.begin(), v.end());
    }
  }
  cpu::set_matmul_input_hook(nullptr, nullptr);
  return out;
}

struct Score {
  double nll = 0, top1 = 0, agree = 0, err_p50 = 0, err_max = 0;
  int64_t n = 0, decisive = 0, decisive_agree = 0;
};
// Rows whose reference top-1 leads its runner-up by ≥ this many nats (probability ratio ≥ 1.65) are "decisive":
// a byte-level model has many near-ties, where any rounding flips the argmax without changing the prediction.
constexpr double kDecisiveGap = 0.5;
// Mean next-token NLL (nats), top-1 accuracy, top-1 agreement with `ref` (all rows and decisive rows) and the
// row-relative logit error max|a − b| / max|b| (median and max over rows).
// keep (optional): per sequence and position, whether the row counts.
Score score(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref,
            const std::vector<std::vector<int32_t>>& seqs, int64_t V,
            const std::vector<std::vector<char>>* keep = nullptr) {
  Score s;
  std::vector<double> errs;
  for (size_t q = 0; q < seqs.size(); ++q) {
    const auto& ids = seqs[q];
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      if (keep && !(*keep)[q][t]) continue;
      const float* a = &got[q][t * size_t(V)];
      const float* b = &ref[q][t * size_t(V)];
      const float mx = *std::max_element(a, a + V);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(a[v]) - mx);
      s.nll += std::log(z) + mx - a[ids[t + 1]];
      const int64_t ia = std::max_element(a, a + V) - a, ib = std::max_element(b, b + V) - b;
      s.top1 += ia == ids[t + 1];
      s.agree += ia == ib;
      float second = -INFINITY;
      for (int64_t v = 0; v < V; ++v)
        if (v != ib) second = std::max(second, b[v]);
      if (b[ib] - second >= kDecisiveGap) ++s.decisive, s.decisive_agree += ia == ib;
      double e = 0, m = 1e-30;
      for (int64_t v = 0; v < V; ++v)
        e = std::max(e, double(std::fabs(a[v] - b[v]))), m = std::max(m, double(std::fabs(b[v])));
      errs.push_back(e / m);
      ++s.n;
    }
  }
  if (s.n == 0) return s;
  s.nll /= double(s.n), s.top1 /= double(s.n), s.agree /= double(s.n);
  std::sort(errs.begin(), errs.end());
  s.err_p50 = errs[errs.size() / 2], s.err_max = errs.back();
  return s;
}

void print(const char* name, const Score& s, const Score& ref) {
  if (s.n == 0) return (void)std::printf("| %s | — | — | — | — | — | — | — |\n", name);
  std::printf("| %s | %.4f | %.4f | %+.2f %% | %.2f %% | %.2f %% | %.2f %% | %.2e / %.2e |\n", name, std::exp(s.nll),
              s.nll / std::log(2.0), 100.0 * (std::exp(s.nll) / std::exp(ref.nll) - 1.0), 100.0 * s.top1,
              100.0 * s.agree, 100.0 * double(s.decisive_agree) / double(std::max<int64_t>(s.decisive, 1)),
              s.err_p50, s.err_max);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

// Selections of index-K stored as `dt` (scale per layer, empty = 1) against bf16 index-K, summed over the sequences.
kvacc::SelectionStats selections(const M3Config& c, const M3Weights& w, const std::vector<std::vector<int32_t>>& seqs,
                                 KvDtype dt, const std::vector<float>& scale) {
  const M3Model model(c, w);
  kvacc::SelectionStats all;
  for (const auto& ids : seqs) {
    const kvacc::ScriptedRun r = kvacc::run_scripted(model, ids, int64_t(ids.size()), KvStorage{}, true);
    const kvacc::SelectionStats s = kvacc::compare_selections(model, r, dt, scale, KvDtype::BF16, {});
    all.rows += s.rows, all.identical += s.identical, all.ranked_rows += s.ranked_rows;
    all.ranked_identical += s.ranked_identical, all.blocks += s.blocks, all.blocks_shared += s.blocks_shared;
    all.out_err.insert(all.out_err.end(), s.out_err.begin(), s.out_err.end());
  }
  return all;
}

void print_selections(const char* name, const kvacc::SelectionStats& s) {
  auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * double(a) / double(b) : 100.0; };
  std::printf("| %s | %.2f %% | %.2f %% (%lld) | %.2f %% | %zu | %.2e / %.2e / %.2e |\n", name,
              pct(s.identical, s.rows), pct(s.ranked_identical, s.ranked_rows), (long long)s.ranked_rows,
              pct(s.blocks_shared, s.blocks), s.out_err.size(), quantile(s.out_err, 0.5), quantile(s.out_err, 0.9),
              s.out_err.empty() ? 0.0 : *std::max_element(s.out_err.begin(), s.out_err.end()));
}

// Per sequence and position: whether any sparse layer's selection (any index head) differs between a and b.
std::vector<std::vector<char>> differing_rows(const M3Config& c, const std::vector<std::vector<int32_t>>& a,
                                              const std::vector<std::vector<int32_t>>& b,
                                              const std::vector<std::vector<int32_t>>& seqs) {
  const int64_t K = c.sparse_topk_blocks;
  std::vector<std::vector<char>> d(seqs.size());
  for (size_t q = 0; q < seqs.size(); ++q) {
    const int64_t T = int64_t(seqs[q].size());
    d[q].assign(size_t(T), 0);
    M3_CHECK(a[q].size() == b[q].size() && a[q].size() % size_t(T * K) == 0, "selection shapes differ");
    for (size_t r = 0; r < a[q].size() / size_t(K); ++r)  // row r = (layer, head, t) with t = r % T
      if (!std::equal(&a[q][r * K], &a[q][r * K] + K, &b[q][r * K])) d[q][r % size_t(T)] = 1;
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ref_dir, fp8_dir, text;
  int64_t L = 256, max_seqs = 64;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reference") && i + 1 < argc) ref_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--checkpoint") && i + 1 < argc) fp8_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--text") && i + 1 < argc) text = argv[++i];
    else if (!std::strcmp(argv[i], "--seq-len") && i + 1 < argc) L = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--seqs") && i + 1 < argc) max_seqs = std::atoll(argv[++i]);
    else ref_dir.clear(), i = argc;
  }
  if (ref_dir.empty() || fp8_dir.empty() || text.empty() || L < 2)
    return std::fprintf(stderr, "usage: fp8_eval_text --reference BF16_DIR --checkpoint MXFP8_DIR --text FILE "
                                "[--seq-len 256] [--seqs 64]\n"), 2;
  try {
    std::ifstream f(text, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::vector<int32_t>> seqs;
    for (size_t p = 0; p + size_t(L) <= bytes.size() && int64_t(seqs.size()) < max_seqs; p += size_t(L)) {
      seqs.emplace_back();
      for (int64_t i = 0; i < L; ++i) seqs.back().push_back(int32_t(uint8_t(bytes[p + size_t(i)])));
    }
    M3_CHECK(!seqs.empty(), "{}: shorter than one sequence of {} bytes", text, L);

    const M3Config c = load_m3_config(ref_dir + "/config.json");
    const int64_t V = c.vocab_size;
    const SafeTensors st16 = SafeTensors::open(ref_dir), st8 = SafeTensors::open(fp8_dir);
    const M3Weights w16 = M3Weights::load(c, st16), w8 = M3Weights::load(load_m3_config(fp8_dir + "/config.json"), st8);
    const auto ref = run(c, w16, seqs, nullptr);
    const Score s_ref = score(ref, ref, seqs, V);
    std::printf("## %s: %zu sequences × %lld bytes (%lld scored positions)\n\n", text.c_str(), seqs.size(),
                (long long)L, (long long)s_ref.n);
    std::printf("(decisive rows: the reference's top-1 leads by ≥ %.1f nats — %lld of %lld)\n\n", kDecisiveGap,
                (long long)s_ref.decisive, (long long)s_ref.n);
    std::printf("| model (weights; activations into the GEMMs) | perplexity | bits / byte | vs bf16 | top-1 acc. | "
                "top-1 = bf16 | on decisive rows | logit err. vs bf16 p50 / max |\n"
                "|---|---|---|---|---|---|---|---|\n");
    print("bf16; fp32 (the reference)", s_ref, s_ref);

    // bf16 activations into every matrix of the bf16 model: the bf16 GPU path.
    {
      M3Weights w = w16;
      Hook h;
      for (const WeightSlot& s : weight_plan(c))
        if (s.matrix && s.kind != SlotKind::Embed) h.rules.push_back({host_slot(w, s).data(), Act::Bf16, 0});
      print("bf16; bf16 (the bf16 GPU path)", score(run(c, std::move(w), seqs, &h), ref, seqs, V), s_ref);
    }
    print("MXFP8 exact; fp32", score(run(c, w8, seqs, nullptr), ref, seqs, V), s_ref);
    // 128×128 requantised (every MXFP8 matrix), then the activation variants.
    M3Weights wq = w8;
    const auto plan = weight_plan(c);
    for (const WeightSlot& s : plan) {
      if (s.matrix && fp8_tools::slot_pieces_mxfp8(st8, s))
        host_slot(wq, s) = fp8_tools::requantised_slot(st8, s, Fp8Scale::Blk128);
    }
    // The hook rules must point at the model's own vectors: build them on the copy that run() moves in (a moved
    // std::vector keeps its buffer).
    // expert_gu_block / expert_down_block: the activation blocks into the experts' gate/up (x) and down (act) GEMMs.
    auto variant = [&](const char* name, Act dense, int dense_block, Act expert, int expert_gu_block,
                       int expert_down_block) {
      M3Weights w = wq;
      Hook h;
      for (const WeightSlot& s : plan) {
        if (!s.matrix || s.kind == SlotKind::Embed) continue;
        const bool ex = is_expert(s.kind);
        const bool down = s.kind == SlotKind::ExpertDown || s.kind == SlotKind::SharedDown;
        const bool fp8 = fp8_tools::slot_pieces_mxfp8(st8, s);  // else bf16 in the checkpoint (the LM head)
        h.rules.push_back({host_slot(w, s).data(), fp8 ? (ex ? expert : dense) : Act::Bf16,
                           ex ? (down ? expert_down_block : expert_gu_block) : dense_block});
      }
      print(name, score(run(c, std::move(w), seqs, &h), ref, seqs, V), s_ref);
    };
    variant("FP8 128×128; bf16 (decode: W8A16 / GEMV)", Act::Bf16, 0, Act::Bf16, 0, 0);
    variant("FP8 128×128; e4m3 1×128 dense, bf16 experts (prefill, M3_MOE_FP8_E4M3=0)", Act::E4m3, 128, Act::Bf16, 0,
            0);
    variant("FP8 128×128; e4m3 1×128 dense, 1×64 experts (prefill until 2026-12-03e)", Act::E4m3, 128, Act::E4m3, 64,
            64);
    variant("FP8 128×128; e4m3 1×128 dense and expert x, 1×64 expert act (prefill, default)", Act::E4m3, 128,
            Act::E4m3, 128, 64);

    // FP8 K/V and index-K caches (`--kv-cache-dtype fp8`) on the bf16 model, against the bf16 cache: per-tensor
    // scales 1 (no calibration) and amax / 448 from a warm-up pass over the first sequence (kvacc::calibrate_e4m3).
    std::vector<std::vector<int32_t>> sel16;  // the bf16 cache run's MSA selections
    const auto kv16 = run(c, w16, seqs, nullptr, KvStorage::all(KvDtype::BF16), &sel16);
    const Score s_kv16 = score(kv16, kv16, seqs, V);
    std::printf("\n| KV cache (bf16 weights, fp32 activations) | perplexity | bits / byte | vs bf16 KV | top-1 acc. | "
                "top-1 = bf16 KV | on decisive rows | logit err. vs bf16 KV p50 / max |\n"
                "|---|---|---|---|---|---|---|---|\n");
    print("bf16 K / V / index-K", s_kv16, s_kv16);
    print("e4m3, scales 1", score(run(c, w16, seqs, nullptr, KvStorage::all(KvDtype::E4M3)), kv16, seqs, V), s_kv16);
    const KvStorage cal = kvacc::calibrate_e4m3(M3Model(c, w16), seqs[0], true);
    print("e4m3, scales amax / 448 (calibrated)", score(run(c, w16, seqs, nullptr, cal), kv16, seqs, V), s_kv16);

    // FP8 index-K alone (K/V bf16): MSA stores index-K e4m3 unscaled; a calibrated per-layer scale for comparison.
    const KvStorage ik1{KvDtype::BF16, KvDtype::E4M3, {}, {}, {}};
    const KvStorage ikc{KvDtype::BF16, KvDtype::E4M3, {}, {}, cal.ik_scale};
    std::vector<std::vector<int32_t>> sel1, selc;
    const auto kv1 = run(c, w16, seqs, nullptr, ik1, &sel1), kvc = run(c, w16, seqs, nullptr, ikc, &selc);
    print("bf16 K / V, e4m3 index-K (scale 1, MSA's format)", score(kv1, kv16, seqs, V), s_kv16);
    print("bf16 K / V, e4m3 index-K (amax / 448)", score(kvc, kv16, seqs, V), s_kv16);

    std::printf("\n| index-K vs bf16 index-K (MSA selections; the fp32 run's queries and K/V) | (token, index head) "
                "sets identical | ranked rows identical (rows) | history blocks shared | rows differing × query "
                "heads | attention-output err. where they differ p50 / p90 / max |\n|---|---|---|---|---|---|\n");
    print_selections("fp32 (reference noise)", selections(c, w16, seqs, KvDtype::F32, {}));
    print_selections("e4m3, scale 1 (MSA's format)", selections(c, w16, seqs, KvDtype::E4M3, {}));
    print_selections("e4m3, amax / 448", selections(c, w16, seqs, KvDtype::E4M3, cal.ik_scale));

    // The whole model with e4m3 index-K, its rows split by whether any sparse layer's selection (any head) differs
    // from the bf16 cache run's.
    std::printf("\n| e4m3 index-K vs bf16 cache, rows by selection | perplexity | bits / byte | vs bf16 KV (same rows) | "
                "top-1 acc. | top-1 = bf16 KV | on decisive rows | logit err. vs bf16 KV p50 / max |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (int v = 0; v < 2; ++v) {
      const auto d = differing_rows(c, v ? selc : sel1, sel16, seqs);
      auto same = d;
      for (auto& r : same)
        for (char& x : r) x = !x;
      const auto& got = v ? kvc : kv1;
      const Score sd = score(got, kv16, seqs, V, &d), ss = score(got, kv16, seqs, V, &same);
      char name[160];
      std::snprintf(name, sizeof name, "%s: selection differs (%lld rows)", v ? "amax / 448" : "scale 1",
                    (long long)sd.n);
      print(name, sd, score(kv16, kv16, seqs, V, &d));
      std::snprintf(name, sizeof name, "%s: selections identical (%lld rows)", v ? "amax / 448" : "scale 1",
                    (long long)ss.n);
      print(name, ss, score(kv16, kv16, seqs, V, &same));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_eval_text: %s\n", e.what());
    return 1;
  }
  return 0;
}
