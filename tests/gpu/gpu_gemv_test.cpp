// The weight-streaming GEMV (backend/cuda/gemv.cuh) against an fp64 product of the same bf16 / dequantised e4m3
// values: every T it takes (1–8), ragged N, fp32 and bf16 outputs, accumulate, both FP8 scale layouts; and the
// shapes it must refuse.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/fp8.h"
#include "backend/cuda/gemv.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using gpu_test::Dev;

// y_ref[t, n] = y0[t, n] (if accumulate) + Σ_k x[t, k]·w[n, k] in fp64.
std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w, int64_t T, int64_t K,
                             int64_t N, const std::vector<float>* y0) {
  std::vector<float> y(size_t(T * N));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = y0 ? double((*y0)[size_t(t * N + n)]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(x[size_t(t * K + k)]) * w[size_t(n * K + k)];
      y[size_t(t * N + n)] = float(s);
    }
  return y;
}
std::vector<float> reference(const std::vector<uint16_t>& x, const std::vector<float>& w, int64_t T, int64_t K,
                             int64_t N, const std::vector<float>* y0) {
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  return reference(xf, w, T, K, N, y0);
}

std::vector<uint16_t> bf16_vec(size_t n) {
  std::vector<uint16_t> v(n);
  const auto f = gpu_test::rand_vec(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

// Runs one call (fp32 or bf16 out, with or without accumulate) and checks it. `run` launches into y.
template <typename Run>
void check(const char* op, const std::vector<uint16_t>& x, const std::vector<float>& wref, int64_t T, int64_t K,
           int64_t N, Run run) {
  for (int mode = 0; mode < 4; ++mode) {
    const bool acc = mode & 1, bf16_out = mode & 2;
    const auto y0 = gpu_test::rand_vec(size_t(T * N));
    std::vector<float> y0r = y0;
    if (bf16_out)
      for (float& v : y0r) v = round_to_bf16(v);
    const std::vector<float> ref = reference(x, wref, T, K, N, acc ? &y0r : nullptr);
    std::vector<float> got(size_t(T * N));
    if (bf16_out) {
      std::vector<uint16_t> yb(size_t(T * N));
      for (size_t i = 0; i < yb.size(); ++i) yb[i] = f32_to_bf16(y0r[i]);
      Dev<uint16_t> dy(yb);
      if (!acc) dy.poison();
      run(dy.p(), cuda::GemmOut::BF16, acc);
      const auto h = dy.get();
      for (size_t i = 0; i < h.size(); ++i) got[i] = bf16_to_f32(h[i]);
    } else {
      Dev<float> dy(y0);
      if (!acc) dy.poison();
      run(dy.p(), cuda::GemmOut::F32, acc);
      got = dy.get();
    }
    char shape[96];
    std::snprintf(shape, sizeof shape, "T=%lld K=%lld N=%lld %s%s", (long long)T, (long long)K, (long long)N,
                  bf16_out ? "bf16 out" : "fp32 out", acc ? " +=" : "");
    // fp32 sums in another order than fp64 (K ≤ 8192 terms of |x·w| ≤ 1): 1e-5 of max; bf16 output rounding: 8e-3.
    gpu_test::expect_close(op, shape, got, ref, bf16_out ? 8e-3 : 1e-5);
  }
}

TEST(GpuGemv, Bf16WeightsMatchAnFp64ProductAtEveryRowCount) {
  M3_SKIP_WITHOUT_GPU();
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{256, 37}, {1024, 300}, {6144, 1029}}) {
    const auto w = bf16_vec(size_t(N * K));
    std::vector<float> wref(w.size());
    for (size_t i = 0; i < w.size(); ++i) wref[i] = bf16_to_f32(w[i]);
    Dev<uint16_t> dw(w);
    for (int64_t T = 1; T <= cuda::kGemvMaxRows; T += (K > 1024 ? 3 : 1)) {
      const auto x = bf16_vec(size_t(T * K));
      Dev<uint16_t> dx(x);
      check("gemv_bf16", x, wref, T, K, N, [&](void* y, cuda::GemmOut out, bool acc) {
        cuda::gemv_bf16(dx.p(), T, K, dw.p(), N, y, out, acc, nullptr);
      });
    }
  }
}

TEST(GpuGemv, E4m3WeightsWithBlockAndRowScalesMatchAnFp64Product) {
  M3_SKIP_WITHOUT_GPU();
  std::uniform_int_distribution<int> code(0, 255), ex(-6, 3);
  for (const Fp8Scale fmt : {Fp8Scale::Blk128, Fp8Scale::Row128})
    for (const auto& [K, N] : {std::pair<int64_t, int64_t>{512, 45}, {2048, 260}, {6144, 515}}) {
      std::vector<uint8_t> q(size_t(N * K));
      for (auto& c : q) {
        int v = code(gpu_test::rng());
        if ((v & 0x7f) == 0x7f) v &= 0xfe;  // not the NaN code
        c = uint8_t(v);
      }
      std::vector<float> sc(size_t(fp8_scale_count(fmt, N, K)));
      for (auto& s : sc) s = std::ldexp(1.0f, ex(gpu_test::rng()));
      std::vector<float> wref(q.size());
      cpu::fp8_dequant(q.data(), sc.data(), fmt, N, K, wref.data());
      Dev<uint8_t> dq(q);
      Dev<float> ds(sc);
      const cuda::Fp8Weight W{dq.p(), ds.p(), fmt, N, K};
      for (int64_t T : {1, 2, 4, 5, 8}) {
        const auto x = bf16_vec(size_t(T * K));
        Dev<uint16_t> dx(x);
        for (const cuda::GemvKernel kern : {cuda::GemvKernel::Fma, cuda::GemvKernel::Mma}) {
          const bool mma = kern == cuda::GemvKernel::Mma;
          check(fmt == Fp8Scale::Blk128 ? (mma ? "gemv_e4m3 mma blk128" : "gemv_e4m3 fma blk128")
                                        : (mma ? "gemv_e4m3 mma row128" : "gemv_e4m3 fma row128"),
                x, wref, T, K, N, [&](void* y, cuda::GemmOut out, bool acc) {
                  cuda::gemv_e4m3(dx.p(), T, W, y, out, acc, nullptr, kern);
                });
        }
      }
    }
}

// The tensor-core kernel multiplies x as f16: values beyond f16's range saturate to ±65504 (never ±inf), values
// below 2^-14 round to f16 subnormals. Reference: the same product on x clamped to ±65504 (the tiny values' error is
// far below the tolerance).
TEST(GpuGemv, E4m3TensorCoreKernelSaturatesActivationsBeyondF16) {
  M3_SKIP_WITHOUT_GPU();
  const int64_t K = 1024, N = 2 * 16 * 3 + 5, T = 3;
  std::vector<uint8_t> q(size_t(N * K));
  std::uniform_int_distribution<int> code(0, 0x5f);  // |w| ≤ 2^4 · 1.875
  for (auto& c : q) c = uint8_t(code(gpu_test::rng()) | (gpu_test::rng()() & 1 ? 0x80 : 0));
  std::vector<float> sc(size_t(fp8_scale_count(Fp8Scale::Blk128, N, K)), 0.25f);
  std::vector<float> wref(q.size());
  cpu::fp8_dequant(q.data(), sc.data(), Fp8Scale::Blk128, N, K, wref.data());
  auto x = bf16_vec(size_t(T * K));
  for (size_t i = 0; i < x.size(); i += 97) x[i] = f32_to_bf16(i % 2 ? 3.0e6f : -1.0e5f);  // beyond 65504
  for (size_t i = 5; i < x.size(); i += 89) x[i] = f32_to_bf16(3.0e-6f);                  // f16 subnormal
  std::vector<float> xc(x.size());  // 65504 is not a bf16 value: the clamped reference stays fp32
  for (size_t i = 0; i < x.size(); ++i) xc[i] = std::clamp(bf16_to_f32(x[i]), -65504.f, 65504.f);
  Dev<uint8_t> dq(q);
  Dev<float> ds(sc);
  Dev<uint16_t> dx(x);
  const cuda::Fp8Weight W{dq.p(), ds.p(), Fp8Scale::Blk128, N, K};
  const std::vector<float> ref = reference(xc, wref, T, K, N, nullptr);
  Dev<float> dy(size_t(T * N));
  cuda::gemv_e4m3(dx.p(), T, W, dy.p(), cuda::GemmOut::F32, false, nullptr, cuda::GemvKernel::Mma);
  gpu_test::expect_close("gemv_e4m3 mma", "saturated x", dy.get(), ref, 1e-5);
}

TEST(GpuGemv, RefusesWhatItDoesNotTake) {
  M3_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::gemv_supported(0, 256, false));
  EXPECT_FALSE(cuda::gemv_supported(9, 256, false));
  EXPECT_FALSE(cuda::gemv_supported(1, 384, false));
  EXPECT_FALSE(cuda::gemv_supported(1, 256, true));
  EXPECT_TRUE(cuda::gemv_supported(8, 6144, true));
  Dev<uint16_t> x(size_t(16 * 512)), w(size_t(64 * 512));
  Dev<float> y(size_t(16 * 64));
  EXPECT_THROW(cuda::gemv_bf16(x.p(), 9, 512, w.p(), 64, y.p(), cuda::GemmOut::F32, false, nullptr), Error);
  EXPECT_THROW(cuda::gemv_bf16(x.p(), 1, 384, w.p(), 64, y.p(), cuda::GemmOut::F32, false, nullptr), Error);
  EXPECT_THROW(cuda::gemv_bf16(x.p() + 1, 1, 512, w.p(), 64, y.p(), cuda::GemmOut::F32, false, nullptr), Error);
  Dev<uint8_t> q(size_t(64 * 512));
  Dev<float> s(size_t(64));
  const cuda::Fp8Weight g32{q.p(), s.p(), Fp8Scale::G32, 64, 512};
  EXPECT_THROW(cuda::gemv_e4m3(x.p(), 1, g32, y.p(), cuda::GemmOut::F32, false, nullptr), Error);
}

}  // namespace
}  // namespace m3
