// FP8 ops (backend/cuda/fp8_gemm.cuh) against their CPU twins (backend/cpu/fp8.h): the load-time requantisation
// and the activation quantisation bit for bit, the W8A16 GEMM exactly on one-hot activations (every e4m3 code ×
// many scales) and within fp32 summation noise on random ones, the cuBLASLt block-scaled GEMM within fp32 noise of
// the twin. Outputs poisoned before each run; every element checked written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/mlp_moe.cuh"
#include "backend/cuda/norm_rope.cuh"
#include "base/counter_hash.h"
#include "base/dtype.h"
#include "base/error.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using gpu_test::Dev;
using gpu_test::expect_close;
using gpu_test::rng;
using cuda::GemmOut;

std::string shape_str(int64_t T, int64_t N, int64_t K) {
  return "T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// MXFP8 weights of a realistic shape: N(0, 1) values times a per-column factor spanning 2^±3 (so 32-groups of one
// 128 block get different scales), MX-quantised on the CPU.
struct MxW {
  int64_t N, K;
  std::vector<uint8_t> q, s;
};
MxW make_mx(int64_t N, int64_t K) {
  std::normal_distribution<float> d(0.f, 0.02f);
  std::uniform_real_distribution<float> e(-3.f, 3.f);
  std::vector<float> col(static_cast<size_t>(K)), w(static_cast<size_t>(N * K));
  for (auto& c : col) c = std::exp2(e(rng()));
  for (int64_t i = 0; i < N * K; ++i) w[size_t(i)] = d(rng()) * col[size_t(i % K)];
  MxW m{N, K, std::vector<uint8_t>(w.size()), std::vector<uint8_t>(size_t(N * K / 32))};
  cpu::mx_quantize(w.data(), N, K, m.q.data(), m.s.data());
  return m;
}

std::vector<uint16_t> rand_bf16(size_t n, std::vector<float>* as_float) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<uint16_t> b(n);
  as_float->resize(n);
  for (size_t i = 0; i < n; ++i) {
    b[i] = f32_to_bf16(d(rng()));
    (*as_float)[i] = bf16_to_f32(b[i]);
  }
  return b;
}

std::vector<float> out_floats(const std::vector<uint8_t>& raw, GemmOut out) {
  std::vector<float> f(raw.size() / (out == GemmOut::BF16 ? 2 : 4));
  for (size_t i = 0; i < f.size(); ++i) {
    if (out == GemmOut::BF16) {
      uint16_t h;
      std::memcpy(&h, &raw[2 * i], 2);
      f[i] = bf16_to_f32(h);
    } else {
      std::memcpy(&f[i], &raw[4 * i], 4);
    }
  }
  return f;
}

// Host weights of any format, made from MX on the CPU (the device conversion is checked separately).
struct HostW {
  Fp8Scale fmt;
  std::vector<uint8_t> q;
  std::vector<uint8_t> s_bytes;  // G32 bytes or fp32 scales as bytes
};
HostW convert(const MxW& m, Fp8Scale fmt) {
  if (fmt == Fp8Scale::G32) return {fmt, m.q, m.s};
  HostW h{fmt, std::vector<uint8_t>(m.q.size()), {}};
  std::vector<float> s(size_t(fp8_scale_count(fmt, m.N, m.K)));
  cpu::fp8_requant_from_mx(m.q.data(), m.s.data(), m.N, m.K, fmt, h.q.data(), s.data());
  h.s_bytes.resize(s.size() * 4);
  std::memcpy(h.s_bytes.data(), s.data(), h.s_bytes.size());
  return h;
}

TEST(GpuFp8, RequantisationMatchesCpuBitForBit) {
  M3_SKIP_WITHOUT_GPU();
  for (auto [N, K] : {std::pair<int64_t, int64_t>{300, 704}, {128, 6144}, {1, 96}}) {
    const MxW m = make_mx(N, K);
    Dev<uint8_t> dq(m.q), ds(m.s);
    for (Fp8Scale fmt : {Fp8Scale::Row128, Fp8Scale::Blk128}) {
      const HostW ref = convert(m, fmt);
      Dev<uint8_t> q2(m.q.size());
      Dev<float> s2(size_t(fp8_scale_count(fmt, N, K)));
      q2.poison();
      s2.poison();
      cuda::fp8_requant_from_mx(dq.p(), ds.p(), N, K, fmt, q2.p(), s2.p(), nullptr);
      const auto gq = q2.get();
      const auto gs = s2.get();
      size_t qdiff = 0;
      for (size_t i = 0; i < gq.size(); ++i) qdiff += gq[i] != ref.q[i];
      EXPECT_EQ(qdiff, 0u) << fp8_scale_name(fmt) << " " << shape_str(0, N, K);
      EXPECT_EQ(std::memcmp(gs.data(), ref.s_bytes.data(), ref.s_bytes.size()), 0) << fp8_scale_name(fmt);
      std::printf("[gpu-op] fp8_requant %-14s N=%lld K=%lld  value mismatches %zu of %zu (exact)\n",
                  fp8_scale_name(fmt), (long long)N, (long long)K, qdiff, gq.size());
    }
  }
}

TEST(GpuFp8, ActivationQuantisationMatchesCpuBitForBit) {
  M3_SKIP_WITHOUT_GPU();
  const int64_t T = 37, Tp = 40, K = 1024, L = K / 128;
  std::vector<float> xf;
  const std::vector<uint16_t> xb = rand_bf16(size_t(T * K), &xf);
  for (int64_t k = 0; k < 128; ++k) xf[size_t(5 * K + k)] = 0.f;  // a zero block: scale 1
  std::vector<uint16_t> xb2 = xb;
  for (int64_t k = 0; k < 128; ++k) xb2[size_t(5 * K + k)] = 0;
  std::vector<uint8_t> rq(size_t(Tp * K), 0);
  std::vector<float> rs(size_t(L * Tp), 1.0f);
  cpu::fp8_quantize_act_1x128(xf.data(), T, K, rq.data(), rs.data(), Tp);
  for (bool bf16 : {true, false}) {
    Dev<uint16_t> dxb(xb2);
    Dev<float> dxf(xf);
    Dev<uint8_t> q(size_t(Tp * K));
    Dev<float> s(size_t(L * Tp));
    q.poison();
    s.poison();
    cuda::fp8_quantize_act_1x128(bf16 ? static_cast<const void*>(dxb.p()) : dxf.p(), bf16, T, Tp, K, q.p(), s.p(), Tp,
                                 nullptr);
    EXPECT_EQ(q.get(), rq) << (bf16 ? "bf16" : "f32");
    const auto gs = s.get();
    EXPECT_EQ(std::memcmp(gs.data(), rs.data(), rs.size() * 4), 0) << (bf16 ? "bf16" : "f32");
  }
}

TEST(GpuFp8, W8A16IsExactOnOneHotActivationsForEveryCodeAndScale) {
  M3_SKIP_WITHOUT_GPU();
  // W[n, k] = code (n + 3k) mod 256 (NaN codes → 0), scales 2^(e − 127) with e ∈ [100, 134]; x = one-hot rows, so
  // y[m, n] = W[n, m] must come out exactly (fp32 out): the register dequantisation is exact.
  const int64_t N = 256, K = 64, T = 64;
  std::vector<uint8_t> q(size_t(N * K)), s(size_t(N * K / 32));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      uint8_t c = uint8_t((n + 3 * k) & 255);
      q[size_t(n * K + k)] = (c & 0x7f) == 0x7f ? 0 : c;
    }
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(100 + (i * 7) % 35);
  std::vector<uint16_t> x(size_t(T * K), 0);
  for (int64_t m = 0; m < T; ++m) x[size_t(m * K + m)] = 0x3f80;  // 1.0
  std::vector<float> W(size_t(N * K));
  cpu::fp8_dequant(q.data(), s.data(), Fp8Scale::G32, N, K, W.data());
  Dev<uint8_t> dq(q), ds(s);
  Dev<uint16_t> dx(x);
  Dev<float> y(size_t(T * N));
  cuda::Fp8Gemm g;
  for (int nt : {1, 2, 4}) {
    y.poison();
    g.w8a16(dx.p(), T, {dq.p(), ds.p(), Fp8Scale::G32, N, K}, y.p(), GemmOut::F32, false, nullptr, nt);
    const auto got = y.get();
    size_t bad = 0;
    for (int64_t m = 0; m < T; ++m)
      for (int64_t n = 0; n < N; ++n) bad += got[size_t(m * N + n)] != W[size_t(n * K + m)];
    EXPECT_EQ(bad, 0u) << "nt=" << nt;
    std::printf("[gpu-op] fp8_w8a16 one-hot nt=%d  mismatches %zu of %lld (exact)\n", nt, bad, (long long)(T * N));
  }
}

TEST(GpuFp8, W8A16LinesVariantIsExactOnOneHotActivations) {
  M3_SKIP_WITHOUT_GPU();
  // As above for the whole-line kernel (K = 256: two 128-byte lines per row, 16 token rows per call).
  const int64_t N = 256, K = 256, T = 40;
  std::vector<uint8_t> q(size_t(N * K)), s(size_t(N * K / 32));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      uint8_t c = uint8_t((n + 3 * k) & 255);
      q[size_t(n * K + k)] = (c & 0x7f) == 0x7f ? 0 : c;
    }
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(100 + (i * 7) % 35);
  std::vector<uint16_t> x(size_t(T * K), 0);
  for (int64_t m = 0; m < T; ++m) x[size_t(m * K + (m * 5) % K)] = 0x3f80;  // 1.0
  std::vector<float> W(size_t(N * K));
  cpu::fp8_dequant(q.data(), s.data(), Fp8Scale::G32, N, K, W.data());
  Dev<uint8_t> dq(q), ds(s);
  Dev<uint16_t> dx(x);
  Dev<float> y(size_t(T * N));
  cuda::Fp8Gemm g;
  for (int nt : {1, 2}) {
    y.poison();
    g.w8a16(dx.p(), T, {dq.p(), ds.p(), Fp8Scale::G32, N, K}, y.p(), GemmOut::F32, false, nullptr, nt,
            cuda::W8Kernel::Lines128);
    const auto got = y.get();
    size_t bad = 0;
    for (int64_t m = 0; m < T; ++m)
      for (int64_t n = 0; n < N; ++n) bad += got[size_t(m * N + n)] != W[size_t(n * K + (m * 5) % K)];
    EXPECT_EQ(bad, 0u) << "nt=" << nt;
    std::printf("[gpu-op] fp8_w8a16 lines one-hot nt=%d  mismatches %zu of %lld (exact)\n", nt, bad, (long long)(T * N));
  }
}

TEST(GpuFp8, W8A16MatchesCpuTwin) {
  M3_SKIP_WITHOUT_GPU();
  cuda::Fp8Gemm g;
  struct S {
    int64_t T, N, K;
  };
  for (S sh : {S{1, 96, 128}, S{3, 1152, 6144}, S{8, 6144, 3072}, S{17, 512, 6144}, S{64, 1024, 2048}, S{12, 768, 1024},
               S{1, 9216, 6144}, S{130, 640, 1024}}) {
    const MxW m = make_mx(sh.N, sh.K);
    std::vector<float> xf;
    const auto xb = rand_bf16(size_t(sh.T * sh.K), &xf);
    Dev<uint16_t> dx(xb);
    for (Fp8Scale fmt : {Fp8Scale::G32, Fp8Scale::Row128, Fp8Scale::Blk128}) {
      if (fmt != Fp8Scale::G32 && sh.K % 128) continue;
      const HostW h = convert(m, fmt);
      Dev<uint8_t> dq(h.q), ds(h.s_bytes);
      std::vector<float> ref(size_t(sh.T * sh.N));
      cpu::matmul_fp8_w8a16(xf.data(), sh.T, sh.K, h.q.data(), h.s_bytes.data(), fmt, sh.N, ref.data());
      const cuda::Fp8Weight W{dq.p(), ds.p(), fmt, sh.N, sh.K};
      for (GemmOut out : {GemmOut::F32, GemmOut::BF16}) {
        const size_t esz = out == GemmOut::BF16 ? 2 : 4;
        Dev<uint8_t> y(ref.size() * esz);
        y.poison();
        g.w8a16(dx.p(), sh.T, W, y.p(), out, false, nullptr);
        expect_close(std::string("fp8_w8a16 ") + fp8_scale_name(fmt) + (out == GemmOut::BF16 ? " bf16" : " f32"),
                     shape_str(sh.T, sh.N, sh.K), out_floats(y.get(), out), ref, out == GemmOut::BF16 ? 8e-3 : 1e-4);
        if (sh.K % 128 == 0) {  // the whole-line variant, every format
          y.poison();
          g.w8a16(dx.p(), sh.T, W, y.p(), out, false, nullptr, 0, cuda::W8Kernel::Lines128);
          expect_close(std::string("fp8_w8a16 lines ") + fp8_scale_name(fmt) + (out == GemmOut::BF16 ? " bf16" : " f32"),
                       shape_str(sh.T, sh.N, sh.K), out_floats(y.get(), out), ref, out == GemmOut::BF16 ? 8e-3 : 1e-4);
        }
        if (fmt == Fp8Scale::G32 && out == GemmOut::F32 && sh.T == 17) {  // accumulate, and every nt
          std::vector<float> y0 = gpu_test::rand_vec(ref.size()), ref2 = ref;
          for (size_t i = 0; i < ref2.size(); ++i) ref2[i] += y0[i];
          Dev<float> ya(y0);
          g.w8a16(dx.p(), sh.T, W, ya.p(), out, true, nullptr);
          expect_close("fp8_w8a16 accumulate", shape_str(sh.T, sh.N, sh.K), ya.get(), ref2, 1e-4);
          for (int nt : {1, 2, 4}) {
            y.poison();
            g.w8a16(dx.p(), sh.T, W, y.p(), out, false, nullptr, nt);
            expect_close("fp8_w8a16 nt=" + std::to_string(nt), shape_str(sh.T, sh.N, sh.K), out_floats(y.get(), out),
                         ref, 1e-4);
          }
        }
      }
    }
  }
}

TEST(GpuFp8, BlockScaledCublasLtMatchesCpuTwin) {
  M3_SKIP_WITHOUT_GPU();
  cuda::Fp8Gemm g;
  struct S {
    int64_t T, N, K;
  };
  for (S sh : {S{128, 1024, 1024}, S{37, 768, 2048}, S{512, 640, 6144}, S{8, 9216, 6144}}) {
    const MxW m = make_mx(sh.N, sh.K);
    std::vector<float> xf;
    const auto xb = rand_bf16(size_t(sh.T * sh.K), &xf);
    const int64_t Tp = (sh.T + 3) / 4 * 4;
    std::vector<uint8_t> xq(size_t(Tp * sh.K), 0);
    std::vector<float> xs(size_t(sh.K / 128 * Tp), 1.f);
    cpu::fp8_quantize_act_1x128(xf.data(), sh.T, sh.K, xq.data(), xs.data(), Tp);
    Dev<uint16_t> dx(xb);
    for (Fp8Scale fmt : {Fp8Scale::Blk128, Fp8Scale::Row128}) {
      const HostW h = convert(m, fmt);
      Dev<uint8_t> dq(h.q), ds(h.s_bytes);
      std::vector<float> ref(size_t(sh.T * sh.N));
      cpu::matmul_fp8_blockscaled(xq.data(), xs.data(), Tp, sh.T, sh.K, h.q.data(),
                                  reinterpret_cast<const float*>(h.s_bytes.data()), fmt, sh.N, ref.data());
      const cuda::Fp8Weight W{dq.p(), ds.p(), fmt, sh.N, sh.K};
      for (GemmOut out : {GemmOut::F32, GemmOut::BF16}) {
        const size_t esz = out == GemmOut::BF16 ? 2 : 4;
        Dev<uint8_t> y(ref.size() * esz);
        y.poison();
        try {
          g.blockscaled(dx.p(), true, sh.T, W, y.p(), out, false, nullptr);
        } catch (const std::exception& e) {
          ADD_FAILURE() << fp8_scale_name(fmt) << " " << shape_str(sh.T, sh.N, sh.K) << ": " << e.what();
          continue;
        }
        std::printf("[gpu-op] fp8_cublaslt arrangement: %s\n", g.lt_arrangement(sh.T, W, out, false));
        expect_close(std::string("fp8_cublaslt ") + fp8_scale_name(fmt) + (out == GemmOut::BF16 ? " bf16" : " f32"),
                     shape_str(sh.T, sh.N, sh.K), out_floats(y.get(), out), ref, out == GemmOut::BF16 ? 8e-3 : 1e-3);
        if (out == GemmOut::F32 && sh.T == 37) {  // accumulate (through the padded-T staging)
          std::vector<float> y0 = gpu_test::rand_vec(ref.size()), ref2 = ref;
          for (size_t i = 0; i < ref2.size(); ++i) ref2[i] += y0[i];
          Dev<float> ya(y0);
          g.blockscaled(dx.p(), true, sh.T, W, ya.p(), out, true, nullptr);
          expect_close("fp8_cublaslt accumulate", shape_str(sh.T, sh.N, sh.K), ya.get(), ref2, 1e-3);
        }
      }
    }
  }
}

// Fp8Gemm::proj, the executor's `--dtype fp8` projection (base/fp8_format.h fp8_pick_path): Blk128 weights at the
// MXFP8 fixture's shapes (K = 64 and 192 take only the chunk kernel, N = 96 and 192 no cuBLASLt) and at T on both
// sides of the threshold, with β = 1 (the residual accumulate of the O and down projections) — against the twin of
// the path it picks.
TEST(GpuFp8, ProjectionPicksItsKernelByRowsAndMatchesThatKernelsTwin) {
  M3_SKIP_WITHOUT_GPU();
  cuda::Fp8Gemm g;
  struct S {
    int64_t N, K;
  };
  for (S sh : {S{384, 128}, S{96, 128}, S{128, 256}, S{128, 192}, S{128, 64}, S{192, 256}, S{640, 1024}})
    for (int64_t T : {1, 5, 12, 16, 150})
      for (int64_t lt : {0, 16}) {
        const MxW m = make_mx(sh.N, sh.K);
        const HostW h = convert(m, Fp8Scale::Blk128);
        Dev<uint8_t> dq(h.q), ds(h.s_bytes);
        const cuda::Fp8Weight W{dq.p(), ds.p(), Fp8Scale::Blk128, sh.N, sh.K};
        std::vector<float> xf;
        const auto xb = rand_bf16(size_t(T * sh.K), &xf);
        Dev<uint16_t> dx(xb);
        const Fp8Path path = fp8_pick_path(T, sh.N, sh.K, lt);
        std::vector<float> ref(size_t(T * sh.N));
        if (path == Fp8Path::Lt) {
          const int64_t Tp = (T + 3) / 4 * 4;
          std::vector<uint8_t> xq(size_t(Tp * sh.K), 0);
          std::vector<float> xs(size_t(sh.K / 128 * Tp), 1.f);
          cpu::fp8_quantize_act_1x128(xf.data(), T, sh.K, xq.data(), xs.data(), Tp);
          cpu::matmul_fp8_blockscaled(xq.data(), xs.data(), Tp, T, sh.K, h.q.data(),
                                      reinterpret_cast<const float*>(h.s_bytes.data()), Fp8Scale::Blk128, sh.N,
                                      ref.data());
        } else {
          cpu::matmul_fp8_w8a16(xf.data(), T, sh.K, h.q.data(), h.s_bytes.data(), Fp8Scale::Blk128, sh.N, ref.data());
        }
        const std::string what = std::string("fp8 proj ") + fp8_path_name(path) + " lt " + std::to_string(lt);
        Dev<float> y(ref.size());
        y.poison();
        g.proj(dx.p(), T, W, y.p(), GemmOut::F32, false, lt, nullptr);
        expect_close(what, shape_str(T, sh.N, sh.K), y.get(), ref, path == Fp8Path::Lt ? 1e-3 : 1e-4);
        std::vector<float> y0 = gpu_test::rand_vec(ref.size()), ref2 = ref;
        for (size_t i = 0; i < ref2.size(); ++i) ref2[i] += y0[i];
        Dev<float> ya(y0);
        g.proj(dx.p(), T, W, ya.p(), GemmOut::F32, true, lt, nullptr);
        expect_close(what + " accumulate", shape_str(T, sh.N, sh.K), ya.get(), ref2,
                     path == Fp8Path::Lt ? 1e-3 : 1e-4);
      }
}

// The fused writers of FP8×FP8 GEMM inputs (docs/FP8.md §3): the RMS norm and the SwiGLU quantise their bf16 output
// per 1×128 in their own pass. Each must equal its two-pass form (the bf16 kernel, then fp8_quantize_act_1x128) bit for
// bit — codes, scales and the padding rows — for T not a multiple of 4, a zero block, widths on the register path
// (256, 6144) and beyond it (12288: the norm's fallback).
template <typename T>
size_t count_diff(const std::vector<T>& a, const std::vector<T>& b) {
  size_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n;
}

TEST(GpuFp8, NormWithFusedQuantisationEqualsNormThenQuantisation) {
  M3_SKIP_WITHOUT_GPU();
  for (int64_t D : {256, 6144, 12288})
    for (int64_t T : {1, 5, 37}) {
      const int64_t Tp = (T + 3) / 4 * 4, L = D / 128;
      std::vector<float> x = gpu_test::rand_vec(size_t(T * D)), w = gpu_test::rand_vec(size_t(D));
      for (int64_t k = 0; k < D; ++k) x[size_t(k)] *= 40.f;  // a row far from unit scale
      Dev<float> dx(x), dw(w);
      Dev<uint16_t> yb_ref(size_t(T * D)), yb(size_t(T * D));
      Dev<uint8_t> q_ref(size_t(Tp * D)), q(size_t(Tp * D));
      Dev<float> s_ref(size_t(L * Tp)), sc(size_t(L * Tp));
      q.poison(), sc.poison(), yb.poison();
      cuda::rms_norm_gemma_bf16(dx.p(), T, D, dw.p(), 1e-6f, yb_ref.p(), nullptr, nullptr);
      cuda::fp8_quantize_act_1x128(yb_ref.p(), true, T, Tp, D, q_ref.p(), s_ref.p(), Tp, nullptr);
      cuda::rms_norm_gemma_bf16_e4m3(dx.p(), T, D, dw.p(), 1e-6f, yb.p(), cuda::Fp8ActOut{q.p(), sc.p(), Tp, Tp},
                                     nullptr);
      const std::string what = "D=" + std::to_string(D) + " T=" + std::to_string(T);
      EXPECT_EQ(count_diff(yb.get(), yb_ref.get()), 0u) << what;
      EXPECT_EQ(count_diff(q.get(), q_ref.get()), 0u) << what;
      EXPECT_EQ(count_diff(sc.get(), s_ref.get()), 0u) << what;
      if (D <= 8192) {  // the register path may skip the bf16 output
        Dev<uint8_t> q2(size_t(Tp * D));
        Dev<float> s2(size_t(L * Tp));
        q2.poison(), s2.poison();
        cuda::rms_norm_gemma_bf16_e4m3(dx.p(), T, D, dw.p(), 1e-6f, nullptr, cuda::Fp8ActOut{q2.p(), s2.p(), Tp, Tp},
                                       nullptr);
        EXPECT_EQ(count_diff(q2.get(), q_ref.get()), 0u) << what << " without bf16";
        EXPECT_EQ(count_diff(s2.get(), s_ref.get()), 0u) << what << " without bf16";
      }
      std::printf("[gpu-op] rms_norm_gemma_bf16_e4m3 %s: codes, scales, padding equal to norm + quantise\n",
                  what.c_str());
    }
}

TEST(GpuFp8, SwiGluWithFusedQuantisationEqualsSwiGluThenQuantisation) {
  M3_SKIP_WITHOUT_GPU();
  const float alpha = 1.702f, limit = 7.0f;
  for (int64_t I : {128, 3072})
    for (int64_t T : {1, 6, 37}) {
      const int64_t Tp = (T + 3) / 4 * 4, L = I / 128;
      std::vector<float> gu = gpu_test::rand_vec(size_t(T * 2 * I));
      for (size_t i = 0; i < gu.size(); i += 7) gu[i] *= 12.f;  // beyond the clamp on both sides
      for (int64_t k = 0; k < 128; ++k) gu[size_t(k)] = -1e4f;  // row 0's first block: gate far negative → act 0
      Dev<float> dgu(gu);
      // The two-pass form: the SwiGLU in fp32 rounded to bf16 (what run_mlp's bf16 SwiGLU writes), then quantised.
      Dev<float> act32(size_t(T * I));
      cuda::swiglu_oai(dgu.p(), T, I, alpha, limit, act32.p(), nullptr);
      std::vector<float> a32 = act32.get();
      std::vector<uint16_t> ab(a32.size());
      for (size_t i = 0; i < a32.size(); ++i) ab[i] = f32_to_bf16(a32[i]);
      Dev<uint16_t> dab(ab);
      Dev<uint8_t> q_ref(size_t(Tp * I)), q(size_t(Tp * I));
      Dev<float> s_ref(size_t(L * Tp)), sc(size_t(L * Tp));
      q.poison(), sc.poison();
      cuda::fp8_quantize_act_1x128(dab.p(), true, T, Tp, I, q_ref.p(), s_ref.p(), Tp, nullptr);
      cuda::swiglu_oai_e4m3(dgu.p(), T, I, alpha, limit, cuda::Fp8ActOut{q.p(), sc.p(), Tp, Tp}, nullptr);
      const std::string what = "I=" + std::to_string(I) + " T=" + std::to_string(T);
      EXPECT_EQ(count_diff(q.get(), q_ref.get()), 0u) << what;
      EXPECT_EQ(count_diff(sc.get(), s_ref.get()), 0u) << what;
      std::printf("[gpu-op] swiglu_oai_e4m3 %s: codes, scales, padding equal to SwiGLU + quantise\n", what.c_str());
    }
}

// Fp8Gemm::proj on a pre-quantised input (the fused writers' output) equals proj quantising xb itself, bit for bit;
// a path other than cuBLASLt FP8 ignores xq, and no bf16 input for such a path is an error.
TEST(GpuFp8, ProjectionOnPreQuantisedInputEqualsItsOwnQuantisation) {
  M3_SKIP_WITHOUT_GPU();
  cuda::Fp8Gemm g;
  const int64_t N = 640, K = 1024, T = 150, Tp = 152;
  const HostW h = convert(make_mx(N, K), Fp8Scale::Blk128);
  Dev<uint8_t> dq(h.q), ds(h.s_bytes);
  const cuda::Fp8Weight W{dq.p(), ds.p(), Fp8Scale::Blk128, N, K};
  std::vector<float> xf;
  Dev<uint16_t> dx(rand_bf16(size_t(T * K), &xf));
  Dev<uint8_t> xq(size_t(Tp * K));
  Dev<float> xs(size_t(K / 128 * Tp));
  cuda::fp8_quantize_act_1x128(dx.p(), true, T, Tp, K, xq.p(), xs.p(), Tp, nullptr);
  const cuda::Fp8ActOut pre{xq.p(), xs.p(), Tp, Tp};
  ASSERT_TRUE(cuda::Fp8Gemm::proj_quantises(T, W, 16));
  Dev<float> y1(size_t(T * N)), y2(size_t(T * N));
  g.proj(dx.p(), T, W, y1.p(), GemmOut::F32, false, 16, nullptr);
  g.proj(nullptr, T, W, y2.p(), GemmOut::F32, false, 16, nullptr, &pre);
  EXPECT_EQ(count_diff(y1.get(), y2.get()), 0u);
  const cuda::Fp8ActOut bad{xq.p(), xs.p(), Tp + 4, Tp + 4};
  EXPECT_THROW(g.proj(nullptr, T, W, y2.p(), GemmOut::F32, false, 16, nullptr, &bad), Error);
  EXPECT_FALSE(cuda::Fp8Gemm::proj_quantises(T, W, 0));
  EXPECT_THROW(g.proj(nullptr, T, W, y2.p(), GemmOut::F32, false, 0, nullptr, &pre), Error);  // W8A16 needs xb
}

// FP8 dummy weights: every value is the bf16 dummy fill's uniform value quantised to e4m3 with the tensor's one
// power-of-two scale, every Blk128 scale that 2^S.
TEST(GpuFp8, DummyFillIsTheCounterUniformValueQuantisedWithOneScale) {
  M3_SKIP_WITHOUT_GPU();
  const int64_t N = 200, K = 384;
  const float scale = 0.05f;
  const uint64_t key = counter_key(7, 3);
  Dev<uint8_t> q(size_t(N * K)), sc(size_t(fp8_scale_count(Fp8Scale::Blk128, N, K)) * 4);
  cuda::fp8_fill_counter_uniform(q.p(), sc.p(), Fp8Scale::Blk128, N, K, key, scale, nullptr);
  const int S = fp8_dummy_exponent(scale);
  const std::vector<uint8_t> hq = q.get(), hs = sc.get();
  size_t bad = 0;
  for (int64_t i = 0; i < N * K; ++i)
    bad += hq[size_t(i)] != cpu::e4m3_rne(counter_uniform(key, uint64_t(i), scale) * std::ldexp(1.0f, -S));
  EXPECT_EQ(bad, 0u);
  for (size_t i = 0; i < hs.size() / 4; ++i) {
    float f;
    std::memcpy(&f, &hs[4 * i], 4);
    EXPECT_EQ(f, std::ldexp(1.0f, S)) << i;
  }
}

}  // namespace
}  // namespace m3
