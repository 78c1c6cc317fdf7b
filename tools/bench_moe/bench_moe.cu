// bench_moe: the grouped MoE (backend/cuda/moe_grouped.cuh) at M3's widths — hidden 6144, 128 experts, top-4,
// expert width 3072, shared expert 3072 — for T = 1, 8, 32, 64 (decode) and 512 … 16384-token prefills, where both
// grouped-GEMM paths (mma.sync and wgmma, moe_grouped_wgmma.cuh) are also timed side by side.
//
// Protocol (the MSA_KERNELS benchmark protocol, adapted): a CUDA graph of `rot` back-to-back calls on rotated
// inputs (distinct xn per call, so each call chooses its own experts; one call's weights, ≥ 566 MB, are > 10× L2),
// 5 warm-up replays, 25 timed replays queued back to back, median per call and CV. The floor is bytes / the copy
// ceiling measured in the same run, where bytes = weights of the experts the calls actually chose (counted on the
// device by the grouping kernel) + the shared expert + the router + activations (xn read, x read and written).
// Also timed: the previous synchronous path (moe_forward_sync: host sync + one cuBLASLt GEMM per expert), eager.
// --fp8 also times the same layer with FP8 experts (e4m3 + 128×128 block scales, routed and shared) on the same
// inputs and prints bf16 vs FP8 side by side (each on its Auto path), with GB/s on the unique expert bytes each
// variant reads (the memory-bound decode sizes' measure); at T ≥ 512 also both FP8 paths forced (W8A16 mma.sync with
// f16 activations, e4m3 × e4m3 wgmma: moe_grouped_wgmma.cuh).
//   bench_moe [--quick] [--t T[,T…]] [--fp8]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/mlp_moe.cuh"
#include "backend/cuda/moe_grouped.cuh"
#include "backend/cuda/moe_grouped_wgmma.cuh"
#include "bench_common/event_timer.h"

namespace {

using m3::cuda::DeviceBuffer;

using Timing = m3::bench::CallTiming;

// Median µs per call of `calls(stream)` (rot back-to-back calls) over graph replays (bench_common/event_timer.h).
Timing time_graph(const std::function<void(cudaStream_t)>& calls, int rot) {
  return m3::bench::graph_call_timing(calls, rot);
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// Read-only stream (what the expert weights are): XOR of 16-byte loads, 4 in flight per thread; one store per thread
// that never happens (the flag is 0) keeps the loads alive.
__global__ void read_kernel(const uint4* __restrict__ src, size_t n, uint4* __restrict__ sink, int flag) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc.x ^= a.x ^ b.x ^ c.x ^ d.x, acc.y ^= a.y ^ b.y ^ c.y ^ d.y;
    acc.z ^= a.z ^ b.z ^ c.z ^ d.z, acc.w ^= a.w ^ b.w ^ c.w ^ d.w;
  }
  for (; i < n; i += stride) acc.x ^= src[i].x, acc.y ^= src[i].y, acc.z ^= src[i].z, acc.w ^= src[i].w;
  if (flag) sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// Read ceiling in GB/s (4 GiB read, best of two grid sizes).
double read_ceiling_gbps() {
  const size_t bytes = size_t(4) << 30;
  DeviceBuffer<uint8_t> a(bytes);
  DeviceBuffer<uint4> sink(size_t(132) * 64 * 256);
  M3_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const int sms = m3::cuda::sm_count();
  double best = 0;
  for (int per_sm : {4, 8}) {
    const Timing t = time_graph(
        [&](cudaStream_t s) {
          read_kernel<<<sms * per_sm, 256, 0, s>>>(reinterpret_cast<const uint4*>(a.get()), bytes / 16, sink.get(), 0);
          M3_CUDA_CHECK(cudaGetLastError());
        },
        1);
    best = std::max(best, double(bytes) / (t.median_us * 1e3));
  }
  return best;
}

// Copy ceiling in GB/s (read + write bytes over time; 1 GiB each way): best of a copy kernel and cudaMemcpyAsync.
double copy_ceiling_gbps() {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  M3_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const int sms = m3::cuda::sm_count();
  double best = 0;
  for (int per_sm : {4, 16}) {
    const Timing t = time_graph(
        [&](cudaStream_t s) {
          copy_kernel<<<sms * per_sm, 256, 0, s>>>(reinterpret_cast<const uint4*>(a.get()),
                                                   reinterpret_cast<uint4*>(b.get()), bytes / 16);
          M3_CUDA_CHECK(cudaGetLastError());
        },
        1);
    best = std::max(best, 2.0 * bytes / (t.median_us * 1e3));
  }
  const Timing tm = time_graph(
      [&](cudaStream_t s) { M3_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, 1);
  return std::max(best, 2.0 * bytes / (tm.median_us * 1e3));
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, fp8 = false;
  std::vector<int64_t> only_T;  // --t: these step sizes
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--fp8") == 0) {
      fp8 = true;
    } else if (std::strcmp(argv[i], "--t") == 0 && i + 1 < argc) {
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        const long long v = std::strtoll(p, &end, 10);
        if (end == p || v <= 0) {
          std::fprintf(stderr, "bench_moe: --t wants positive step sizes separated by commas, got '%s'\n", argv[i]);
          return 2;
        }
        only_T.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "usage: bench_moe [--quick] [--t T[,T...]] [--fp8]\n");
      return 2;
    }
  }
  try {
    cudaDeviceProp prop{};
    M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const double copy = copy_ceiling_gbps();
    const double rd = read_ceiling_gbps();
    std::printf("copy ceiling (read + write): %.0f GB/s; read-only ceiling: %.0f GB/s\n", copy, rd);

    const int64_t H = 6144, E = 128, K = 4, I = 3072, Is = 3072;
    const size_t expert_bytes = size_t(3 * I * H) * 2, shared_bytes = size_t(3 * Is * H) * 2;
    DeviceBuffer<float> router(static_cast<size_t>(E * H)), bias(static_cast<size_t>(E));
    DeviceBuffer<__nv_bfloat16> gu(static_cast<size_t>(E * 2 * I * H)), dn(static_cast<size_t>(E * H * I)),
        sgu(static_cast<size_t>(2 * Is * H)), sdn(static_cast<size_t>(H * Is));
    m3::cuda::fill_hash_f32(router.get(), E * H, 1, 3.f / std::sqrt(float(H)), nullptr);
    m3::cuda::fill_hash_f32(bias.get(), E, 2, 0.05f, nullptr);
    m3::cuda::fill_hash_bf16(gu.get(), E * 2 * I * H, 3, 4.f / std::sqrt(float(H)), nullptr);
    m3::cuda::fill_hash_bf16(dn.get(), E * H * I, 4, 2.f / std::sqrt(float(I)), nullptr);
    m3::cuda::fill_hash_bf16(sgu.get(), 2 * Is * H, 5, 4.f / std::sqrt(float(H)), nullptr);
    m3::cuda::fill_hash_bf16(sdn.get(), H * Is, 6, 2.f / std::sqrt(float(Is)), nullptr);
    m3::cuda::MoeGroupedWeights w;
    w.router = router.get(), w.router_bias = bias.get(), w.gate_up = gu.get(), w.down = dn.get();
    w.shared_gate_up = sgu.get(), w.shared_down = sdn.get();
    w.E = E, w.top_k = K, w.I = I, w.Is = Is, w.routed_scale = 2.5f;
    std::printf("weights: %lld experts × %.1f MB + shared %.1f MB (bf16), router fp32\n\n", (long long)E,
                expert_bytes / 1e6, shared_bytes / 1e6);

    // The synchronous path's arguments (per-expert views of the same stacked weights).
    m3::cuda::MoeArgs sa;
    sa.router = router.get(), sa.router_bias = bias.get(), sa.E = E, sa.top_k = K, sa.routed_scale = 2.5f;
    for (int64_t e = 0; e < E; ++e)
      sa.experts.push_back(m3::cuda::MlpDev{gu.get() + e * 2 * I * H, dn.get() + e * H * I, m3::cuda::WType::BF16, I});
    sa.shared = m3::cuda::MlpDev{sgu.get(), sdn.get(), m3::cuda::WType::BF16, Is};
    m3::cuda::Gemm gemm;
    m3::cuda::FfnScratch ffn;

    std::printf("| T | calls/graph | median µs | CV | experts read/call | bytes/call MB | floor µs | floor/measured | "
                "TFLOP/s | read floor µs | read floor/measured | sync path (eager) µs |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<int64_t> Ts = {1, 8, 32, 64, 512, 1024, 2048, 4096, 8192, 16384};
    if (quick) Ts = {1, 64};
    if (!only_T.empty()) Ts = only_T;
    // FP8 experts (--fp8): MXFP8-like values with per-group scales, requantised to 128×128 blocks as the loader does.
    const int64_t sc_gu = m3::fp8_scale_count(m3::Fp8Scale::Blk128, 2 * I, H);
    const int64_t sc_dn = m3::fp8_scale_count(m3::Fp8Scale::Blk128, H, I);
    const size_t expert_bytes8 = size_t(3 * I * H) + size_t(sc_gu + sc_dn) * 4;
    const size_t shared_bytes8 = size_t(3 * Is * H) + size_t(m3::fp8_scale_count(m3::Fp8Scale::Blk128, 2 * Is, H) +
                                                             m3::fp8_scale_count(m3::Fp8Scale::Blk128, H, Is)) * 4;
    DeviceBuffer<uint8_t> gu8, dn8, sgu8, sdn8;
    DeviceBuffer<float> gu8s, dn8s, sgu8s, sdn8s;
    m3::cuda::MoeGroupedWeights w8 = w;
    if (fp8) {
      gu8.grow(size_t(E * 2 * I * H)), dn8.grow(size_t(E * H * I)), sgu8.grow(size_t(2 * Is * H));
      sdn8.grow(size_t(H * Is)), gu8s.grow(size_t(E * sc_gu)), dn8s.grow(size_t(E * sc_dn));
      sgu8s.grow(size_t(m3::fp8_scale_count(m3::Fp8Scale::Blk128, 2 * Is, H)));
      sdn8s.grow(size_t(m3::fp8_scale_count(m3::Fp8Scale::Blk128, H, Is)));
      DeviceBuffer<uint8_t> g32(size_t(2 * std::max(I, Is) * H / 32));
      auto make = [&](uint8_t* q, float* sc, int64_t N, int64_t Kd, uint64_t seed, float amp) {
        const int e0 = int(std::floor(std::log2(amp / 448.f))) - 1;
        m3::cuda::fill_hash_mxfp8(q, g32.get(), N, Kd, seed, e0, nullptr);
        m3::cuda::fp8_requant_from_mx(q, g32.get(), N, Kd, m3::Fp8Scale::Blk128, q, sc, nullptr);
      };
      for (int64_t e = 0; e < E; ++e) {
        make(gu8.get() + e * 2 * I * H, gu8s.get() + e * sc_gu, 2 * I, H, 1000 + uint64_t(e), 4.f / std::sqrt(float(H)));
        make(dn8.get() + e * H * I, dn8s.get() + e * sc_dn, H, I, 5000 + uint64_t(e), 2.f / std::sqrt(float(I)));
      }
      make(sgu8.get(), sgu8s.get(), 2 * Is, H, 9001, 4.f / std::sqrt(float(H)));
      make(sdn8.get(), sdn8s.get(), H, Is, 9002, 2.f / std::sqrt(float(Is)));
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      w8.gate_up = nullptr, w8.down = nullptr, w8.shared_gate_up = nullptr, w8.shared_down = nullptr;
      w8.gate_up8 = gu8.get(), w8.gate_up8_scales = gu8s.get(), w8.down8 = dn8.get(), w8.down8_scales = dn8s.get();
      w8.shared_gate_up8 = sgu8.get(), w8.shared_gate_up8_scales = sgu8s.get();
      w8.shared_down8 = sdn8.get(), w8.shared_down8_scales = sdn8s.get();
      std::printf("fp8 experts: %.1f MB each + shared %.1f MB (e4m3 + 128×128 fp32 block scales)\n\n",
                  expert_bytes8 / 1e6, shared_bytes8 / 1e6);
    }
    std::vector<std::string> fp8_rows;
    m3::cuda::MoeGroupedScratch scr;
    m3::cuda::moe_reserve(scr, *std::max_element(Ts.begin(), Ts.end()), H, E, K, I, Is);  // before any capture
    std::vector<std::string> breakdown, paths, fp8_paths;
    for (int64_t T : Ts) {
      const int rot = T >= 512 ? 2 : 8;
      std::vector<DeviceBuffer<float>> xn(static_cast<size_t>(rot)), x(static_cast<size_t>(rot));
      for (int r = 0; r < rot; ++r) {
        xn[r].grow(size_t(T * H)), x[r].grow(size_t(T * H));
        m3::cuda::fill_hash_f32(xn[r].get(), T * H, 100 + uint64_t(r) * 7 + uint64_t(T), 1.f, nullptr);
        m3::cuda::fill_hash_f32(x[r].get(), T * H, 900 + uint64_t(r), 1.f, nullptr);
      }
      // Experts actually read: counted on the device by the grouping kernel, per rotated input.
      double active = 0;
      for (int r = 0; r < rot; ++r) {
        m3::cuda::moe_grouped_forward(w, xn[r].get(), T, H, x[r].get(), scr, nullptr);
        int32_t c[2];
        M3_CUDA_CHECK(cudaMemcpy(c, scr.counters.get(), 8, cudaMemcpyDeviceToHost));
        active += c[1];
      }
      active /= rot;
      // One layer (bf16 experts w, or FP8 experts w8) on one GEMM path, graph of `rot` rotated calls.
      auto time_path = [&](m3::cuda::MoeGemmPath path, const m3::cuda::MoeGroupedWeights& ww) {
        return time_graph(
            [&](cudaStream_t s) {
              for (int r = 0; r < rot; ++r)
                m3::cuda::moe_grouped_forward(ww, xn[r].get(), T, H, x[r].get(), scr, s, nullptr, path);
            },
            rot);
      };
      const Timing t = time_path(m3::cuda::MoeGemmPath::Auto, w);
      const double bytes = active * expert_bytes + shared_bytes + double(E * H * 4) + double(T * H * 12);
      const double floor_us = bytes / (copy * 1e3);
      const double flops = 2.0 * double(T * K + T) * 3.0 * double(I) * double(H);
      double sync_us = 0;
      if (T <= 64) {
        cudaEvent_t a, b;
        M3_CUDA_CHECK(cudaEventCreate(&a));
        M3_CUDA_CHECK(cudaEventCreate(&b));
        std::vector<double> ts;
        for (int i = 0; i < 13; ++i) {
          const int r = i % rot;
          M3_CUDA_CHECK(cudaEventRecord(a));
          m3::cuda::moe_forward_sync(gemm, sa, xn[r].get(), T, H, x[r].get(), ffn, nullptr);
          M3_CUDA_CHECK(cudaEventRecord(b));
          M3_CUDA_CHECK(cudaEventSynchronize(b));
          float ms = 0;
          M3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
          if (i >= 3) ts.push_back(1e3 * ms);
        }
        std::sort(ts.begin(), ts.end());
        sync_us = ts[ts.size() / 2];
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
      char sync_s[32] = "—";
      if (sync_us > 0) std::snprintf(sync_s, sizeof sync_s, "%.1f", sync_us);
      const double rfloor_us = bytes / (rd * 1e3);
      std::printf("| %lld | %d | %.1f | %.3f | %.2f | %.0f | %.1f | %.0f %% | %.1f | %.1f | %.0f %% | %s |\n",
                  (long long)T, rot, t.median_us, t.cv, active, bytes / 1e6, floor_us, 100.0 * floor_us / t.median_us,
                  flops / (t.median_us * 1e6), rfloor_us, 100.0 * rfloor_us / t.median_us, sync_s);
      // FP8 experts on the same inputs (same router: the same experts are read).
      if (fp8) {
        const Timing t8 = time_path(m3::cuda::MoeGemmPath::Auto, w8);
        const double ex16 = active * expert_bytes + shared_bytes, ex8 = active * expert_bytes8 + shared_bytes8;
        const double other = double(E * H * 4) + double(T * H * 12);
        char b[320];
        std::snprintf(b, sizeof b,
                      "| %lld | %.2f | %.1f | %.1f | %.2f | %.0f | %.0f | %.0f | %.0f | %.0f %% | %.0f %% |",
                      (long long)T, active, t.median_us, t8.median_us, t.median_us / t8.median_us, ex16 / 1e6,
                      ex8 / 1e6, (ex16 + other) / (t.median_us * 1e3), (ex8 + other) / (t8.median_us * 1e3),
                      100.0 * (ex16 + other) / (t.median_us * 1e3) / copy,
                      100.0 * (ex8 + other) / (t8.median_us * 1e3) / copy);
        fp8_rows.push_back(b);
      }
      // Prefill-sized steps: both GEMM paths forced, same inputs (the Auto row above is one of them).
      if (T >= 512) {
        const Timing tm = time_path(m3::cuda::MoeGemmPath::MmaSync, w);
        const Timing tw = time_path(m3::cuda::MoeGemmPath::Wgmma, w);
        char b[256];
        std::snprintf(b, sizeof b, "| %lld | %.1f | %.1f | %.1f | %.1f | %.2f | %s |", (long long)T, tm.median_us,
                      flops / (tm.median_us * 1e6), tw.median_us, flops / (tw.median_us * 1e6),
                      tm.median_us / tw.median_us,
                      m3::cuda::moe_gemm_path(T, H, E, K, I, Is) == m3::cuda::MoeGemmPath::Wgmma ? "wgmma" : "mma.sync");
        paths.push_back(b);
        if (fp8) {  // the FP8 experts' two paths: W8A16 mma.sync (f16 activations) and e4m3 wgmma
          const Timing fm = time_path(m3::cuda::MoeGemmPath::MmaSync, w8);
          const Timing fw = time_path(m3::cuda::MoeGemmPath::Wgmma, w8);
          // The N = 256 kernels (act in 1 × 128 blocks) where H takes them.
          const bool wide_ok = m3::cuda::moe_wgmma_fp8_supported(H, I, Is, true);
          const Timing fx = wide_ok ? time_path(m3::cuda::MoeGemmPath::Wgmma256, w8) : Timing{};
          const double best16 = std::min(tm.median_us, tw.median_us);
          const auto auto_path = m3::cuda::moe_gemm_path(T, H, E, K, I, Is, true);
          char c[384];
          std::snprintf(c, sizeof c, "| %lld | %.1f | %.1f | %.1f (%.1f %%) | %.1f | %.2f | %.2f | %.1f | %.2f | %s |",
                        (long long)T, best16, fm.median_us, fw.median_us, 100.0 * fw.cv,
                        flops / (fw.median_us * 1e6), fm.median_us / fw.median_us, best16 / fw.median_us,
                        wide_ok ? fx.median_us : 0.0, wide_ok ? best16 / fx.median_us : 0.0,
                        auto_path == m3::cuda::MoeGemmPath::Wgmma256 ? "wgmma N=256"
                        : auto_path == m3::cuda::MoeGemmPath::Wgmma  ? "wgmma"
                                                                     : "mma.sync");
          fp8_paths.push_back(c);
        }
      }
      // Per-kernel breakdown, eager (launch gaps included in the kernel that follows): median of 9; bf16 experts, then
      // (--fp8) the FP8 experts on their Auto path.
      auto stage_times = [&](const m3::cuda::MoeGroupedWeights& ww, const char* tag) {
        m3::cuda::MoeStageEvents me;
        for (auto& e : me.ev) M3_CUDA_CHECK(cudaEventCreate(&e));
        std::vector<std::vector<double>> parts(5);
        for (int i = 0; i < 11; ++i) {
          m3::cuda::moe_grouped_forward(ww, xn[i % rot].get(), T, H, x[i % rot].get(), scr, nullptr, &me);
          M3_CUDA_CHECK(cudaEventSynchronize(me.ev[5]));
          if (i < 2) continue;
          for (int k = 0; k < 5; ++k) {
            float ms = 0;
            M3_CUDA_CHECK(cudaEventElapsedTime(&ms, me.ev[k], me.ev[k + 1]));
            parts[k].push_back(1e3 * ms);
          }
        }
        breakdown.push_back("| " + std::to_string(T) + " | " + tag);
        for (auto& v : parts) {
          std::sort(v.begin(), v.end());
          char b[32];
          std::snprintf(b, sizeof b, " | %.1f", v[v.size() / 2]);
          breakdown.back() += b;
        }
        breakdown.back() += " |";
        for (auto& e : me.ev) cudaEventDestroy(e);
      };
      stage_times(w, "bf16");
      if (fp8) stage_times(w8, "fp8");
      std::fflush(stdout);
    }
    std::printf("\nEager breakdown (µs, median of 9; events between the launches):\n\n"
                "| T | experts | router | route + group | gate/up + SwiGLU | down | combine |\n"
                "|---|---|---|---|---|---|---|\n");
    for (const auto& l : breakdown) std::printf("%s\n", l.c_str());
    std::printf("\nGEMM paths at prefill sizes (whole MoE call, graph of rotated calls, median µs; TFLOP/s on the "
                "routed + shared expert FLOPs):\n\n| T | mma.sync µs | TFLOP/s | wgmma µs | TFLOP/s | speed-up | Auto |\n"
                "|---|---|---|---|---|---|---|\n");
    for (const auto& l : paths) std::printf("%s\n", l.c_str());
    if (fp8) {
      std::printf("\nFP8 experts at prefill sizes, both GEMM paths forced (graph of rotated calls, median µs per call; "
                  "TFLOP/s on the routed + shared FLOPs):\n\n| T | bf16 best µs | fp8 mma.sync (W8A16, f16 act) µs | "
                  "fp8 wgmma (e4m3 act) µs (CV) | wgmma TFLOP/s | mma.sync / wgmma | bf16 best / fp8 wgmma | "
                  "fp8 wgmma N=256 µs | bf16 best / N=256 | Auto |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (const auto& l : fp8_paths) std::printf("%s\n", l.c_str());
      std::printf("\nbf16 vs FP8 experts (each on its Auto path: moe_gemm_path; graph of rotated calls, median "
                  "µs per call). GB/s = (unique expert bytes read + router + activations) / time; copy ceiling %.0f "
                  "GB/s:\n\n| T | experts/call | bf16 µs | fp8 µs | bf16/fp8 | bf16 expert MB | fp8 expert MB | bf16 "
                  "GB/s | fp8 GB/s | bf16 %% of copy | fp8 %% of copy |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                  copy);
      for (const auto& l : fp8_rows) std::printf("%s\n", l.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe: %s\n", e.what());
    return 1;
  }
}
