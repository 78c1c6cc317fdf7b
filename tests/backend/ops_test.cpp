// Each CPU op against straightforward reference code or a worked example from docs/M3_MODEL.md / docs/MSA_CONTRACT.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/msa_route.h"

namespace m3::cpu {
namespace {

std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(Gemm, MatchesDoublePrecisionReferenceAtOddShapes) {
  for (auto [T, K, N] : {std::tuple{1, 7, 3}, {5, 64, 9}, {13, 100, 37}, {4, 8, 4}}) {
    auto x = randn(size_t(T * K), 1), W = randn(size_t(N * K), 2);
    std::vector<float> y(size_t(T * N), std::nanf(""));
    matmul_nt(x.data(), T, K, W.data(), N, y.data());
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n) {
        double ref = 0;
        for (int k = 0; k < K; ++k) ref += double(x[t * K + k]) * W[n * K + k];
        ASSERT_NEAR(y[t * N + n], ref, 1e-4 * (1 + std::fabs(ref))) << T << "x" << K << "x" << N;
      }
  }
}

TEST(Gemm, RowResultDoesNotDependOnBatchSize) {
  const int K = 67, N = 11;
  auto x = randn(size_t(9 * K), 3), W = randn(size_t(N * K), 4);
  std::vector<float> all(9 * N), one(N);
  matmul_nt(x.data(), 9, K, W.data(), N, all.data());
  for (int t = 0; t < 9; ++t) {
    matmul_nt(x.data() + t * K, 1, K, W.data(), N, one.data());
    for (int n = 0; n < N; ++n) ASSERT_EQ(one[n], all[t * N + n]);
  }
}

TEST(RmsNorm, GemmaStyleMultipliesByOnePlusWeight) {
  std::vector<float> x = {1.f, -2.f, 3.f, 4.f}, w = {0.f, 0.5f, -1.f, 1.f}, y(4);
  rms_norm_gemma(x.data(), 1, 4, w.data(), 1e-6f, y.data());
  const float inv = 1.f / std::sqrt((1 + 4 + 9 + 16) / 4.f + 1e-6f);
  EXPECT_NEAR(y[0], 1 * inv * 1.0f, 1e-6);
  EXPECT_NEAR(y[1], -2 * inv * 1.5f, 1e-6);
  EXPECT_NEAR(y[2], 0.f, 1e-6);  // (1 + w) = 0: a plain x·w norm would give -3·inv here
  EXPECT_NEAR(y[3], 4 * inv * 2.0f, 1e-6);
}

TEST(RmsNorm, EpsIsAddedToTheMeanSquareInsideTheRoot) {
  // Tiny activations make eps matter: mean square 1e-6 + eps 1e-6 → 1 / sqrt(2e-6); eps added after the root
  // would give 1 / (1e-3 + 1e-6), 41 % larger.
  std::vector<float> x(8, 1e-3f), w(8, 0.f), y(8);
  rms_norm_gemma(x.data(), 1, 8, w.data(), 1e-6f, y.data());
  for (float v : y) EXPECT_NEAR(v, 1e-3 / std::sqrt(2e-6), 1e-5);
}

TEST(Rope, PartialNeoxPairsChannelIWithIPlusHalfOfRotarySlice) {
  // head_dim 128, rotary 64: channel 5 pairs with 37, channel 70 is never rotated.
  const int D = 128, R = 64;
  auto x = randn(D, 5);
  auto y = x;
  int32_t pos = 1000;
  rope_neox_partial(y.data(), 1, 1, D, R, &pos, 5e6);
  const float a = float(pos) * float(1.0 / std::pow(5e6, 2.0 * 5 / 64));
  EXPECT_NEAR(y[5], x[5] * std::cos(a) - x[37] * std::sin(a), 1e-5);
  EXPECT_NEAR(y[37], x[37] * std::cos(a) + x[5] * std::sin(a), 1e-5);
  for (int i = R; i < D; ++i) EXPECT_EQ(y[i], x[i]) << i;
  int32_t zero = 0;
  auto z = x;
  rope_neox_partial(z.data(), 1, 1, D, R, &zero, 5e6);
  EXPECT_EQ(z, x);  // position 0 is the identity
}

TEST(SwigluOai, ClampsGateAboveOnlyAndUpBothWaysPlusOne) {
  // docs/M3_MODEL.md §3.5: g = 9, u = −8 → 7·σ(11.914)·(−6) ≈ −42.0
  std::vector<float> gu = {9.f, -3.f, -8.f, 0.5f}, a(2);
  swiglu_oai(gu.data(), 1, 2, 1.702f, 7.f, a.data());
  EXPECT_NEAR(a[0], 7.f / (1 + std::exp(-1.702f * 7.f)) * -6.f, 1e-5);
  EXPECT_NEAR(a[0], -42.0f, 0.01f);
  // g = −3 is not clamped from below.
  EXPECT_NEAR(a[1], -3.f / (1 + std::exp(1.702f * 3.f)) * 1.5f, 1e-6);
  // Both inputs above +7: g = 8 → 7 and u = 12 → 7, so 7·σ(11.914)·8 ≈ 56.0 (unclamped u would give 104).
  std::vector<float> hi = {8.f, 1.f, 12.f, 7.5f}, b(2);
  swiglu_oai(hi.data(), 1, 2, 1.702f, 7.f, b.data());
  EXPECT_NEAR(b[0], 7.f / (1 + std::exp(-1.702f * 7.f)) * 8.f, 1e-4);
  EXPECT_NEAR(b[1], 1.f / (1 + std::exp(-1.702f)) * 8.f, 1e-5);
}

TEST(MoeRoute, WeightsAreUnbiasedSigmoidRenormalisedAndScaled) {
  // Sigmoids (0.9, 0.8, 0.6, 0.5) chosen → 2·s/2.8 (docs/M3_MODEL.md §3.6).
  auto logit = [](float s) { return std::log(s / (1 - s)); };
  std::vector<float> lg = {logit(0.5f), logit(0.9f), logit(0.1f), logit(0.8f), logit(0.6f), logit(0.2f)};
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  moe_route(lg.data(), 1, 6, nullptr, 4, 2.0f, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 0}));
  EXPECT_NEAR(w[0], 0.643f, 1e-3);
  EXPECT_NEAR(w[1], 0.571f, 1e-3);
  EXPECT_NEAR(w[2], 0.429f, 1e-3);
  EXPECT_NEAR(w[3], 0.357f, 1e-3);
  // A bias lets expert 2 (s = 0.1) win a slot, but its weight still uses its own s.
  std::vector<float> bias = {0, 0, 1.0f, 0, 0, 0};
  moe_route(lg.data(), 1, 6, bias.data(), 2, 2.0f, ids.data(), w.data());
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 1);
  EXPECT_NEAR(w[0], 2 * 0.1f / (0.1f + 0.9f), 1e-5);
}

// Selection worked examples from docs/M3_MODEL.md §3.4 (B = 128, K = 16).
TEST(MsaTopk, WorkedExamplesFollowTheContract) {
  const int B = 128, K = 16;
  std::vector<int32_t> pos = {1000, 2047, 2048, 5000};
  const int64_t max_blocks = 40;
  std::vector<float> scores(pos.size() * max_blocks, -std::numeric_limits<float>::infinity());
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t i = 0; i < pos.size(); ++i)
    for (int b = 0; b < pos[i] / B; ++b) scores[i * max_blocks + b] = u(g);
  std::vector<int32_t> sel(pos.size() * K);
  msa_topk(scores.data(), int64_t(pos.size()), 1, pos.data(), B, max_blocks, K, sel.data());
  auto row = [&](int i) { return std::vector<int32_t>(sel.begin() + i * K, sel.begin() + (i + 1) * K); };
  EXPECT_EQ(row(0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1, -1, -1, -1, -1}));
  std::vector<int32_t> all16(16);
  for (int i = 0; i < 16; ++i) all16[i] = i;
  EXPECT_EQ(row(1), all16);
  for (int i : {2, 3}) {
    auto r = row(i);
    const int local = pos[i] / B;
    EXPECT_EQ(r[15], local);
    // The 15 history entries are the 15 best-scoring blocks among 0..local-1.
    std::vector<int> order(local);
    for (int b = 0; b < local; ++b) order[b] = b;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return scores[i * max_blocks + a] > scores[i * max_blocks + b]; });
    std::set<int> want(order.begin(), order.begin() + 15), got(r.begin(), r.begin() + 15);
    EXPECT_EQ(got, want) << "position " << pos[i];
  }
}

TEST(MsaTopk, NanScoresRankLastInsteadOfCorruptingTheSort) {
  const int B = 4, K = 3;
  int32_t pos = 20;  // local 5, history 0..4
  std::vector<float> s = {std::nanf(""), 1.f, std::nanf(""), 3.f, 2.f, 0.f};
  std::vector<int32_t> sel(K);
  msa_topk(s.data(), 1, 1, &pos, B, 6, K, sel.data());
  EXPECT_EQ(sel, (std::vector<int32_t>{3, 4, 5}));
}

// Builds a paged cache of one layer with a shuffled page table, returns its views.
struct TinyCache {
  int Hkv, B, D, Di, npages;
  std::vector<float> data;  // per page: K [Hkv,B,D], V [Hkv,B,D], IK [B,Di]
  std::vector<int32_t> table;
  int64_t stride() const { return int64_t(2 * Hkv * B * D + B * Di); }
  TinyCache(int hkv, int b, int d, int di, int np, uint64_t seed) : Hkv(hkv), B(b), D(d), Di(di), npages(np) {
    data = randn(size_t(np * stride()), seed);
    for (int i = 0; i < np; ++i) table.push_back((i * 7 + 3) % np);  // non-contiguous pages (np coprime to 7)
  }
  PagedKV kv() const { return {data.data(), data.data() + Hkv * B * D, stride(), Hkv, B, D}; }
  PagedIndexK ik() const { return {data.data() + 2 * Hkv * B * D, stride(), B, Di}; }
  const float* key(int h, int j) const { return &data[table[j / B] * stride() + (h * B + j % B) * D]; }
  const float* val(int h, int j) const { return &data[table[j / B] * stride() + Hkv * B * D + (h * B + j % B) * D]; }
  const float* ikey(int j) const { return &data[table[j / B] * stride() + 2 * Hkv * B * D + (j % B) * Di]; }
};

TEST(MsaBlockScores, MaxOverHistoryBlocksMatchesNaiveLoop) {
  TinyCache c(2, 8, 16, 16, 9, 11);
  const int H = 2;
  std::vector<int32_t> pos = {3, 8, 31, 70};
  auto iq = randn(pos.size() * H * 16, 12);
  const int64_t MB = 9;
  std::vector<float> s(H * pos.size() * MB, 123.f);
  msa_block_scores(iq.data(), int64_t(pos.size()), H, pos.data(), c.ik(), c.table.data(), MB, s.data());
  for (int h = 0; h < H; ++h)
    for (size_t i = 0; i < pos.size(); ++i)
      for (int b = 0; b < MB; ++b) {
        float got = s[(h * pos.size() + i) * MB + b];
        if (b >= pos[i] / 8) {
          EXPECT_TRUE(std::isinf(got) && got < 0);
          continue;
        }
        float best = -1e30f;
        for (int j = b * 8; j < b * 8 + 8; ++j) {
          float d = 0;
          for (int k = 0; k < 16; ++k) d += iq[(i * H + h) * 16 + k] * c.ikey(j)[k];
          best = std::max(best, d);
        }
        EXPECT_NEAR(got, best, 1e-5);
      }
}

// Attention over a selection equals a naive softmax over exactly the selected, causal keys.
TEST(AttentionSparse, MatchesNaiveSoftmaxOverSelectedCausalKeys) {
  TinyCache c(2, 8, 16, 16, 9, 21);
  const int Hq = 4, K = 3;  // G = 2
  std::vector<int32_t> pos = {5, 40, 70};
  auto q = randn(pos.size() * Hq * 16, 22);
  // selection [Hkv, Tq, K]: valid prefix, local last, -1 padding; history unordered on purpose
  std::vector<int32_t> sel = {0, -1, -1, 3, 1, 5, 2, 6, 8,  /* head 0 */
                              0, -1, -1, 0, 4, 5, 7, 1, 8}; /* head 1 */
  std::vector<float> out(pos.size() * Hq * 16, std::nanf(""));
  const float scale = 0.25f;
  attention_sparse(q.data(), int64_t(pos.size()), Hq, pos.data(), c.kv(), c.table.data(), sel.data(), K, scale,
                   out.data());
  for (size_t i = 0; i < pos.size(); ++i)
    for (int m = 0; m < Hq; ++m) {
      const int h = m / 2;
      std::vector<int> keys;
      for (int s = 0; s < K; ++s) {
        int b = sel[(h * pos.size() + i) * K + s];
        if (b < 0) continue;
        for (int j = b * 8; j < b * 8 + 8 && j <= pos[i]; ++j) keys.push_back(j);
      }
      std::vector<double> w;
      double mx = -1e300;
      for (int j : keys) {
        double d = 0;
        for (int k = 0; k < 16; ++k) d += double(q[(i * Hq + m) * 16 + k]) * c.key(h, j)[k];
        w.push_back(d * scale);
        mx = std::max(mx, w.back());
      }
      double den = 0;
      for (auto& x : w) den += (x = std::exp(x - mx));
      for (int k = 0; k < 16; ++k) {
        double ref = 0;
        for (size_t t = 0; t < keys.size(); ++t) ref += w[t] / den * c.val(h, keys[t])[k];
        ASSERT_NEAR(out[(i * Hq + m) * 16 + k], ref, 1e-5) << "query " << i << " head " << m;
      }
    }
}

TEST(AttentionDense, EqualsSparseWithEveryVisibleBlockSelected) {
  TinyCache c(2, 8, 16, 16, 9, 31);
  const int Hq = 4;
  std::vector<int32_t> pos = {0, 9, 33};
  auto q = randn(pos.size() * Hq * 16, 32);
  const int K = 5;
  std::vector<int32_t> sel(2 * pos.size() * K, -1);
  for (int h = 0; h < 2; ++h)
    for (size_t i = 0; i < pos.size(); ++i)
      for (int b = 0; b <= pos[i] / 8; ++b) sel[(h * pos.size() + i) * K + b] = b;
  std::vector<float> a(pos.size() * Hq * 16), b(a.size());
  attention_dense_causal(q.data(), int64_t(pos.size()), Hq, pos.data(), c.kv(), c.table.data(), 0.3f, a.data());
  attention_sparse(q.data(), int64_t(pos.size()), Hq, pos.data(), c.kv(), c.table.data(), sel.data(), K, 0.3f,
                   b.data());
  EXPECT_EQ(a, b);
}


// The sparse prefill route (twin of the CUDA route kernel): a tile of 8 rows whose selections share their pages goes
// to the union-tile kernel, one whose rows picked disjoint pages to the KV-block-major kernel; padding and blocks past
// a row's local block do not count.
TEST(MsaPrefillRoute, NarrowUnionsGoToTheUnionTileKernelAndWideOnesToKvBlockMajor) {
  const int B = 128, K = 4, T = 16;
  std::vector<int32_t> pos(T), seq(T, 0), pti = {0, 64}, pages(64);
  for (int t = 0; t < T; ++t) pos[t] = 40 * B + t;  // local block 40
  for (int b = 0; b < 64; ++b) pages[size_t(b)] = 1000 + b;
  std::vector<int32_t> sel(size_t(T * K));
  for (int t = 0; t < T; ++t) {
    int32_t* r = &sel[size_t(t * K)];
    if (t < 8) {  // tile 0: every row picks blocks 1, 2, 3 + its local 40 → 4 pages for 32 entries
      r[0] = 1, r[1] = 2, r[2] = 3, r[3] = 40;
    } else {  // tile 1: disjoint history blocks per row, one −1 and one block past local (not counted)
      r[0] = 3 * (t - 8), r[1] = 3 * (t - 8) + 1, r[2] = t == 9 ? -1 : 3 * (t - 8) + 2, r[3] = t == 10 ? 41 : 40;
    }
  }
  const auto route = msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages.data(), T, 1, K, B, 26);
  ASSERT_EQ(route.size(), 2u);
  EXPECT_EQ(route[0], 0);  // 4 · 100 ≤ 32 · 26
  EXPECT_EQ(route[1], 1);  // ≈ 23 distinct pages for 30 entries
  // Threshold 0 sends every tile whose union exceeds top_k to KV-block-major (tile 0's 4 pages = top_k stay), a
  // huge one none.
  const auto all = msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages.data(), T, 1, K, B, 0);
  EXPECT_EQ(all, (std::vector<uint8_t>{0, 1}));
  const auto none = msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages.data(), T, 1, K, B, 1 << 20);
  EXPECT_EQ(none, (std::vector<uint8_t>{0, 0}));
}

// A tile whose union is at most top_k pages goes to the union-tile kernel whatever the ratio: one row at position 0
// (|U| = E = 1), one row with a full selection (|U| = E = top_k); two rows with disjoint selections (|U| = E = 2 ·
// top_k) go to KV-block-major.
TEST(MsaPrefillRoute, UnionsOfAtMostTopKPagesStayUnionTiles) {
  const int B = 128, K = 4;
  std::vector<int32_t> pages(16);
  for (int b = 0; b < 16; ++b) pages[size_t(b)] = 500 + b;
  const std::vector<int32_t> pti = {0, 16, 32};
  {
    const std::vector<int32_t> pos = {0}, seq = {0}, sel = {0, -1, -1, -1};
    EXPECT_EQ(msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages.data(), 1, 1, K, B, 26),
              std::vector<uint8_t>{0});
    EXPECT_TRUE(msa_prefill_union_only(pos.data(), seq.data(), 1, B, K, 0));
  }
  {
    const std::vector<int32_t> pos = {10 * B}, seq = {0}, sel = {2, 5, 7, 10};
    EXPECT_EQ(msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages.data(), 1, 1, K, B, 0),
              std::vector<uint8_t>{0});
  }
  {
    std::vector<int32_t> pages2(32);
    for (int b = 0; b < 32; ++b) pages2[size_t(b)] = 900 + b;
    const std::vector<int32_t> pos = {10 * B, 10 * B}, seq = {0, 1}, sel = {2, 5, 7, 10, 1, 3, 4, 10};
    EXPECT_EQ(msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages2.data(), 2, 1, K, B, 26),
              std::vector<uint8_t>{1});
  }
}

// The host's shortcut agrees with the route twin: on random steps of short sequences (fixed selections: every block of
// each row, −1 padding) union_only() true means every tile routes to the union kernel; and it says true often enough
// to matter and false on the steps it must (a row past top_k blocks).
TEST(MsaPrefillRoute, UnionOnlyStepsRouteEveryTileToTheUnionKernel) {
  std::mt19937 g(5);
  const int B = 128, K = 16, Hkv = 2;
  int said_true = 0, said_false = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int nseq = 1 + int(g() % 4);
    std::vector<int32_t> pos, seq, pti = {0}, pages;
    const bool long_row = trial % 7 == 0;  // one row with 17 blocks: only the device knows its selection
    for (int s = 0; s < nseq; ++s) {
      const int len = 1 + int(g() % 40), start = int(g() % (K * B - len));
      const int npages = (start + len - 1) / B + 1 + (long_row ? 2 : 0);
      for (int b = 0; b < npages; ++b) pages.push_back(int32_t(pages.size()) * 7 + 3);
      pti.push_back(int32_t(pages.size()));
      for (int i = 0; i < len; ++i) pos.push_back(start + i), seq.push_back(s);
    }
    if (long_row) pos.back() = K * B + 5;
    const int64_t T = int64_t(pos.size());
    std::vector<int32_t> sel(size_t(Hkv * T * K), -1);
    for (int h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int b = 0; b <= std::min(pos[size_t(t)] / B, K - 1); ++b) sel[size_t((h * T + t) * K + b)] = b;
    const bool only = msa_prefill_union_only(pos.data(), seq.data(), T, B, K, 26);
    if (long_row) {
      EXPECT_FALSE(only) << "trial " << trial;
    }
    const auto route = msa_prefill_route(sel.data(), pos.data(), seq.data(), pti.data(), pages.data(), T, Hkv, K, B, 26);
    if (only) {
      ++said_true;
      for (size_t i = 0; i < route.size(); ++i) EXPECT_EQ(route[i], 0) << "trial " << trial << " tile " << i;
    } else {
      ++said_false;
    }
  }
  EXPECT_GT(said_true, 50);
  EXPECT_GT(said_false, 40);
}

}  // namespace
}  // namespace m3::cpu
