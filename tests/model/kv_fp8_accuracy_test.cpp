// FP8 (e4m3) K/V and index-K caches against bf16 ones through the CPU model on the golden fixture tiny_sparse_f32
// (issue 15 item 5; docs/FP8.md §8.1; bench/results/2026-12-02b-fp8-kv-accuracy-cpu.md has every fixture and
// variant): teacher-forced prefill of 256 tokens + 192 decode steps. What is asserted is what the fixture meets:
//   - bf16 K/V vs fp32 K/V and e4m3 index-K (MSA's unscaled format) with bf16 K/V vs all-bf16: top-1 agreement
//     ≥ 99 % on decisive rows (the target),
//   - e4m3 K/V with calibrated scales vs bf16: ≥ 95 % decisive agreement and median row error ≤ 3e-2 of max|logit|.
//     The 99 % target is NOT met for e4m3 K/V on these fixtures (measured 95.3–97.4 %): they are tiny models with
//     random weights whose argmax flips under small perturbations (bf16 GEMM activations alone, 0.3 % RMS: 95.1 %
//     all rows, docs/FP8.md §3); e4m3's 3 mantissa bits perturb every K and V by 2.65 % RMS (bf16: 0.17 %).
// Each check must also fail where it should: a 64× too small scale (saturating K/V) misses them.
#include <gtest/gtest.h>

#include <random>

#include "io/safetensors.h"
#include "kv_accuracy.h"

namespace m3::kvacc {
namespace {

constexpr double kGap = 1e-2;  // decisive row: reference top-2 gap ≥ 1 % of the row's max|logit|

bool meets(const LogitStats& s, double agreement, double p50) {
  return s.decisive_agreement() >= agreement && s.err_p50 <= p50;
}

TEST(KvFp8Accuracy, E4m3CachesAgainstBf16OnTheSparseFixture) {
  const std::string dir = std::string(M3_SOURCE_DIR) + "/tests/golden/fixtures/tiny_sparse_f32";
  const M3Model model = M3Model::load(dir);
  const int64_t V = model.config().vocab_size;
  const std::vector<int32_t> ids = fixture_ids(dir);
  std::mt19937 rng(7);  // calibration traffic: random tokens, not the evaluated sequence
  std::vector<int32_t> warm(ids.size());
  for (int32_t& t : warm) t = int32_t(rng() % uint32_t(V));
  const KvStorage cal_ik = calibrate_e4m3(model, warm, true);  // amax/448 per layer and tensor
  KvStorage cal = cal_ik;
  cal.ik_scale.clear();  // index-K unscaled, as MSA stores it

  const ScriptedRun f32 = run_scripted(model, ids, 256, KvStorage{}, true);
  const ScriptedRun bf16 = run_scripted(model, ids, 256, KvStorage::all(KvDtype::BF16));
  KvStorage ik_only = KvStorage::all(KvDtype::E4M3);
  ik_only.dtype = KvDtype::BF16;
  const ScriptedRun ik = run_scripted(model, ids, 256, ik_only);
  const ScriptedRun e4m3 = run_scripted(model, ids, 256, cal);
  const ScriptedRun bad = run_scripted(model, ids, 256, scaled(cal, 1.0f / 64));

  const LogitStats s_bf16 = compare_logits(bf16.logits, f32.logits, V, kGap);
  const LogitStats s_ik = compare_logits(ik.logits, bf16.logits, V, kGap);
  const LogitStats s_e4m3 = compare_logits(e4m3.logits, bf16.logits, V, kGap);
  const LogitStats s_bad = compare_logits(bad.logits, bf16.logits, V, kGap);
  std::printf("[ note ] decisive top-1 agreement: bf16 vs fp32 %.2f %%, e4m3 index-K %.2f %%, e4m3 K/V %.2f %% "
              "(p50 %.2e, all rows %.2f %%), bad scale %.2f %%\n",
              100 * s_bf16.decisive_agreement(), 100 * s_ik.decisive_agreement(), 100 * s_e4m3.decisive_agreement(),
              s_e4m3.err_p50, 100 * s_e4m3.agreement(), 100 * s_bad.decisive_agreement());
  EXPECT_GT(s_e4m3.decisive_rows, 300);
  EXPECT_TRUE(meets(s_bf16, 0.99, 3e-3));
  EXPECT_TRUE(meets(s_ik, 0.99, 3e-3));
  EXPECT_TRUE(meets(s_e4m3, 0.95, 3e-2));
  EXPECT_FALSE(meets(s_bad, 0.95, 3e-2));
  EXPECT_FALSE(meets(s_bad, 0.99, 3e-3));
  // The calibration leaves almost nothing saturated; the bad scale saturates most values.
  int64_t sat = 0, sat_bad = 0, n = 0;
  for (int l = 0; l < model.config().num_layers; ++l)
    for (KvTensor t : {KvTensor::K, KvTensor::V}) {
      sat += e4m3.cache->write_stats(t, l).saturated;
      sat_bad += bad.cache->write_stats(t, l).saturated;
      n += e4m3.cache->write_stats(t, l).written;
    }
  EXPECT_LT(sat, n / 1000);
  EXPECT_GT(sat_bad, n / 2);

  // MSA selections from e4m3 vs bf16 index-K with everything else equal (the fp32 run's queries and K/V).
  const SelectionStats sel = compare_selections(model, f32, KvDtype::E4M3, {}, KvDtype::BF16, {});
  const SelectionStats sel_bad =
      compare_selections(model, f32, KvDtype::E4M3, scaled(cal_ik, 1.0f / 64).ik_scale, KvDtype::BF16, {});
  const SelectionStats sel_ref = compare_selections(model, f32, KvDtype::BF16, {}, KvDtype::F32, {});
  std::printf("[ note ] ranked selections identical: e4m3 vs bf16 %.2f %% (blocks shared %.2f %%), bf16 vs fp32 "
              "%.2f %%, bad %.2f %%; attention-output error where they differ p50 %.3g\n",
              100.0 * double(sel.ranked_identical) / double(sel.ranked_rows),
              100.0 * double(sel.blocks_shared) / double(sel.blocks),
              100.0 * double(sel_ref.ranked_identical) / double(sel_ref.ranked_rows),
              100.0 * double(sel_bad.ranked_identical) / double(sel_bad.ranked_rows), sel.out_err_p50());
  ASSERT_GT(sel.ranked_rows, 1000);
  EXPECT_GE(double(sel.ranked_identical), 0.85 * double(sel.ranked_rows));
  EXPECT_GE(double(sel.blocks_shared), 0.95 * double(sel.blocks));
  EXPECT_LT(double(sel_bad.ranked_identical), 0.5 * double(sel_bad.ranked_rows));
  EXPECT_GE(double(sel_ref.ranked_identical), 0.98 * double(sel_ref.ranked_rows));
}

}  // namespace
}  // namespace m3::kvacc
