// Decode-row projections at M3 shapes, T ∈ {1, 2, 4, 8} token rows: the executor's bf16 path (cuBLASLt, fp32 out),
// gemv_bf16, the W8A16 mma kernel and gemv_e4m3's two kernels (CUDA cores, tensor cores; Blk128 scales). Each variant runs as CUDA-graph replays of R calls
// over R weight copies (together > 2× L2, so every call streams its weights from HBM); µs per call (median of 25
// replays, CV), GB/s on the weight bytes one call must read, and % of the copy ceiling measured in the same run.
//   bench_gemv [--t 1,2,4,8]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/moe_grouped.cuh"  // fill_hash_bf16
#include "bench_common/event_timer.h"

using namespace m3;

namespace {

struct Shape {
  const char* name;
  int64_t N, K;
};

double copy_ceiling_gbps() {
  const size_t bytes = size_t(1) << 30;
  cuda::DeviceBuffer<uint8_t> a, b;
  a.grow(bytes), b.grow(bytes);
  const auto t = bench::time_sorted_ms([&] { M3_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice)); }, 2, 9);
  return 2.0 * double(bytes) / (double(t[t.size() / 2]) * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> Ts = {1, 2, 4, 8};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--t") && i + 1 < argc) {
      Ts.clear();
      for (char* p = argv[++i]; *p;) {
        Ts.push_back(std::strtoll(p, &p, 10));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: bench_gemv [--t 1,2,4,8]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy = copy_ceiling_gbps();
  std::printf("device %s, copy ceiling (read + write) %.0f GB/s\n\n", prop.name, copy);
  const Shape shapes[] = {{"qkv", 9216, 6144}, {"o", 6144, 8192}, {"gate_up", 6144, 6144}, {"down", 6144, 3072},
                          {"mlp gate_up", 24576, 6144}, {"mlp down", 6144, 12288}};
  std::printf("| shape | T | variant | µs | CV | weight GB/s | %% of copy |\n|---|---|---|---|---|---|---|\n");
  cuda::Gemm gemm;
  cuda::Fp8Gemm f8;
  for (const Shape& sh : shapes) {
    const int64_t N = sh.N, K = sh.K;
    const size_t wb16 = size_t(N * K) * 2;
    const int R = int(std::max<size_t>(2, (size_t(240) << 20) / wb16 + 1));  // bf16 copies > 240 MB together
    const int R8 = 2 * R;
    std::vector<cuda::DeviceBuffer<__nv_bfloat16>> w16(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      w16[size_t(r)].grow(size_t(N * K));
      cuda::fill_hash_bf16(w16[size_t(r)].get(), N * K, 100 + uint64_t(r), 0.05f, nullptr);
    }
    std::vector<cuda::DeviceBuffer<uint8_t>> q(static_cast<size_t>(R8));
    std::vector<cuda::DeviceBuffer<float>> sc(static_cast<size_t>(R8));
    std::vector<cuda::Fp8Weight> w8(static_cast<size_t>(R8));
    for (int r = 0; r < R8; ++r) {
      q[size_t(r)].grow(size_t(N * K));
      sc[size_t(r)].grow(size_t(fp8_scale_count(Fp8Scale::Blk128, N, K)));
      cuda::fp8_fill_counter_uniform(q[size_t(r)].get(), sc[size_t(r)].get(), Fp8Scale::Blk128, N, K, 200 + uint64_t(r),
                                     0.05f, nullptr);
      w8[size_t(r)] = cuda::Fp8Weight{q[size_t(r)].get(), sc[size_t(r)].get(), Fp8Scale::Blk128, N, K};
    }
    cuda::DeviceBuffer<__nv_bfloat16> x;
    x.grow(size_t(8 * K));
    cuda::fill_hash_bf16(x.get(), 8 * K, 7, 1.f, nullptr);
    cuda::DeviceBuffer<float> y;
    y.grow(size_t(8 * N));
    const uint16_t* xb = reinterpret_cast<const uint16_t*>(x.get());
    for (int64_t T : Ts) {
      if (!cuda::gemv_supported(T, K, true)) continue;
      f8.w8a16(xb, T, w8[0], y.get(), cuda::GemmOut::F32, false, nullptr);  // first-use work outside the capture
      gemm.nt_bf16(xb, T, K, w16[0].get(), N, y.get(), false, nullptr);
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      auto row = [&](const char* variant, int calls, double bytes, const std::function<void(cudaStream_t)>& f) {
        const bench::CallTiming c = bench::graph_call_timing(f, calls);
        const double gbps = bytes / (c.median_us * 1e-6) / 1e9;
        std::printf("| %s %lldx%lld | %lld | %s | %.1f | %.3f | %.0f | %.0f %% |\n", sh.name, (long long)N,
                    (long long)K, (long long)T, variant, c.median_us, c.cv, gbps, 100.0 * gbps / copy);
      };
      row("cuBLASLt bf16 (executor)", R, double(wb16), [&](cudaStream_t s) {
        for (int r = 0; r < R; ++r) gemm.nt_bf16(xb, T, K, w16[size_t(r)].get(), N, y.get(), false, s);
      });
      row("gemv_bf16", R, double(wb16), [&](cudaStream_t s) {
        for (int r = 0; r < R; ++r)
          cuda::gemv_bf16(xb, T, K, reinterpret_cast<const uint16_t*>(w16[size_t(r)].get()), N, y.get(),
                          cuda::GemmOut::F32, false, s);
      });
      const double wb8 = double(N * K) + double(fp8_scale_count(Fp8Scale::Blk128, N, K)) * 4;
      row("W8A16 mma (e4m3)", R8, wb8, [&](cudaStream_t s) {
        for (int r = 0; r < R8; ++r) f8.w8a16(xb, T, w8[size_t(r)], y.get(), cuda::GemmOut::F32, false, s);
      });
      row("gemv_e4m3 (CUDA cores)", R8, wb8, [&](cudaStream_t s) {
        for (int r = 0; r < R8; ++r)
          cuda::gemv_e4m3(xb, T, w8[size_t(r)], y.get(), cuda::GemmOut::F32, false, s, cuda::GemvKernel::Fma);
      });
      if (cuda::gemv_e4m3_mma_supported(T, K))
        row("gemv_e4m3 (tensor cores)", R8, wb8, [&](cudaStream_t s) {
          for (int r = 0; r < R8; ++r)
            cuda::gemv_e4m3(xb, T, w8[size_t(r)], y.get(), cuda::GemmOut::F32, false, s, cuda::GemvKernel::Mma);
        });
    }
  }
  return 0;
}
