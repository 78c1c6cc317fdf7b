// Accuracy of FP8 (e4m3) K/V and index-K caches against bf16 ones on the CPU reference model (issue 15 item 5;
// docs/FP8.md §8.1). A fixture's token sequence runs as a scripted, teacher-forced prefill of `prefill` tokens then
// one-token decode steps (every run sees the same tokens), with the cache storing fp32, bf16 or e4m3 values
// (kv/kv_cache.h KvStorage: the values the GPU cache writer stores and the decode kernels read).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/m3_model.h"

namespace m3::kvacc {

struct ScriptedRun {
  std::vector<float> logits;                   // [T, V]: row t = the logits after token t
  std::vector<std::vector<float>> q, index_q;  // [layer] [T, Hq, D] / [T, Hidx, Di] (capture only; empty if dense)
  std::unique_ptr<KVCache> cache;              // holds every token's K, V, index-K at the end
  std::vector<int32_t> pages;                  // the sequence's page table
};

ScriptedRun run_scripted(const M3Model& model, const std::vector<int32_t>& ids, int64_t prefill, const KvStorage& st,
                         bool capture_queries = false);

// Per-tensor scales amax/448 from the fp32 cache writes of a warm-up run of `warmup` ids (the calibration a server
// would do on sample traffic). ik_calibrated = false keeps index-K unscaled (scale 1, as MSA stores it).
KvStorage calibrate_e4m3(const M3Model& model, const std::vector<int32_t>& warmup, bool ik_calibrated);
// Every scale multiplied by f (a deliberately bad scale for the checks that must fail).
KvStorage scaled(KvStorage st, float f);

struct LogitStats {
  int64_t rows = 0, agree = 0;                  // top-1 of a equal to top-1 of b
  int64_t decisive_rows = 0, decisive_agree = 0;  // rows whose b top-2 gap ≥ gap_rel · max|b row|
  double err_p50 = 0, err_p90 = 0, err_max = 0;   // per row max|a − b| / max|b| (the golden test's measure)
  double agreement() const { return rows ? double(agree) / double(rows) : 1.0; }
  double decisive_agreement() const { return decisive_rows ? double(decisive_agree) / double(decisive_rows) : 1.0; }
};
LogitStats compare_logits(const std::vector<float>& a, const std::vector<float>& b, int64_t V, double gap_rel);

// MSA selections with the index-K of one cache rounded two ways, everything else equal: the queries and K/V of one
// fp32 run (capture_queries), so only the index-K rounding differs. Counts (index head, token) rows of every sparse
// layer; `ranked` rows are those with more visible blocks than top-k (the others select every block).
struct SelectionStats {
  int64_t rows = 0, identical = 0, ranked_rows = 0, ranked_identical = 0;
  int64_t blocks = 0, blocks_shared = 0;  // selected history blocks of ranked rows, and those both chose
  // Attention output of the query heads of a differing row: ‖o_a − o_b‖ / ‖o_b‖ over the head's D values.
  std::vector<double> out_err;
  double out_err_p50() const;
  double out_err_max() const;
};
// Index-K rounding: BF16, or E4M3 with ik_scale[layer] (empty = 1); F32 = as stored.
SelectionStats compare_selections(const M3Model& model, const ScriptedRun& fp32_run, KvDtype a_dtype,
                                  const std::vector<float>& a_scale, KvDtype b_dtype,
                                  const std::vector<float>& b_scale);

// The token ids a golden fixture was recorded with (`input_ids` of <dir>/golden.safetensors).
std::vector<int32_t> fixture_ids(const std::string& dir);

}  // namespace m3::kvacc
