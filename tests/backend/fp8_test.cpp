// The FP8 formats' CPU definitions (backend/cpu/fp8.h): the fast e4m3 rounding against base/dtype.h's exhaustive
// one, the scale layouts, requantisation from MXFP8 (lossless when a block shares one scale, lossy exactly where
// docs/FP8.md says), the 1×128 activation quantisation and the GEMM twins.
#include "backend/cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "base/dtype.h"

namespace m3::cpu {
namespace {

TEST(Fp8, E4m3RoundingMatchesTheExhaustiveSearchIncludingTiesAndSaturation) {
  std::vector<float> probes = {0.f, -0.f, 448.f, 449.f, 464.f, 1e9f, -1e9f, 0x1p-10f, 0x1p-11f, 3 * 0x1p-11f,
                               0x1p-6f, 0x1.1p-6f};
  for (int c = 0; c < 127; ++c) {  // every finite magnitude, the midpoints to the next code, and nudges around them
    const float v = e4m3_to_f32(uint8_t(c)), nxt = e4m3_to_f32(uint8_t(c + 1));
    const float mid = 0.5f * (v + nxt);
    for (float f : {v, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)}) {
      probes.push_back(f);
      probes.push_back(-f);
    }
  }
  std::mt19937_64 g(7);
  std::uniform_real_distribution<float> e(-14.f, 10.f);
  for (int i = 0; i < 20000; ++i) probes.push_back((i & 1 ? -1.f : 1.f) * std::exp2(e(g)));
  for (float f : probes) ASSERT_EQ(e4m3_rne(f), f32_to_e4m3(f)) << f;
  EXPECT_EQ(e4m3_rne(std::nanf("")), 0x7f);
}

TEST(Fp8, ScaleLayoutsAreTheOnesCublasLtReads) {
  // Blk128: [ceil(N/128)][round_up(ceil(K/128), 4)], K blocks contiguous.
  EXPECT_EQ(fp8_scale_count(Fp8Scale::Blk128, 300, 640), 3 * 8);
  EXPECT_EQ(fp8_scale_index(Fp8Scale::Blk128, 300, 640, 129, 513), 1 * 8 + 4);
  // Row128: [ceil(K/128)][round_up(N, 4)], rows contiguous.
  EXPECT_EQ(fp8_scale_count(Fp8Scale::Row128, 301, 640), 5 * 304);
  EXPECT_EQ(fp8_scale_index(Fp8Scale::Row128, 301, 640, 7, 300), 2 * 304 + 7);
  // G32: the checkpoint's [N][K/32].
  EXPECT_EQ(fp8_scale_index(Fp8Scale::G32, 4, 96, 3, 95), 3 * 3 + 2);
  EXPECT_EQ(pow2_exponent_for(448.f), 0);
  EXPECT_EQ(pow2_exponent_for(448.01f), 1);
  EXPECT_EQ(pow2_exponent_for(1.0f), -8);
  EXPECT_EQ(pow2_exponent_for(0.f), 0);
}

// MX weights: per 32-group scale exponent chosen by `exp_of(n, group)`, codes random.
struct Mx {
  int64_t N, K;
  std::vector<uint8_t> q, s;
};
template <typename F>
Mx make_mx(int64_t N, int64_t K, uint64_t seed, F exp_of) {
  Mx m{N, K, std::vector<uint8_t>(size_t(N * K)), std::vector<uint8_t>(size_t(N * K / 32))};
  std::mt19937_64 g(seed);
  for (auto& c : m.q) {
    c = uint8_t(g());
    if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K / 32; ++j) m.s[size_t(n * (K / 32) + j)] = uint8_t(127 + exp_of(n, j));
  return m;
}

std::vector<float> dequant(const uint8_t* q, const void* s, Fp8Scale f, int64_t N, int64_t K) {
  std::vector<float> out(size_t(N * K));
  fp8_dequant(q, s, f, N, K, out.data());
  return out;
}

TEST(Fp8, RequantisationIsLosslessWhenABlockSharesOneScale) {
  for (Fp8Scale f : {Fp8Scale::Row128, Fp8Scale::Blk128}) {
    // one exponent per (row block, 128 columns) for Blk128; per (row, 128 columns) for Row128
    const Mx m = make_mx(260, 384, 3, [&](int64_t n, int64_t j) {
      return -9 + int((f == Fp8Scale::Blk128 ? n / 128 : n) * 3 + j / 4) % 7;
    });
    std::vector<uint8_t> q2(m.q.size());
    std::vector<float> s2(size_t(fp8_scale_count(f, m.N, m.K)));
    fp8_requant_from_mx(m.q.data(), m.s.data(), m.N, m.K, f, q2.data(), s2.data());
    EXPECT_EQ(dequant(q2.data(), s2.data(), f, m.N, m.K), dequant(m.q.data(), m.s.data(), Fp8Scale::G32, m.N, m.K))
        << fp8_scale_name(f);
    for (float v : s2) EXPECT_EQ(v, std::exp2(std::round(std::log2(v))));  // powers of two (padding 1.0)
  }
}

TEST(Fp8, RequantisationLosesTheLowBitsOfAGroupBelowTheBlockMaximum) {
  // Row 0: group 0 at scale 2^0 holding 448, group 1 at scale 2^-10 holding the smallest normal code 2^-6·2^-10
  // and 1.125·2^-10: after requantisation to the block scale 2^0 the first underflows to 0, the second becomes the
  // subnormal 2^-9 (only 2^-9 resolution is left).
  Mx m = make_mx(1, 128, 5, [](int64_t, int64_t j) { return j == 0 ? 0 : -10; });
  std::fill(m.q.begin(), m.q.end(), uint8_t(0));
  m.q[0] = 0x7e;         // 448
  m.q[32] = 0x08;        // 2^-6
  m.q[33] = 0x39;        // 1.125
  m.q[34] = 0x79;        // 288 → 288·2^-10 = 0.28125 → representable after rescaling
  std::vector<uint8_t> q2(128);
  std::vector<float> s2(size_t(fp8_scale_count(Fp8Scale::Row128, 1, 128)));
  fp8_requant_from_mx(m.q.data(), m.s.data(), 1, 128, Fp8Scale::Row128, q2.data(), s2.data());
  const auto got = dequant(q2.data(), s2.data(), Fp8Scale::Row128, 1, 128);
  EXPECT_EQ(s2[0], 1.0f);
  EXPECT_EQ(got[0], 448.f);
  EXPECT_EQ(got[32], 0.f);
  EXPECT_EQ(got[33], 0x1p-9f);                     // 1.125·2^-10 rounds to 2^-9·1 (nearest multiple of 2^-9)
  EXPECT_EQ(got[34], 0.28125f);                    // 1.125·2^-2 is exact in e4m3
}

TEST(Fp8, ActivationQuantisationHitsFullScaleAndStaysWithinHalfAnUlp) {
  std::mt19937_64 g(11);
  std::normal_distribution<float> d(0.f, 3.f);
  const int64_t T = 5, K = 256, ld = 8;
  std::vector<float> x(size_t(T * K));
  for (auto& v : x) v = round_to_bf16(d(g));
  x[3] = 0.f;
  for (int64_t k = 128; k < 256; ++k) x[size_t(2 * K + k)] = 0.f;  // an all-zero block gets scale 1
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(size_t(2 * ld), -1.f);
  fp8_quantize_act_1x128(x.data(), T, K, q.data(), s.data(), ld);
  EXPECT_EQ(s[1 * ld + 2], 1.0f);
  EXPECT_EQ(s[0 * ld + 5], -1.f);  // padding columns untouched
  for (int64_t t = 0; t < T; ++t)
    for (int64_t kb = 0; kb < 2; ++kb) {
      float amax = 0.f;
      bool full = false;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[size_t(t * K + kb * 128 + i)]));
      for (int i = 0; i < 128; ++i) {
        const size_t j = size_t(t * K + kb * 128 + i);
        const float back = e4m3_to_f32(q[j]) * s[size_t(kb * ld + t)];
        EXPECT_LE(std::fabs(back - x[j]), std::max(std::fabs(x[j]) * 0x1p-4f, amax * 0x1p-10f) * 1.0001f);
        full |= (q[j] & 0x7f) == 0x7e;
      }
      EXPECT_TRUE(full || amax == 0.f);
    }
}

TEST(Fp8, GemmTwinsAreDequantiseThenFp32Gemm) {
  const Mx m = make_mx(24, 256, 9, [](int64_t n, int64_t j) { return -8 - int((n + j) % 5); });
  std::mt19937_64 g(1);
  std::normal_distribution<float> d;
  std::vector<float> x(3 * 256);
  for (auto& v : x) v = round_to_bf16(d(g));
  std::vector<float> y(3 * 24), ref(3 * 24);
  matmul_fp8_w8a16(x.data(), 3, 256, m.q.data(), m.s.data(), Fp8Scale::G32, 24, y.data());
  const auto W = dequant(m.q.data(), m.s.data(), Fp8Scale::G32, 24, 256);
  matmul_nt(x.data(), 3, 256, W.data(), 24, ref.data());
  EXPECT_EQ(y, ref);
  // blockscaled: x quantised, then both dequantised
  std::vector<uint8_t> xq(x.size()), q2(m.q.size());
  std::vector<float> xs(2 * 4), s2(size_t(fp8_scale_count(Fp8Scale::Blk128, 24, 256)));
  fp8_quantize_act_1x128(x.data(), 3, 256, xq.data(), xs.data(), 4);
  fp8_requant_from_mx(m.q.data(), m.s.data(), 24, 256, Fp8Scale::Blk128, q2.data(), s2.data());
  matmul_fp8_blockscaled(xq.data(), xs.data(), 4, 3, 256, q2.data(), s2.data(), Fp8Scale::Blk128, 24, y.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) num = std::max(num, double(std::fabs(y[i] - ref[i]))), den = std::max(den, double(std::fabs(ref[i])));
  EXPECT_LT(num / den, 0.1);  // e4m3 activations and requantised weights: a few percent at most
  EXPECT_GT(num, 0.0);
}

// FP8 K/V / index-K caches (issue 15 item 4): every finite code survives dequantise → quantise at a per-tensor
// scale that is not a power of two (the rounding error of x / s is far below half an e4m3 step), values beyond
// 448·s saturate, and the error of a quantised value is at most half a step: 2^−4 relative for normals.
TEST(Fp8, KvCacheQuantisationRoundTripsEveryCodeAndSaturates) {
  const float s = 0.0123f;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes
    const uint8_t q = uint8_t(c);
    float x;
    kv_dequantize_e4m3(&q, 1, s, &x);
    EXPECT_EQ(x, e4m3_to_f32(q) * s);
    uint8_t back;
    kv_quantize_e4m3(&x, 1, s, &back);
    EXPECT_EQ(back, q) << "code " << c;
  }
  const float big[2] = {1000.f * s, -449.f * s};
  uint8_t q[2];
  kv_quantize_e4m3(big, 2, s, q);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0xfe);
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (int i = 0; i < 1000; ++i) {
    const float x = u(g);
    uint8_t c;
    float y;
    kv_quantize_e4m3(&x, 1, s, &c);
    kv_dequantize_e4m3(&c, 1, s, &y);
    EXPECT_LE(std::fabs(y - x), std::max(std::fabs(x) * 0.0625f, 0x1p-10f * s)) << x;
  }
}

// The executor's `--dtype fp8` policy (base/fp8_format.h): W8A16 whole lines up to 8 rows, the 64-wide chunk kernel
// up to the cuBLASLt threshold and whenever K or N is not a multiple of 128, cuBLASLt FP8 from the threshold on (never
// when it is ≤ 0).
TEST(Fp8, ProjectionPathByRowsAndK) {
  EXPECT_EQ(fp8_pick_path(1, 9216, 6144, 16), Fp8Path::W8Lines);
  EXPECT_EQ(fp8_pick_path(8, 9216, 6144, 16), Fp8Path::W8Lines);
  EXPECT_EQ(fp8_pick_path(9, 9216, 6144, 16), Fp8Path::W8Chunk);
  EXPECT_EQ(fp8_pick_path(15, 9216, 6144, 16), Fp8Path::W8Chunk);
  EXPECT_EQ(fp8_pick_path(16, 9216, 6144, 16), Fp8Path::Lt);
  EXPECT_EQ(fp8_pick_path(16384, 9216, 6144, 16), Fp8Path::Lt);
  EXPECT_EQ(fp8_pick_path(16384, 9216, 6144, 0), Fp8Path::W8Chunk);  // accuracy mode: W8A16 only
  EXPECT_EQ(fp8_pick_path(4, 9216, 6144, 0), Fp8Path::W8Lines);
  EXPECT_EQ(fp8_pick_path(1, 9216, 192, 16), Fp8Path::W8Chunk);  // K % 128 ≠ 0: neither lines nor cuBLASLt
  EXPECT_EQ(fp8_pick_path(4096, 9216, 192, 16), Fp8Path::W8Chunk);
  EXPECT_EQ(fp8_pick_path(4096, 96, 128, 16), Fp8Path::W8Chunk);  // N % 128 ≠ 0: W8A16
  EXPECT_EQ(fp8_pick_path(4, 96, 128, 16), Fp8Path::W8Lines);
  EXPECT_STREQ(fp8_path_name(Fp8Path::Lt), "cublaslt-fp8");
  EXPECT_TRUE(fp8_matrix_supported(384, 128));
  EXPECT_TRUE(fp8_matrix_supported(128, 192));
  EXPECT_FALSE(fp8_matrix_supported(128, 96));
  EXPECT_FALSE(fp8_matrix_supported(0, 128));
  // Values + fp32 128×128 scales ([ceil(N/128)][round_up(ceil(K/128), 4)]): M3's qkv 9216×6144 = 56.6 MB + 6.9 KB.
  EXPECT_EQ(fp8_matrix_bytes(Fp8Scale::Blk128, 9216, 6144), int64_t(9216) * 6144 + 72 * 48 * 4);
  EXPECT_EQ(fp8_matrix_bytes(Fp8Scale::G32, 128, 192), 128 * 192 + 128 * 6);
}

// Dummy FP8 weights: one power-of-two scale per tensor, the smallest that keeps the dummy range within ±448·2^S.
TEST(Fp8, DummyExponentIsTheSmallestThatFitsTheRange) {
  for (float scale : {0.02f, 0.05f, 1.0f, 448.0f, 449.0f, 3e-5f}) {
    const int S = fp8_dummy_exponent(scale);
    EXPECT_LE(scale, 448.0f * std::ldexp(1.0f, S)) << scale;
    EXPECT_GT(scale, 448.0f * std::ldexp(1.0f, S - 1)) << scale;
  }
  EXPECT_EQ(fp8_dummy_exponent(448.0f), 0);
  EXPECT_EQ(fp8_dummy_exponent(0.f), 0);
}

}  // namespace
}  // namespace m3::cpu
