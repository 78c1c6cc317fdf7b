// Benchmark of the tensor-core union-tile MSA prefill (backend/cuda/msa_prefill_tc.cuh) at the issue-10 shapes:
// one 16,384-token chunk at KV 16k / 32k / 64k / 128k (prefix = KV − 16,384), 64 q / 4 KV heads × 128, block 128,
// top-16, random bf16 q/K/V on a random page table. Two selections: "random" (history blocks uniform without
// replacement, low neighbour overlap, the vLLM anchor's setting) and "spread" (history spread evenly over
// [0, local) with a per-head offset: neighbouring rows pick the same blocks, the MSA harness's synthetic).
// Useful FLOPs by the MSA convention: 4·D·Hq·Σ selected_tokens(p); η = Σ selected blocks / (4·Σ |union| of each
// 4-token warpgroup) is the share of issued MMA work that is useful. CUDA-event median of 20 after 3 warm-ups.
// The KV-block-major kernel (msa_prefill_kvmajor.cuh) on the same selections: CSR build + attention + combine timed
// together (one run() call), with the max |difference| to the union-tile output. Also the dense causal mode
// (run_dense) on the same chunk: useful FLOPs 4·D·Hq·Σ (p + 1), median of 10.
// The prefill indexer (msa_indexer_tc.cuh): scores only, scores + msa_topk (two kernels) and the fused top-16
// (serial and overlap pipelines), inputs L2-rotated, with the fused selections compared to msa_topk's.
//   bench_prefill_tc [--kv N ...] [--indexer-only | --attention-only] [--sweep-order]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/msa_indexer_tc.cuh"
#include "backend/cuda/msa_prefill_kvmajor.cuh"
#include "backend/cuda/msa_topk.cuh"
#include "backend/cuda/msa_prefill_sparse.cuh"
#include "backend/cuda/msa_prefill_tc.cuh"
#include "bench_common/event_timer.h"
#include "bench_prefill_tc/prefill_inputs.h"

namespace {

using namespace m3;
using bench::fill_bf16;
using bench::make_selection;
constexpr int kT = 16384, kHkv = 4, kG = 16, kHq = kHkv * kG, kD = 128, kB = 128, kTopK = 16;

// η: selected blocks over the blocks each 4-token consumer warpgroup issues (its union).
double union_efficiency(const std::vector<int32_t>& sel, int T) {
  double used = 0, issued = 0;
  for (int h = 0; h < kHkv; ++h)
    for (int t0 = 0; t0 < T; t0 += 4) {
      std::set<int32_t> u;
      for (int t = t0; t < std::min(T, t0 + 4); ++t)
        for (int s = 0; s < kTopK; ++s) {
          const int32_t b = sel[(size_t(h) * T + t) * kTopK + s];
          if (b < 0) break;
          u.insert(b);
          used += 1;
        }
      issued += 4.0 * double(u.size());
    }
  return used / issued;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> kvs;
  bool indexer_only = false, attention_only = false, sweep_order = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--indexer-only")) {
      indexer_only = true;
    } else if (!std::strcmp(argv[i], "--attention-only")) {  // sparse attention variants only
      attention_only = true;
    } else if (!std::strcmp(argv[i], "--sweep-order")) {  // KV-block-major tile orders (set_order)
      sweep_order = true;
    } else if (!std::strcmp(argv[i], "--kv") && i + 1 < argc) {
      kvs.push_back(std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_prefill_tc [--kv N ...] [--indexer-only | --attention-only] [--sweep-order]\n");
      return 2;
    }
  }
  if (kvs.empty()) kvs = {16384, 32768, 65536, 131072};
  try {
    if (cuda::device_count() == 0) return std::printf("bench_prefill_tc: no CUDA device\n"), 0;
    cudaDeviceProp prop{};
    M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, L2 %d MB\n\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const double l2_bytes = double(prop.l2CacheSize);
    std::printf("| KV | selection | median ms | min–max ms | useful TFLOP/s | η (useful / issued MMA) |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::mt19937_64 g(20261201);
    std::string json;
    cuda::DeviceBuffer<uint16_t> q(size_t(kT) * kHq * kD);
    fill_bf16(q, q.size(), 11);
    cuda::DeviceBuffer<float> out(size_t(kT) * kHq * kD), kvout(size_t(kT) * kHq * kD);
    for (int kv : kvs) {
      const int prefix = kv - kT, num_pages = (kv + kB - 1) / kB + 1;
      std::vector<int32_t> pos(kT), row_seq(kT, 0), pt_indptr{0, num_pages - 1}, pt_pages(num_pages - 1);
      std::iota(pos.begin(), pos.end(), prefix);
      std::vector<int32_t> perm(num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), g);
      std::copy_n(perm.begin(), num_pages - 1, pt_pages.begin());
      const int64_t half = int64_t(kHkv) * kB * kD, stride = 2 * half;
      cuda::DeviceBuffer<uint16_t> pool(size_t(stride) * num_pages);
      fill_bf16(pool, pool.size(), 100 + kv);
      cuda::DeviceBuffer<int32_t> dpos(kT), dseq(kT), dind(2), dpages(pt_pages.size()), dsel(size_t(kHkv) * kT * kTopK);
      M3_CUDA_CHECK(cudaMemcpy(dpos.get(), pos.data(), kT * 4, cudaMemcpyHostToDevice));
      M3_CUDA_CHECK(cudaMemcpy(dseq.get(), row_seq.data(), kT * 4, cudaMemcpyHostToDevice));
      M3_CUDA_CHECK(cudaMemcpy(dind.get(), pt_indptr.data(), 8, cudaMemcpyHostToDevice));
      M3_CUDA_CHECK(cudaMemcpy(dpages.get(), pt_pages.data(), pt_pages.size() * 4, cudaMemcpyHostToDevice));
      const cuda::DevStepRows rows{dpos.get(), dseq.get(), dind.get(), dpages.get(), kT};
      const cuda::DevPagedKVBf16 kvc{pool.get(), pool.get() + half, stride, num_pages, kHkv, kB, kD};
      double useful = 0;
      for (int p : pos) useful += double((std::min(16, p / kB + 1) - 1) * kB + p % kB + 1);
      useful *= 4.0 * kD * kHq;
      if (!indexer_only) {  // attention variants
      for (bool spread : {false, true}) {
        const std::vector<int32_t> sel = make_selection(pos, spread, g);
        M3_CUDA_CHECK(cudaMemcpy(dsel.get(), sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
        cuda::MsaPrefillUnion attn;
        attn.plan(kT, kHkv, kG, kD, kB, kTopK);
        M3_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.size() * 4));
        auto f = [&] { attn.run(q.get(), dsel.get(), rows, kvc, 1.f / std::sqrt(float(kD)), out.get(), nullptr); };
        f();
        attn.check(nullptr);
        std::vector<float> h(out.size());
        M3_CUDA_CHECK(cudaMemcpy(h.data(), out.get(), h.size() * 4, cudaMemcpyDeviceToHost));
        const size_t nonfinite = size_t(std::count_if(h.begin(), h.end(), [](float x) { return !std::isfinite(x); }));
        if (nonfinite) cuda::failf("%zu outputs not written / not finite", nonfinite);
        const std::vector<float> t = bench::time_sorted_ms(f, 3, 20);
        const float med = t[t.size() / 2];
        const double tf = useful / (med * 1e-3) / 1e12, eta = union_efficiency(sel, kT);
        const char* name = spread ? "spread" : "random";
        std::printf("| %dk | %s | %.3f | %.3f–%.3f | %.0f | %.2f |\n", kv / 1024, name, med, t.front(), t.back(), tf,
                    eta);
        char rec[512];
        std::snprintf(rec, sizeof rec,
                      "{\"op\": \"msa_prefill_attention\", \"shape\": \"T16384 KV%dk 64q/4kv D128 B128 top16\", "
                      "\"variant\": \"union-tile tc bf16, %s selection\", \"median_us\": %.1f, \"useful_tflops\": "
                      "%.1f, \"eta\": %.3f}\n",
                      kv / 1024, name, med * 1e3, tf, eta);
        json += rec;
        {  // A/B: the same kernel without the warpgroup ping-pong
          attn.set_pingpong(false);
          const std::vector<float> t0 = bench::time_sorted_ms(f, 3, 20);
          attn.set_pingpong(true);
          const float m0 = t0[t0.size() / 2];
          std::printf("| %dk | %s, union without ping-pong | %.3f | %.3f–%.3f | %.0f | |\n", kv / 1024, name, m0,
                      t0.front(), t0.back(), useful / (m0 * 1e-3) / 1e12);
        }

        // KV-block-major on the same selection: the same output up to bf16 partials.
        cuda::MsaPrefillKvMajor kvm;
        kvm.plan(kT, kHkv, kG, kD, kB, kTopK, num_pages);
        M3_CUDA_CHECK(cudaMemset(kvout.get(), 0xFF, kvout.size() * 4));
        auto fk = [&] {
          kvm.run(q.get(), dsel.get(), rows, kvc, 1.f / std::sqrt(float(kD)), kvout.get(), nullptr);
        };
        fk();
        kvm.check(nullptr);
        std::vector<float> hk(kvout.size());
        M3_CUDA_CHECK(cudaMemcpy(hk.data(), kvout.get(), hk.size() * 4, cudaMemcpyDeviceToHost));
        double maxdiff = 0, maxref = 0;
        for (size_t i = 0; i < hk.size(); ++i) {
          if (!std::isfinite(hk[i])) cuda::failf("kv-major: output %zu not written / not finite", i);
          maxdiff = std::max(maxdiff, double(std::fabs(hk[i] - h[i])));
          maxref = std::max(maxref, double(std::fabs(h[i])));
        }
        const std::vector<float> tk = bench::time_sorted_ms(fk, 3, 20);
        const float medk = tk[tk.size() / 2];
        const double tfk = useful / (medk * 1e-3) / 1e12;
        std::printf("| %dk | %s, KV-block-major | %.3f | %.3f–%.3f | %.0f | 1 (max|Δ| vs union %.2g of %.2g; workspace %.2f GB) |\n",
                    kv / 1024, name, medk, tk.front(), tk.back(), tfk, maxdiff, maxref, kvm.workspace_bytes() / 1e9);
        {  // where the time goes: CSR build / attention / combine, medians of 9 profiled runs
          kvm.profile_phases(true);
          std::vector<float> ph[3];
          for (int r = 0; r < 9; ++r) {
            fk();
            float ms[3];
            kvm.phase_ms(ms);
            for (int i = 0; i < 3; ++i) ph[i].push_back(ms[i]);
          }
          kvm.profile_phases(false);
          for (auto& v : ph) std::sort(v.begin(), v.end());
          std::printf("|  | phases: CSR build %.3f ms, attention %.3f ms, combine %.3f ms | | | | |\n", ph[0][4],
                      ph[1][4], ph[2][4]);
        }
        std::snprintf(rec, sizeof rec,
                      "{\"op\": \"msa_prefill_attention\", \"shape\": \"T16384 KV%dk 64q/4kv D128 B128 top16\", "
                      "\"variant\": \"kv-block-major tc bf16, %s selection\", \"median_us\": %.1f, \"useful_tflops\": "
                      "%.1f}\n",
                      kv / 1024, name, medk * 1e3, tfk);
        json += rec;
        if (sweep_order) {  // tile order of the KV-block-major kernel: windows of m · (context pages) rows × runs
          const std::vector<float> base = hk;
          const int ctx_pages = kv / kB;
          for (int tma : {0, 1})
          for (int cons : {3, 2})
          for (int m : {0, 4, 16})
            for (int chunk : {1, 4}) {
              if (!tma && cons == 3 && m == 0 && chunk == 4) continue;  // the default, timed above
              if (tma && (chunk != 4 || m == 4)) continue;  // the TMA-store epilogue at the best orders only
              const int window = m * ctx_pages;
              kvm.set_order(window, chunk, cons, tma == 1);
              fk();
              M3_CUDA_CHECK(cudaMemcpy(hk.data(), kvout.get(), hk.size() * 4, cudaMemcpyDeviceToHost));
              const bool same = std::memcmp(hk.data(), base.data(), hk.size() * 4) == 0;
              const std::vector<float> to = bench::time_sorted_ms(fk, 2, 15);
              kvm.profile_phases(true);
              std::vector<float> att;
              for (int r = 0; r < 5; ++r) {
                fk();
                float ms[3];
                kvm.phase_ms(ms);
                att.push_back(ms[1]);
              }
              kvm.profile_phases(false);
              std::sort(att.begin(), att.end());
              const float mo = to[to.size() / 2];
              std::printf("| %dk | %s, KV-major %d consumers%s, window %d (%d x ctx pages) chunk %d | %.3f | "
                          "%.3f–%.3f | %.0f | attention %.3f ms; output %s |\n",
                          kv / 1024, name, cons, tma ? " TMA store" : "", window, m, chunk, mo, to.front(), to.back(), useful / (mo * 1e-3) / 1e12,
                          att[2], same ? "bit-identical" : "DIFFERS");
              std::snprintf(rec, sizeof rec,
                            "{\"op\": \"msa_prefill_attention\", \"shape\": \"T16384 KV%dk 64q/4kv D128 B128 top16\", "
                            "\"variant\": \"kv-block-major tc bf16 %d consumers%s window %d chunk %d, %s selection\", "
                            "\"median_us\": %.1f, \"useful_tflops\": %.1f}\n",
                            kv / 1024, cons, tma ? " tma-store" : "", window, chunk, name, mo * 1e3, useful / (mo * 1e-3) / 1e12);
              json += rec;
            }
          kvm.set_order(0, 1);
        }

        // The per-tile router (msa_prefill_sparse.cuh): its pick and its time next to both kernels.
        cuda::MsaPrefillSparse routed;
        routed.plan(kT, kHkv, kG, kD, kB, kTopK, num_pages);
        auto fr = [&] {
          routed.run(q.get(), dsel.get(), rows, kvc, 1.f / std::sqrt(float(kD)), kvout.get(), nullptr);
        };
        fr();
        routed.check(nullptr);
        int64_t nu = 0, nk = 0;
        routed.last_route_counts(nullptr, &nu, &nk);
        const std::vector<float> tr = bench::time_sorted_ms(fr, 3, 20);
        const float medr = tr[tr.size() / 2];
        const double tfr = useful / (medr * 1e-3) / 1e12;
        std::printf("| %dk | %s, routed per tile | %.3f | %.3f–%.3f | %.0f | %lld union / %lld KV-major tiles; best single %.3f |\n",
                    kv / 1024, name, medr, tr.front(), tr.back(), tfr, (long long)nu, (long long)nk,
                    std::min(med, medk));
        std::snprintf(rec, sizeof rec,
                      "{\"op\": \"msa_prefill_attention\", \"shape\": \"T16384 KV%dk 64q/4kv D128 B128 top16\", "
                      "\"variant\": \"routed per tile (union / kv-major), %s selection\", \"median_us\": %.1f, "
                      "\"useful_tflops\": %.1f}\n",
                      kv / 1024, name, medr * 1e3, tfr);
        json += rec;
      }
      if (!attention_only) {  // dense causal mode (run_dense): every row reads blocks 0..local; useful = 4·D·Hq·Σ (p + 1)
        double dense_useful = 0;
        for (int p : pos) dense_useful += double(p + 1);
        dense_useful *= 4.0 * kD * kHq;
        cuda::MsaPrefillUnion attn;
        attn.plan(kT, kHkv, kG, kD, kB, kTopK);
        auto f = [&] { attn.run_dense(q.get(), rows, kvc, 1.f / std::sqrt(float(kD)), out.get(), nullptr); };
        M3_CUDA_CHECK(cudaMemset(out.get(), 0xFF, out.size() * 4));
        f();
        std::vector<float> h(out.size());
        M3_CUDA_CHECK(cudaMemcpy(h.data(), out.get(), h.size() * 4, cudaMemcpyDeviceToHost));
        if (std::count_if(h.begin(), h.end(), [](float x) { return !std::isfinite(x); }))
          cuda::failf("dense: outputs not written / not finite");
        const std::vector<float> t = bench::time_sorted_ms(f, 2, 10);
        const float med = t[t.size() / 2];
        const double tf = dense_useful / (med * 1e-3) / 1e12;
        std::printf("| %dk | dense causal | %.3f | %.3f–%.3f | %.0f | – |\n", kv / 1024, med, t.front(), t.back(), tf);
        char rec[512];
        std::snprintf(rec, sizeof rec,
                      "{\"op\": \"dense_prefill_attention\", \"shape\": \"T16384 KV%dk 64q/4kv D128 B128 causal\", "
                      "\"variant\": \"union-tile tc bf16, dense mode\", \"median_us\": %.1f, \"useful_tflops\": %.1f}\n",
                      kv / 1024, med * 1e3, tf);
        json += rec;
      }
      }
      if (!attention_only) {  // prefill indexer: tensor-core block scores (4 index heads × 128) + top-16, two kernels and fused
        // L2 rotated: `sets` copies of (index-K pool, iq) with sets × set bytes ≥ 2.5 × L2; each timed call reads the
        // next copy, so no call finds its inputs in L2 (the two-kernel variant's score matrix is written each call).
        constexpr int kHi = 4, kDi = 128;
        const int64_t ik_stride = int64_t(kB) * kDi;
        const double set_bytes = double(ik_stride) * num_pages * 2 + double(kT) * kHi * kDi * 2;
        const int sets = std::max(1, int(std::ceil(2.5 * l2_bytes / set_bytes)));
        std::vector<cuda::DeviceBuffer<uint16_t>> ikp(sets), iq(sets);
        for (int i = 0; i < sets; ++i) {
          ikp[i].grow(size_t(ik_stride) * num_pages), iq[i].grow(size_t(kT) * kHi * kDi);
          fill_bf16(ikp[i], ikp[i].size(), 300 + kv + 17 * i);
          fill_bf16(iq[i], iq[i].size(), 400 + kv + 17 * i);
        }
        cuda::MsaIndexerTc idx;
        idx.plan(pos, row_seq, kHi, kDi, kB, nullptr);
        cuda::DeviceBuffer<float> scores(size_t(kHi) * kT * idx.max_cols());
        cuda::DeviceBuffer<int32_t> isel(size_t(kHi) * kT * kTopK), fsel(size_t(kHi) * kT * kTopK);
        int rot = 0;
        auto fs = [&] {
          const int i = rot++ % sets;
          idx.run(iq[i].get(), ikp[i].get(), ik_stride, num_pages, rows, scores.get(), nullptr);
        };
        auto fst = [&] {
          const int i = rot++ % sets;
          idx.run(iq[i].get(), ikp[i].get(), ik_stride, num_pages, rows, scores.get(), nullptr);
          cuda::msa_topk(scores.get(), kT, kHi, dpos.get(), kB, idx.max_cols(), kTopK, isel.get(), nullptr);
        };
        using Pipe = cuda::MsaIndexerTc::TopKPipeline;
        auto fused = [&](Pipe pipe) {
          return [&, pipe] {
            const int i = rot++ % sets;
            idx.run_topk(iq[i].get(), ikp[i].get(), ik_stride, num_pages, rows, kTopK, fsel.get(), nullptr, pipe);
          };
        };
        // Agreement: the fused selection equals msa_topk's on the same inputs (set 0), both pipelines.
        size_t differ[2] = {0, 0};
        {
          std::vector<int32_t> a(isel.size()), b(isel.size());
          idx.run(iq[0].get(), ikp[0].get(), ik_stride, num_pages, rows, scores.get(), nullptr);
          cuda::msa_topk(scores.get(), kT, kHi, dpos.get(), kB, idx.max_cols(), kTopK, isel.get(), nullptr);
          M3_CUDA_CHECK(cudaMemcpy(a.data(), isel.get(), a.size() * 4, cudaMemcpyDeviceToHost));
          for (int v = 0; v < 2; ++v) {
            M3_CUDA_CHECK(cudaMemset(fsel.get(), 0x7F, fsel.size() * 4));
            idx.run_topk(iq[0].get(), ikp[0].get(), ik_stride, num_pages, rows, kTopK, fsel.get(), nullptr,
                         v ? Pipe::Overlap : Pipe::Serial);
            M3_CUDA_CHECK(cudaMemcpy(b.data(), fsel.get(), b.size() * 4, cudaMemcpyDeviceToHost));
            for (size_t r = 0; r < a.size(); r += kTopK)
              differ[v] += !std::equal(&a[r], &a[r] + kTopK, &b[r]);
          }
        }
        M3_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> ts = bench::time_sorted_ms(fs, 3, 20), tst = bench::time_sorted_ms(fst, 3, 20),
                                 tfs = bench::time_sorted_ms(fused(Pipe::Serial), 3, 20),
                                 tfo = bench::time_sorted_ms(fused(Pipe::Overlap), 3, 20);
        double flops = 0;  // useful: 2·Di per (row, history key)
        for (int p : pos) flops += double(p / kB) * kB;
        flops *= 2.0 * kDi * kHi;
        auto row = [&](const char* name, const char* variant, const std::vector<float>& t, const char* note) {
          const float m = t[t.size() / 2];
          std::printf("| %dk | %s | %.3f | %.3f–%.3f | %.0f | %s |\n", kv / 1024, name, m, t.front(), t.back(),
                      flops / (m * 1e-3) / 1e12, note);
          char rec[512];
          std::snprintf(rec, sizeof rec,
                        "{\"op\": \"msa_prefill_indexer\", \"shape\": \"T16384 KV%dk 4x128 index heads B128 top16\", "
                        "\"variant\": \"%s\", \"median_us\": %.1f, \"min_us\": %.1f, \"max_us\": %.1f, "
                        "\"useful_tflops\": %.1f, \"l2_rotated_sets\": %d}\n",
                        kv / 1024, variant, m * 1e3, t.front() * 1e3, t.back() * 1e3, flops / (m * 1e-3) / 1e12, sets);
          json += rec;
        };
        char n0[64], n1[64];
        std::snprintf(n0, sizeof n0, "%zu rows differ", differ[0]);
        std::snprintf(n1, sizeof n1, "%zu rows differ", differ[1]);
        row("indexer scores only (tc)", "tc scores only", ts, "–");
        row("indexer scores + msa_topk (2 kernels)", "tc scores + msa_topk", tst, "reference");
        row("indexer fused top-16, serial", "tc fused top16 serial", tfs, n0);
        row("indexer fused top-16, overlap", "tc fused top16 overlap", tfo, n1);
      }
    }
    std::printf("\n%s", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefill_tc: %s\n", e.what());
    return 1;
  }
  return 0;
}
