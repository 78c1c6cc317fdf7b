// MSA prefill on the real MiniMax prefill workload shapes (issue 10 item 5): the 128 benchmark cases of
// ../shared/data/msa_prefill_workload (listed by scripts/prefill_cases.py; each case = one prefill step of 1–18
// sequences with cached prefixes), at M3 TP1 shapes (64 q / 4 KV heads × 128, 4 index heads × 128, block 128,
// top-16), random bf16 data on a random page table seeded from the case id. Per case and selection kind
// (random = low neighbour overlap, spread = neighbouring rows choose the same blocks; prefill_inputs.h): the
// union-tile kernel, the KV-block-major kernel and the per-tile router (msa_prefill_sparse.cuh), then the
// tensor-core indexer + top-16 as two kernels (scores, msa_topk) and fused (run_topk), with the number of rows
// whose selections differ. Median of --reps CUDA-graph replays (one call per graph; --eager: plain launches, as
// before 2026-12-02d) after 2 warm-ups; inputs are not rotated, so the smallest cases run partly from L2 (the
// table says the working set). Aggregates follow the manifest's rule: representative cases weighted by
// representative_weight (Σ w·t / Σ w; useful TFLOP/s = Σ w·F / Σ w·t). --thresholds a,b,…: the router also at
// these union-width thresholds (MsaPrefillSparse::set_threshold_pct), with how often each is within 5 % of the
// best kernel — the data to fit the default on.
//   bench_prefill_cases --cases FILE [--reps N] [--limit N] [--eager] [--thresholds a,b,...]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/msa_indexer_tc.cuh"
#include "backend/cuda/msa_prefill_sparse.cuh"
#include "backend/cuda/msa_topk.cuh"
#include "bench_common/event_timer.h"
#include "bench_prefill_tc/prefill_inputs.h"

namespace {

using namespace m3;
constexpr int kHkv = 4, kG = 16, kHq = kHkv * kG, kD = 128, kB = 128, kTopK = 16, kHi = 4, kDi = 128;

struct Case {
  std::string id, tags;
  double weight = 0;
  std::vector<int> q, p;
};

std::vector<int> ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoi(x));
  return v;
}

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream f(path);
  if (!f) cuda::failf("bench_prefill_cases: cannot read %s (make it with scripts/prefill_cases.py)", path.c_str());
  std::vector<Case> out;
  for (std::string line; std::getline(f, line);) {
    std::stringstream ss(line);
    Case c;
    int batch = 0;
    std::string q, p;
    if (!(ss >> c.id >> c.weight >> c.tags >> batch >> q >> p)) continue;
    c.q = ints(q);
    c.p = ints(p);
    if (int(c.q.size()) != batch || c.p.size() != c.q.size()) cuda::failf("bad case line: %s", line.c_str());
    out.push_back(std::move(c));
  }
  return out;
}

struct Agg {
  double w = 0, wt = 0, wf = 0;
  void add(double weight, double ms, double flops) { w += weight, wt += weight * ms, wf += weight * flops; }
};

}  // namespace

int main(int argc, char** argv) {
  std::string cases_path;
  int reps = 10, limit = 1 << 30;
  bool eager = false;
  std::vector<int> thresholds;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) {
      cases_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--limit") && i + 1 < argc) {
      limit = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--eager")) {
      eager = true;
    } else if (!std::strcmp(argv[i], "--thresholds") && i + 1 < argc) {
      thresholds = ints(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_prefill_cases --cases FILE [--reps N] [--limit N] [--eager] [--thresholds a,b,...]\n");
      return 2;
    }
  }
  try {
    if (cases_path.empty()) cuda::failf("--cases FILE is required");
    if (cuda::device_count() == 0) return std::printf("bench_prefill_cases: no CUDA device\n"), 0;
    const std::vector<Case> cases = read_cases(cases_path);
    std::printf("%zu cases from %s; ms = median of %d %s\n\n", cases.size(), cases_path.c_str(), reps,
                eager ? "eager calls (CUDA events)" : "CUDA-graph replays");
    // Median ms of f on a stream: graph replays, or eager calls on the legacy stream (--eager).
    auto time_ms = [&](const std::function<void(cudaStream_t)>& f) {
      const std::vector<float> t = eager ? bench::time_sorted_ms([&] { f(nullptr); }, 2, reps)
                                         : bench::time_graph_sorted_ms(f, 2, reps);
      return double(t[t.size() / 2]);
    };
    std::vector<int> thr_within5[2];
    std::vector<Agg> thr_agg[2];
    for (int s = 0; s < 2; ++s) thr_within5[s].assign(thresholds.size(), 0), thr_agg[s].assign(thresholds.size(), Agg{});
    std::printf("| case | tags | seqs | T | max KV | set (MB) | sel | union | KV-major | routed | best | routed/best | "
                "indexer+top16 | fused top16 (rows ≠) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    Agg agg[2][3];  // [selection][union, kvmajor, routed], representative cases
    int within5[2] = {0, 0}, counted[2] = {0, 0};
    Agg idx_agg[2];  // indexer: [scores + msa_topk, fused], representative cases
    size_t total_differ = 0;
    const float scale = 1.f / std::sqrt(float(kD));
    int n_done = 0;
    for (const Case& c : cases) {
      if (n_done++ >= limit) break;
      std::mt19937_64 g(std::hash<std::string>{}(c.id));
      std::vector<int32_t> pos, row_seq, pt_indptr{0}, pt_pages;
      int total_pages = 0, max_kv = 0;
      for (size_t i = 0; i < c.q.size(); ++i) {
        total_pages += (c.p[i] + c.q[i] + kB - 1) / kB;
        max_kv = std::max(max_kv, c.p[i] + c.q[i]);
      }
      const int num_pages = total_pages + 1;
      std::vector<int32_t> perm(num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      int next = 0;
      for (size_t i = 0; i < c.q.size(); ++i) {
        for (int j = 0; j < c.q[i]; ++j) pos.push_back(c.p[i] + j), row_seq.push_back(int(i));
        for (int b = 0; b < (c.p[i] + c.q[i] + kB - 1) / kB; ++b) pt_pages.push_back(perm[next++]);
        pt_indptr.push_back(int(pt_pages.size()));
      }
      const int T = int(pos.size());
      const int64_t half = int64_t(kHkv) * kB * kD, stride = 2 * half, ik_stride = int64_t(kB) * kDi;
      cuda::DeviceBuffer<uint16_t> pool(size_t(stride) * num_pages), ikp(size_t(ik_stride) * num_pages),
          q(size_t(T) * kHq * kD), iq(size_t(T) * kHi * kDi);
      bench::fill_bf16(pool, pool.size(), g());
      bench::fill_bf16(ikp, ikp.size(), g());
      bench::fill_bf16(q, q.size(), g());
      bench::fill_bf16(iq, iq.size(), g());
      cuda::DeviceBuffer<int32_t> dpos(T), dseq(T), dind(pt_indptr.size()), dpages(pt_pages.size()),
          dsel(size_t(kHkv) * T * kTopK);
      cuda::upload(dpos, pos.data(), pos.size(), nullptr);
      cuda::upload(dseq, row_seq.data(), row_seq.size(), nullptr);
      cuda::upload(dind, pt_indptr.data(), pt_indptr.size(), nullptr);
      cuda::upload(dpages, pt_pages.data(), pt_pages.size(), nullptr);
      cuda::DeviceBuffer<float> out(size_t(T) * kHq * kD);
      const cuda::DevStepRows rows{dpos.get(), dseq.get(), dind.get(), dpages.get(), T};
      const cuda::DevPagedKVBf16 kv{pool.get(), pool.get() + half, stride, num_pages, kHkv, kB, kD};
      const double flops = bench::sparse_useful_flops(pos, kHq);
      const double set_mb = double(pool.size() * 2 + q.size() * 2 + out.size() * 4) / 1e6;

      // Indexer (selection-independent).
      cuda::MsaIndexerTc idx;
      idx.plan(pos, row_seq, kHi, kDi, kB, nullptr);
      cuda::DeviceBuffer<float> scores(size_t(kHi) * T * idx.max_cols());
      cuda::DeviceBuffer<int32_t> isel(size_t(kHi) * T * kTopK);
      auto fi = [&](cudaStream_t st) {
        idx.run(iq.get(), ikp.get(), ik_stride, num_pages, rows, scores.get(), st);
        cuda::msa_topk(scores.get(), T, kHi, dpos.get(), kB, idx.max_cols(), kTopK, isel.get(), st);
      };
      const double idx_ms = time_ms(fi);
      // Fused scores + top-16 (run_topk, default pipeline): time and agreement with the two-kernel selection.
      cuda::DeviceBuffer<int32_t> fsel(size_t(kHi) * T * kTopK);
      auto ff = [&](cudaStream_t st) {
        idx.run_topk(iq.get(), ikp.get(), ik_stride, num_pages, rows, kTopK, fsel.get(), st);
      };
      const double fused_ms = time_ms(ff);
      size_t fused_differ = 0;
      {
        std::vector<int32_t> a(isel.size()), b(fsel.size());
        M3_CUDA_CHECK(cudaMemcpy(a.data(), isel.get(), a.size() * 4, cudaMemcpyDeviceToHost));
        M3_CUDA_CHECK(cudaMemcpy(b.data(), fsel.get(), b.size() * 4, cudaMemcpyDeviceToHost));
        for (size_t r = 0; r < a.size(); r += kTopK) fused_differ += !std::equal(&a[r], &a[r] + kTopK, &b[r]);
      }
      total_differ += fused_differ;
      if (c.weight > 0) idx_agg[0].add(c.weight, idx_ms, 0), idx_agg[1].add(c.weight, fused_ms, 0);

      for (int s = 0; s < 2; ++s) {
        const std::vector<int32_t> sel = bench::make_selection(pos, s == 1, g);
        cuda::upload(dsel, sel.data(), sel.size(), nullptr);
        double ms[3];
        const cuda::MsaPrefillSparse::Mode modes[3] = {cuda::MsaPrefillSparse::Mode::Union,
                                                       cuda::MsaPrefillSparse::Mode::KvMajor,
                                                       cuda::MsaPrefillSparse::Mode::Auto};
        for (int v = 0; v < 3; ++v) {
          cuda::MsaPrefillSparse attn;
          // Auto gets the rows (the engine's call): a step whose rows' selections are all fixed skips the router.
          const bool rows_known = modes[v] == cuda::MsaPrefillSparse::Mode::Auto;
          attn.plan(T, kHkv, kG, kD, kB, kTopK, num_pages, modes[v], rows_known ? &pos : nullptr,
                    rows_known ? &row_seq : nullptr);
          auto f = [&](cudaStream_t st) { attn.run(q.get(), dsel.get(), rows, kv, scale, out.get(), st); };
          f(nullptr);
          attn.check(nullptr);
          ms[v] = time_ms(f);
        }
        const double best = std::min(ms[0], ms[1]);
        std::string thr_cols;
        cuda::MsaPrefillSparse attn;  // one plan (its buffers) for every threshold
        if (!thresholds.empty()) attn.plan(T, kHkv, kG, kD, kB, kTopK, num_pages, cuda::MsaPrefillSparse::Mode::Auto);
        for (size_t k = 0; k < thresholds.size(); ++k) {
          attn.set_threshold_pct(thresholds[k]);
          const double mt =
              time_ms([&](cudaStream_t st) { attn.run(q.get(), dsel.get(), rows, kv, scale, out.get(), st); });
          char b[48];
          std::snprintf(b, sizeof b, " %d%%: %.3f", thresholds[k], mt);
          thr_cols += b;
          thr_within5[s][k] += mt <= 1.05 * best;
          if (c.weight > 0) thr_agg[s][k].add(c.weight, mt, flops);
        }
        std::printf("| %s | %s | %zu | %d | %d | %.0f | %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f | %.3f (%zu) |%s\n",
                    c.id.c_str() + 8, c.tags.c_str(), c.q.size(), T, max_kv, set_mb, s ? "spread" : "random", ms[0],
                    ms[1], ms[2], best, ms[2] / best, idx_ms, fused_ms, fused_differ, thr_cols.c_str());
        ++counted[s];
        within5[s] += ms[2] <= 1.05 * best;
        if (c.weight > 0)
          for (int v = 0; v < 3; ++v) agg[s][v].add(c.weight, ms[v], flops);
      }
      std::fflush(stdout);
    }
    std::printf("\n## Representative-weighted aggregates (Σ w·t / Σ w; useful TFLOP/s = Σ w·F / Σ w·t)\n\n");
    std::printf("| selection | union | KV-major | routed | router within 5 %% of best (all cases) |\n|---|---|---|---|---|\n");
    for (int s = 0; s < 2; ++s) {
      std::printf("| %s |", s ? "spread" : "random");
      for (int v = 0; v < 3; ++v)
        std::printf(" %.3f ms (%.0f TF/s) |", agg[s][v].wt / std::max(agg[s][v].w, 1e-9),
                    agg[s][v].wf / std::max(agg[s][v].wt * 1e-3, 1e-12) / 1e12);
      std::printf(" %d / %d |\n", within5[s], counted[s]);
    }
    if (!thresholds.empty()) {
      std::printf("\n## Router threshold sweep: within 5 %% of the best kernel (all cases) and representative-weighted "
                  "ms\n\n| threshold %% | random: within 5 %% | random ms | spread: within 5 %% | spread ms |\n"
                  "|---|---|---|---|---|\n");
      for (size_t k = 0; k < thresholds.size(); ++k)
        std::printf("| %d | %d / %d | %.3f | %d / %d | %.3f |\n", thresholds[k], thr_within5[0][k], counted[0],
                    thr_agg[0][k].wt / std::max(thr_agg[0][k].w, 1e-9), thr_within5[1][k], counted[1],
                    thr_agg[1][k].wt / std::max(thr_agg[1][k].w, 1e-9));
    }
    std::printf("\n| indexer + top-16 (representative-weighted) | scores + msa_topk | fused top-16 | rows whose fused "
                "selection differs (all cases) |\n|---|---|---|---|\n| ms | %.3f | %.3f | %zu |\n",
                idx_agg[0].wt / std::max(idx_agg[0].w, 1e-9), idx_agg[1].wt / std::max(idx_agg[1].w, 1e-9),
                total_differ);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefill_cases: %s\n", e.what());
    return 1;
  }
  return 0;
}
