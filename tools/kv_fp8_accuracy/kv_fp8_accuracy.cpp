// kv_fp8_accuracy [--prefill N] [--gap REL] [fixture dirs...]: FP8 (e4m3) K/V and index-K against bf16 K/V on the
// CPU model (issue 15 item 5; docs/FP8.md §8.1, bench/results/2026-12-02b-fp8-kv-accuracy-cpu.md). Per fixture: a
// teacher-forced scripted prefill + decode of its golden input_ids with fp32 / bf16 / e4m3 caches; top-1 agreement,
// logit error, MSA selections of e4m3 vs bf16 index-K and the attention-output error where they differ.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "io/safetensors.h"
#include "kv_accuracy.h"

using namespace m3;
using namespace m3::kvacc;

namespace {

void print_logits(const char* name, const LogitStats& s, double gap) {
  std::printf("| %s | %.2f %% (%lld/%lld) | %.2f %% (%lld/%lld, gap ≥ %.0e·max) | %.2e | %.2e | %.2e |\n", name,
              100 * s.agreement(), (long long)s.agree, (long long)s.rows, 100 * s.decisive_agreement(),
              (long long)s.decisive_agree, (long long)s.decisive_rows, gap, s.err_p50, s.err_p90, s.err_max);
}

void print_sel(const char* name, const SelectionStats& s) {
  std::printf("| %s | %.2f %% (%lld/%lld) | %.2f %% (%lld/%lld) | %.2f %% | %zu | %.2e | %.2e |\n", name,
              100.0 * double(s.identical) / double(s.rows), (long long)s.identical, (long long)s.rows,
              100.0 * double(s.ranked_identical) / double(s.ranked_rows), (long long)s.ranked_identical,
              (long long)s.ranked_rows, 100.0 * double(s.blocks_shared) / double(s.blocks), s.out_err.size(),
              s.out_err_p50(), s.out_err_max());
}

// RMS of (stored − written) / RMS of written over every layer of one tensor.
double rms_err(const ScriptedRun& r, KvTensor t, int layers) {
  double e = 0, x = 0;
  for (int l = 0; l < layers; ++l) {
    e += r.cache->write_stats(t, l).err_sq;
    x += r.cache->write_stats(t, l).sum_sq;
  }
  return x > 0 ? std::sqrt(e / x) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t prefill = 256;
  double gap = 1e-2;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--prefill" && i + 1 < argc) prefill = std::stoll(argv[++i]);
    else if (a == "--gap" && i + 1 < argc) gap = std::stod(argv[++i]);
    else dirs.push_back(a);
  }
  if (dirs.empty())
    for (const char* f : {"tiny_sparse_f32", "tiny_sparse_mxfp8", "tiny_hf_layout"})
      dirs.push_back(std::string("tests/golden/fixtures/") + f);

  for (const std::string& dir : dirs) {
    const M3Model model = M3Model::load(dir);
    const M3Config& c = model.config();
    const std::vector<int32_t> ids = fixture_ids(dir);
    // Calibration traffic: as many uniformly random tokens (fixed seed), not the evaluated sequence.
    std::mt19937 rng(7);
    std::vector<int32_t> warm(ids.size());
    for (int32_t& t : warm) t = int32_t(rng() % uint32_t(c.vocab_size));
    const KvStorage cal = calibrate_e4m3(model, warm, false), cal_ik = calibrate_e4m3(model, warm, true);
    const KvStorage bf16 = KvStorage::all(KvDtype::BF16), one = KvStorage::all(KvDtype::E4M3);
    KvStorage kv_only = cal, ik_only = one;  // e4m3 on one side only, bf16 on the other
    kv_only.index_dtype = KvDtype::BF16;
    ik_only.dtype = KvDtype::BF16;

    std::printf("\n## %s: T = %zu (prefill %lld + %lld decode steps), V = %lld\n", dir.c_str(), ids.size(),
                (long long)prefill, (long long)(int64_t(ids.size()) - prefill), (long long)c.vocab_size);
    std::printf("calibrated scales (amax/448 of the random-token warm-up), per layer k / v / index-K:");
    for (int l = 0; l < c.num_layers; ++l)
      std::printf(" [%d] %.3g / %.3g / %.3g", l, cal_ik.k_scale[l], cal_ik.v_scale[l], cal_ik.ik_scale[l]);
    std::printf("\n");

    const ScriptedRun f32 = run_scripted(model, ids, prefill, KvStorage{}, true);
    const ScriptedRun rb = run_scripted(model, ids, prefill, bf16);
    struct Variant {
      const char* name;
      KvStorage st;
    };
    const Variant vars[] = {{"e4m3 K/V calibrated, index-K scale 1", cal},
                            {"e4m3 K/V and index-K calibrated", cal_ik},
                            {"e4m3 everything scale 1", one},
                            {"e4m3 K/V calibrated, bf16 index-K", kv_only},
                            {"bf16 K/V, e4m3 index-K scale 1 (MSA's index cache)", ik_only},
                            {"e4m3 calibrated ×1/64 (bad: saturates)", scaled(cal_ik, 1.0f / 64)},
                            {"e4m3 calibrated ×2^16 (bad: underflows)", scaled(cal_ik, 65536.0f)}};
    std::printf("\nlogits (teacher-forced, every row) | top-1 = reference | decisive rows | err p50 | p90 | max\n");
    std::printf("|---|---|---|---|---|---|\n");
    print_logits("bf16 K/V vs fp32 K/V", compare_logits(rb.logits, f32.logits, c.vocab_size, gap), gap);
    for (const Variant& v : vars) {
      const ScriptedRun r = run_scripted(model, ids, prefill, v.st);
      int64_t sat = 0, n = 0;
      for (int l = 0; l < c.num_layers; ++l)
        for (KvTensor t : {KvTensor::K, KvTensor::V, KvTensor::IndexK}) {
          sat += r.cache->write_stats(t, l).saturated;
          n += r.cache->write_stats(t, l).written;
        }
      char rms[96];
      std::snprintf(rms, sizeof rms, ", RMS rel. rounding error K %.2e V %.2e index-K %.2e", rms_err(r, KvTensor::K, c.num_layers),
                    rms_err(r, KvTensor::V, c.num_layers), rms_err(r, KvTensor::IndexK, c.num_layers));
      std::string nm = std::string(v.name) + " vs bf16 (saturated " + std::to_string(sat) + "/" + std::to_string(n) + rms + ")";
      print_logits(nm.c_str(), compare_logits(r.logits, rb.logits, c.vocab_size, gap), gap);
      nm = std::string(v.name) + " vs fp32";
      print_logits(nm.c_str(), compare_logits(r.logits, f32.logits, c.vocab_size, gap), gap);
    }
    std::printf("\ntop-1 agreement of e4m3 (calibrated, index-K 1) vs bf16 by the bf16 top-2 gap (share of max|logit|):");
    const ScriptedRun rc = run_scripted(model, ids, prefill, cal);
    for (double g : {0.0, 1e-3, 3e-3, 1e-2, 3e-2}) {
      const LogitStats s = compare_logits(rc.logits, rb.logits, c.vocab_size, g);
      std::printf(" ≥%.0e: %.2f %% of %lld;", g, 100 * s.decisive_agreement(), (long long)s.decisive_rows);
    }
    {
      const size_t split = size_t(prefill * c.vocab_size);
      const std::vector<float> pc(rc.logits.begin(), rc.logits.begin() + split), pb(rb.logits.begin(), rb.logits.begin() + split);
      const std::vector<float> dc(rc.logits.begin() + split, rc.logits.end()), db(rb.logits.begin() + split, rb.logits.end());
      const LogitStats sp = compare_logits(pc, pb, c.vocab_size, gap), sd = compare_logits(dc, db, c.vocab_size, gap);
      std::printf("\nsame, prefill rows: %.2f %% (decisive %.2f %% of %lld, p50 %.2e); decode rows: %.2f %% (decisive "
                  "%.2f %% of %lld, p50 %.2e)",
                  100 * sp.agreement(), 100 * sp.decisive_agreement(), (long long)sp.decisive_rows, sp.err_p50,
                  100 * sd.agreement(), 100 * sd.decisive_agreement(), (long long)sd.decisive_rows, sd.err_p50);
    }
    std::printf("\n\nMSA selections, index-K only (fp32 run's queries, K/V), (index head, token) rows | identical | "
                "identical, ranked rows | history blocks shared | differing q-head rows | attn out err p50 | max\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    print_sel("bf16 vs fp32", compare_selections(model, f32, KvDtype::BF16, {}, KvDtype::F32, {}));
    print_sel("e4m3 scale 1 vs bf16", compare_selections(model, f32, KvDtype::E4M3, {}, KvDtype::BF16, {}));
    print_sel("e4m3 calibrated vs bf16", compare_selections(model, f32, KvDtype::E4M3, cal_ik.ik_scale, KvDtype::BF16, {}));
    print_sel("e4m3 calibrated ×1/64 vs bf16",
              compare_selections(model, f32, KvDtype::E4M3, scaled(cal_ik, 1.0f / 64).ik_scale, KvDtype::BF16, {}));
  }
  return 0;
}
