// Benchmark of the Hopper wgmma GEMM (backend/cuda/gemm_wgmma.cuh) against cuBLASLt in the same run, bf16 inputs,
// fp32 accumulate: y[M, N] = x[M, K]·W[N, K]ᵀ. Random device-filled inputs (never zero), a correctness check of
// every variant against cuBLASLt's bf16 output first, then CUDA-event medians (5 warm-ups, 20 timed runs; at the
// default shapes x and W together exceed 2× L2, so no rotation is needed).
//   bench_gemm [--shape MxNxK ...] [--reps R]         prints a markdown table and one JSON record per line
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemm_wgmma.cuh"
#include "base/dtype.h"
#include "bench_common/event_timer.h"

namespace m3::bench {
void fill_uniform(float* p, int64_t n, uint64_t seed, float lo, float hi);
}

namespace {

using namespace m3;

#define LT_CHECK(expr)                                                                       \
  do {                                                                                       \
    cublasStatus_t st_ = (expr);                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS) cuda::failf("cuBLASLt %s failed: %d", #expr, int(st_)); \
  } while (0)

struct Shape {
  int64_t M, N, K;
};

// cuBLASLt reference: row-major y[M, N] = x·Wᵀ is column-major yᵀ[N, M] = W[K, N]ᵀ · xᵀ[K, M] ("TN").
class LtGemm {
 public:
  LtGemm(const Shape& s, int out_bits) {
    LT_CHECK(cublasLtCreate(&h_));
    ws_.grow(size_t(64) << 20);
    const cudaDataType_t ot = out_bits == 16 ? CUDA_R_16BF : CUDA_R_32F;
    LT_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    LT_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, s.K, s.N, s.K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, s.K, s.M, s.K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&c_, ot, s.N, s.M, s.N));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsz = ws_.size();
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h_, op_, a_, b_, c_, c_, pref, 1, &algo_, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) cuda::failf("cuBLASLt: no algorithm");
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatmulDescDestroy(op_);
    cublasLtDestroy(h_);
  }
  void run(const uint16_t* x, const uint16_t* W, void* y) {
    const float one = 1.f, zero = 0.f;
    LT_CHECK(cublasLtMatmul(h_, op_, &one, W, a_, x, b_, &zero, y, c_, y, c_, &algo_.algo, ws_.get(), ws_.size(),
                            nullptr));
  }

 private:
  cublasLtHandle_t h_{};
  cublasLtMatmulDesc_t op_{};
  cublasLtMatrixLayout_t a_{}, b_{}, c_{};
  cublasLtMatmulHeuristicResult_t algo_{};
  cuda::DeviceBuffer<uint8_t> ws_;
};

// max |got − ref| / max |ref| over bf16 or fp32 device outputs (NaN counts as a failure).
double rel_err(const void* got, int got_bits, const std::vector<float>& ref) {
  std::vector<float> g(ref.size());
  if (got_bits == 32) {
    M3_CUDA_CHECK(cudaMemcpy(g.data(), got, g.size() * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(ref.size());
    M3_CUDA_CHECK(cudaMemcpy(h.data(), got, h.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); ++i) g[i] = bf16_to_f32(h[i]);
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    num = std::max(num, double(std::fabs(g[i] - ref[i])));
    den = std::max(den, double(std::fabs(ref[i])));
  }
  return num / den;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      Shape s{};
      if (std::sscanf(argv[++i], "%ldx%ldx%ld", &s.M, &s.N, &s.K) != 3) return std::fprintf(stderr, "bad shape\n"), 2;
      shapes.push_back(s);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_gemm [--shape MxNxK ...] [--reps R]\n");
      return 2;
    }
  }
  if (shapes.empty()) shapes = {{8192, 8192, 8192}, {16384, 9216, 6144}, {4096, 4096, 4096}};
  try {
    if (cuda::device_count() == 0) return std::printf("bench_gemm: no CUDA device\n"), 0;
    cudaDeviceProp prop{};
    M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, %d SMs, L2 %d MB\n\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    std::printf("| M×N×K | variant | median ms | min–max ms | TFLOP/s | rel err vs cuBLASLt fp32 out |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::string json;
    for (const Shape& s : shapes) {
      const size_t nx = size_t(s.M * s.K), nw = size_t(s.N * s.K), ny = size_t(s.M * s.N);
      cuda::DeviceBuffer<float> tmp(std::max(nx, nw));
      cuda::DeviceBuffer<uint16_t> x(nx), W(nw);
      bench::fill_uniform(tmp.get(), int64_t(nx), 1234 + s.M, 0.05f, 1.f);
      cuda::f32_to_bf16(tmp.get(), int64_t(nx), x.get(), nullptr);
      bench::fill_uniform(tmp.get(), int64_t(nw), 777 + s.N, 0.05f, 1.f);
      cuda::f32_to_bf16(tmp.get(), int64_t(nw), W.get(), nullptr);
      tmp.reset();
      cuda::DeviceBuffer<float> y32(ny), yref(ny);
      cuda::DeviceBuffer<uint16_t> y16(ny);
      LtGemm lt16(s, 16), lt32(s, 32);
      lt32.run(x.get(), W.get(), yref.get());
      M3_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> ref(ny);
      M3_CUDA_CHECK(cudaMemcpy(ref.data(), yref.get(), ny * 4, cudaMemcpyDeviceToHost));
      yref.reset();

      struct V {
        const char* name;
        int bits;
        void* y;
        std::function<void()> f;
      };
      std::vector<V> vs = {
          {"cublaslt bf16 out", 16, y16.get(), [&] { lt16.run(x.get(), W.get(), y16.get()); }},
          {"wgmma bf16 out", 16, y16.get(),
           [&] { cuda::gemm_bf16_nt_wgmma(x.get(), W.get(), s.M, s.N, s.K, y16.get(), cuda::GemmOut::BF16, nullptr); }},
          {"wgmma fp32 out", 32, y32.get(),
           [&] { cuda::gemm_bf16_nt_wgmma(x.get(), W.get(), s.M, s.N, s.K, y32.get(), cuda::GemmOut::F32, nullptr); }},
      };
      const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
      for (V& v : vs) {
        M3_CUDA_CHECK(cudaMemset(v.y, 0xFF, ny * (v.bits / 8)));  // poison: NaN
        v.f();
        M3_CUDA_CHECK(cudaDeviceSynchronize());
        const double err = rel_err(v.y, v.bits, ref);
        const std::vector<float> t = bench::time_sorted_ms(v.f, 5, reps);
        const float med = t[t.size() / 2];
        const double tf = flops / (med * 1e-3) / 1e12;
        std::printf("| %ldx%ldx%ld | %s | %.3f | %.3f–%.3f | %.0f | %.1e |\n", s.M, s.N, s.K, v.name, med, t.front(),
                    t.back(), tf, err);
        char rec[512];
        std::snprintf(rec, sizeof rec,
                      "{\"op\": \"gemm_bf16_nt\", \"shape\": \"%ldx%ldx%ld\", \"variant\": \"%s\", \"median_us\": %.1f, "
                      "\"useful_tflops\": %.1f, \"rel_err\": %.2e}\n",
                      s.M, s.N, s.K, v.name, med * 1e3, tf, err);
        json += rec;
      }
    }
    std::printf("\n%s", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
