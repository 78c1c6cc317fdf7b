// FP8 GEMMs against bf16 at M3 shapes (issue 15 items 2 and 6; backend/cuda/fp8_gemm.cuh):
//   y[M, N] = x[M, K]·Wᵀ for the projections of one layer (qkv 6144 → (64+8+8)·128, o 8192 → 6144, expert and
// shared-expert gate_up 6144 → 2·3072, down 3072 → 6144) at M = 1, 8, 64, 512, 16384 tokens.
// Variants: bf16 cuBLASLt (fp32 out, the executor's today) and bf16 out; bf16 wgmma (bf16 out); FP8 W8A16 on the
// released MXFP8 scales (G32) and on requantised 128×128 scales, each at the default and forced row tiles (M ≤ 64);
// FP8×FP8 cuBLASLt block-scaled (1×128 activations × 128×128 or 1×128 weights), the GEMM alone and with the
// activation quantisation. Weights rotate over enough copies that each variant's working set exceeds --ws-mb (so
// no run reads weights from L2). CUDA-event medians with min–max over --reps runs; each FP8 variant's error is
// reported against the W8A16 G32 fp32 output (the exact MXFP8 dequantisation), each bf16 one against bf16 cuBLASLt.
// "GB/s" counts the weight bytes a call must read (values + scales); "% copy" divides by the device-to-device copy
// bandwidth measured at the start (bytes read + written per second).
//   bench_fp8_gemm [--m 1,8,64] [--shape NxK ...] [--reps R] [--ws-mb MB]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "bench_common/event_timer.h"

namespace m3::bench {
void fill_fp8_codes(uint8_t* p, int64_t n, uint64_t seed);
void fill_ue8m0(uint8_t* p, int64_t n, uint64_t seed, int lo, int hi);
void fill_bf16(uint16_t* p, int64_t n, uint64_t seed);
double rel_err(const void* got, bool bf16, const float* ref, int64_t n);
}  // namespace m3::bench

namespace {

using namespace m3;
using cuda::GemmOut;

struct Shape {
  std::string name;
  int64_t N, K;
};

double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  cuda::DeviceBuffer<uint8_t> a(bytes), b(bytes);
  M3_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const auto t = bench::time_sorted_ms([&] { M3_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice)); }, 2, 10);
  return 2.0 * double(bytes) / (t[t.size() / 2] * 1e-3) / 1e9;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  std::vector<int64_t> Ms = {1, 8, 64, 512, 16384};
  int reps = 20;
  double ws_mb = 120;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      Shape s{"custom", 0, 0};
      if (std::sscanf(argv[++i], "%ldx%ld", &s.N, &s.K) != 2) return std::fprintf(stderr, "bad shape\n"), 2;
      shapes.push_back(s);
    } else if (!std::strcmp(argv[i], "--m") && i + 1 < argc) {
      Ms = parse_list(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--ws-mb") && i + 1 < argc) {
      ws_mb = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_fp8_gemm [--m 1,8,64] [--shape NxK ...] [--reps R] [--ws-mb MB]\n");
      return 2;
    }
  }
  if (shapes.empty())
    shapes = {{"qkv", 9216, 6144}, {"o", 6144, 8192}, {"gate_up", 6144, 6144}, {"down", 6144, 3072}};
  try {
    if (cuda::device_count() == 0) return std::printf("bench_fp8_gemm: no CUDA device\n"), 0;
    cudaDeviceProp prop{};
    M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double copy_bw = copy_bandwidth_gbs();
    std::printf("device %s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (read + write)\n\n", prop.name,
                prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_bw);
    std::printf("| shape N×K | M | variant | median µs | min–max µs | back-to-back µs | TFLOP/s | weight GB/s | %% copy | b2b %% copy | vs bf16 | rel err |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::string json;
    const int64_t Mmax = *std::max_element(Ms.begin(), Ms.end());
    cuda::Gemm gemm;
    cuda::Fp8Gemm fp8;
    for (const Shape& sh : shapes) {
      const int64_t N = sh.N, K = sh.K, NK = N * K;
      const double ws = ws_mb * 1e6;
      const int c8 = std::max<int>(2, int(ws / double(NK)) + 1), c16 = std::max<int>(2, int(ws / double(2 * NK)) + 1);
      const int64_t ng = fp8_scale_count(Fp8Scale::G32, N, K), nb = fp8_scale_count(Fp8Scale::Blk128, N, K),
                    nr = fp8_scale_count(Fp8Scale::Row128, N, K);
      cuda::DeviceBuffer<uint8_t> qg(size_t(c8 * NK)), sg(size_t(c8 * ng)), qb(size_t(c8 * NK)), qr(size_t(c8 * NK));
      cuda::DeviceBuffer<float> sb(size_t(c8 * nb)), sr(size_t(c8 * nr));
      cuda::DeviceBuffer<uint16_t> wb(size_t(c16 * NK)), x(size_t(Mmax * K));
      bench::fill_fp8_codes(qg.get(), c8 * NK, 11 + N);
      bench::fill_ue8m0(sg.get(), c8 * ng, 13 + K, 116, 122);
      for (int c = 0; c < c8; ++c) {
        cuda::fp8_requant_from_mx(qg.get() + c * NK, sg.get() + c * ng, N, K, Fp8Scale::Blk128, qb.get() + c * NK,
                                  sb.get() + c * nb, nullptr);
        cuda::fp8_requant_from_mx(qg.get() + c * NK, sg.get() + c * ng, N, K, Fp8Scale::Row128, qr.get() + c * NK,
                                  sr.get() + c * nr, nullptr);
      }
      bench::fill_bf16(wb.get(), c16 * NK, 17 + N);
      bench::fill_bf16(x.get(), Mmax * K, 19 + K);
      auto Wg = [&](int c) { return cuda::Fp8Weight{qg.get() + c * NK, sg.get() + c * ng, Fp8Scale::G32, N, K}; };
      auto Wb = [&](int c) { return cuda::Fp8Weight{qb.get() + c * NK, sb.get() + c * nb, Fp8Scale::Blk128, N, K}; };
      auto Wr = [&](int c) { return cuda::Fp8Weight{qr.get() + c * NK, sr.get() + c * nr, Fp8Scale::Row128, N, K}; };
      for (int64_t M : Ms) {
        const int64_t Mp = (M + 3) / 4 * 4;
        cuda::DeviceBuffer<float> y32(size_t(M * N)), ref8(size_t(M * N)), ref16(size_t(M * N));
        cuda::DeviceBuffer<uint16_t> y16(size_t(M * N));
        cuda::DeviceBuffer<uint8_t> xq(size_t(Mp * K));
        cuda::DeviceBuffer<float> xs(size_t(Mp * (K / 128)));
        cuda::fp8_quantize_act_1x128(x.get(), true, M, Mp, K, xq.get(), xs.get(), Mp, nullptr);
        fp8.w8a16(x.get(), M, Wg(0), ref8.get(), GemmOut::F32, false, nullptr);
        gemm.nt_bf16(x.get(), M, K, wb.get(), N, ref16.get(), false, nullptr);
        M3_CUDA_CHECK(cudaDeviceSynchronize());

        struct V {
          std::string name;
          bool fp8, out_bf16;
          double wbytes;
          std::function<void(int)> f;  // copy index
        };
        const double b16 = 2.0 * NK, bg = double(NK + ng), bb = double(NK) + 4.0 * nb, br = double(NK) + 4.0 * nr;
        std::vector<V> vs;
        vs.push_back({"bf16 cuBLASLt f32-out", false, false, b16,
                      [&](int c) { gemm.nt_bf16(x.get(), M, K, wb.get() + c * NK, N, y32.get(), false, nullptr); }});
        vs.push_back({"bf16 wgmma bf16-out", false, true, b16, [&](int c) {
                        cuda::gemm_bf16_nt_wgmma(x.get(), wb.get() + c * NK, M, N, K, y16.get(), GemmOut::BF16, nullptr);
                      }});
        if (M <= 64) {
          for (int nt : {0, 1, 2, 4})
            vs.push_back({nt ? "fp8 w8a16 g32 f32-out nt=" + std::to_string(nt) : "fp8 w8a16 g32 f32-out", true, false,
                          bg, [&, nt](int c) { fp8.w8a16(x.get(), M, Wg(c), y32.get(), GemmOut::F32, false, nullptr, nt); }});
          for (int nt : {1, 2})
            if (M <= 16) vs.push_back({"fp8 w8a16-lines g32 f32-out nt=" + std::to_string(nt), true, false, bg, [&, nt](int c) {
                            fp8.w8a16(x.get(), M, Wg(c), y32.get(), GemmOut::F32, false, nullptr, nt,
                                      cuda::W8Kernel::Lines128);
                          }});
          vs.push_back({"fp8 w8a16 g32 bf16-out", true, true, bg,
                        [&](int c) { fp8.w8a16(x.get(), M, Wg(c), y16.get(), GemmOut::BF16, false, nullptr); }});
          vs.push_back({"fp8 w8a16 128x128 f32-out", true, false, bb,
                        [&](int c) { fp8.w8a16(x.get(), M, Wb(c), y32.get(), GemmOut::F32, false, nullptr); }});
        }
        vs.push_back({"fp8 cuBLASLt 128x128 bf16-out (gemm)", true, true, bb, [&](int c) {
                        fp8.blockscaled_q(xq.get(), xs.get(), M, Wb(c), y16.get(), GemmOut::BF16, false, nullptr);
                      }});
        vs.push_back({"fp8 cuBLASLt 128x128 bf16-out (+quant)", true, true, bb, [&](int c) {
                        fp8.blockscaled(x.get(), true, M, Wb(c), y16.get(), GemmOut::BF16, false, nullptr);
                      }});
        vs.push_back({"fp8 cuBLASLt 128x128 f32-out (+quant)", true, false, bb, [&](int c) {
                        fp8.blockscaled(x.get(), true, M, Wb(c), y32.get(), GemmOut::F32, false, nullptr);
                      }});
        vs.push_back({"fp8 cuBLASLt 1x128 bf16-out (gemm)", true, true, br, [&](int c) {
                        fp8.blockscaled_q(xq.get(), xs.get(), M, Wr(c), y16.get(), GemmOut::BF16, false, nullptr);
                      }});
        vs.push_back({"fp8 act quant 1x128 only", true, true, 0, [&](int) {
                        cuda::fp8_quantize_act_1x128(x.get(), true, M, Mp, K, xq.get(), xs.get(), Mp, nullptr);
                      }});
        const double flops = 2.0 * double(M) * double(N) * double(K);
        double bf16_med = 0;
        for (V& v : vs) {
          const int copies = v.fp8 ? c8 : c16;
          double err = -1;
          try {
            if (v.wbytes > 0) {
              M3_CUDA_CHECK(cudaMemset(v.out_bf16 ? static_cast<void*>(y16.get()) : y32.get(), 0xFF,
                                       size_t(M * N) * (v.out_bf16 ? 2 : 4)));
              v.f(0);
              M3_CUDA_CHECK(cudaDeviceSynchronize());
              err = bench::rel_err(v.out_bf16 ? static_cast<const void*>(y16.get()) : y32.get(), v.out_bf16,
                                   v.fp8 ? ref8.get() : ref16.get(), M * N);
            }
            int it = 0;
            const std::vector<float> t = bench::time_sorted_ms([&] { v.f(it++ % copies); }, 3, reps);
            const double med = t[t.size() / 2] * 1e3;
            // Back-to-back: `reps` calls between two events (launch gaps hidden, as in a CUDA graph), mean per call.
            const std::vector<float> tb = bench::time_sorted_ms([&] { for (int r = 0; r < reps; ++r) v.f(it++ % copies); }, 1, 3);
            const double b2b = tb[tb.size() / 2] * 1e3 / reps;
            const double gbs_b2b = v.wbytes / (b2b * 1e-6) / 1e9;
            if (v.name == "bf16 cuBLASLt f32-out") bf16_med = med;
            const double gbs = v.wbytes / (med * 1e-6) / 1e9;
            std::string name = v.name;
            if (v.name.find("cuBLASLt") != std::string::npos && v.fp8)
              name += std::string(" [") + fp8.lt_arrangement(M, v.name.find("1x128") != std::string::npos ? Wr(0) : Wb(0),
                                                             v.out_bf16 ? GemmOut::BF16 : GemmOut::F32, false) + "]";
            std::printf("| %s %ldx%ld | %ld | %s | %.1f | %.1f–%.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %.2fx | %.1e |\n",
                        sh.name.c_str(), N, K, M, name.c_str(), med, t.front() * 1e3, t.back() * 1e3, b2b,
                        v.wbytes > 0 ? flops / (med * 1e-6) / 1e12 : 0.0, gbs, 100.0 * gbs / copy_bw,
                        100.0 * gbs_b2b / copy_bw,
                        bf16_med > 0 ? bf16_med / med : 0.0, err);
            char rec[640];
            std::snprintf(rec, sizeof rec,
                          "{\"op\": \"fp8_gemm\", \"shape\": \"%s %ldx%ld\", \"M\": %ld, \"variant\": \"%s\", "
                          "\"median_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, \"weight_gbs\": %.0f, "
                          "\"pct_copy_bw\": %.1f, \"b2b_us\": %.2f, \"speedup_vs_bf16_lt\": %.3f, \"rel_err\": %.2e}\n",
                          sh.name.c_str(), N, K, M, v.name.c_str(), med, t.front() * 1e3, t.back() * 1e3, gbs,
                          100.0 * gbs / copy_bw, b2b, bf16_med > 0 ? bf16_med / med : 0.0, err);
            json += rec;
          } catch (const std::exception& e) {
            std::printf("| %s %ldx%ld | %ld | %s | failed: %s |\n", sh.name.c_str(), N, K, M, v.name.c_str(), e.what());
            cudaGetLastError();
          }
          std::fflush(stdout);
        }
      }
    }
    std::printf("\n%s", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fp8_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
