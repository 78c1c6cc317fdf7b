#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <span>

#include "base/error.h"
#include "base/rng.h"
#include "engine/sampler.h"

namespace m3 {
namespace {

std::vector<float> logits() { return {0.1f, 2.0f, 1.9f, -1.0f, 0.5f, 1.95f}; }

TEST(Sampler, GreedyPicksTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(logits()), 1);
}

TEST(Sampler, GreedyTiesGoToTheLowerId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{3.0f, 3.0f}), 0);
}

TEST(Sampler, SameSeedGivesTheSameTokens) {
  SamplingParams p;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(a.sample(logits()), b.sample(logits()));
  Sampler c(p, /*choice_index=*/1);
  Sampler d(p, 0);
  int differ = 0;
  for (int i = 0; i < 50; ++i) differ += c.sample(logits()) != d.sample(logits());
  EXPECT_GT(differ, 0) << "choices of one request must draw independent streams";
}

TEST(Sampler, DifferentSeedsDrawDifferentTokens) {
  SamplingParams p;
  p.seed = 42;
  Sampler a(p);
  p.seed = 43;
  Sampler b(p);
  int differ = 0;
  for (int i = 0; i < 50; ++i) differ += a.sample(logits()) != b.sample(logits());
  EXPECT_GT(differ, 0) << "the seed must select the random stream";
}

TEST(Sampler, TopKOnlyEverReturnsTheKBest) {
  SamplingParams p;
  p.top_k = 2;
  p.seed = 1;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    int t = s.sample(logits());
    ASSERT_TRUE(t == 1 || t == 5) << t;
  }
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingTheMass) {
  SamplingParams p;
  p.top_p = 0.01f;  // only the top token survives
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(s.sample(logits()), 1);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.min_p = 0.5f;  // keeps tokens with prob ≥ half of the best: ids 1, 5, 2
  p.seed = 4;
  Sampler s(p);
  std::map<int, int> seen;
  for (int i = 0; i < 300; ++i) seen[s.sample(logits())]++;
  for (auto [t, n] : seen) EXPECT_TRUE(t == 1 || t == 2 || t == 5) << t;
  EXPECT_EQ(seen.size(), 3u);
}

TEST(Sampler, OutOfRangeValuesAreRejectedWithTheFieldName) {
  auto bad = [](auto mutate, const char* field) {
    SamplingParams p;
    mutate(p);
    try {
      p.validate();
      FAIL() << field << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  bad([](SamplingParams& p) { p.temperature = -1; }, "temperature");
  bad([](SamplingParams& p) { p.temperature = NAN; }, "temperature");
  bad([](SamplingParams& p) { p.top_p = 0; }, "top_p");
  bad([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p");
  bad([](SamplingParams& p) { p.top_k = -5; }, "top_k");
  bad([](SamplingParams& p) { p.min_p = 2; }, "min_p");
}

// Draw frequencies of a seeded sampler against the distribution it must draw from: softmax(l / T) over the kept
// candidates, renormalised. Pearson's chi-square with a fixed seed (deterministic, so never flaky); the bound is
// the 0.1 % critical value, far below what a wrong temperature or a wrong cut produces.
double chi_square(Sampler& s, std::span<const float> lg, const std::vector<double>& expect, int draws) {
  std::vector<int> n(lg.size());
  for (int i = 0; i < draws; ++i) n[size_t(s.sample(lg))]++;
  double chi = 0;
  for (size_t t = 0; t < lg.size(); ++t) {
    if (expect[t] == 0) {
      EXPECT_EQ(n[t], 0) << "token " << t << " is outside the kept set";
      continue;
    }
    const double e = expect[t] * draws;
    chi += (n[t] - e) * (n[t] - e) / e;
  }
  return chi;
}

// softmax(l / T) restricted to `keep` (all when empty).
std::vector<double> softmax_over(std::span<const float> lg, float T, std::vector<int> keep = {}) {
  if (keep.empty())
    for (size_t t = 0; t < lg.size(); ++t) keep.push_back(int(t));
  std::vector<double> p(lg.size(), 0.0);
  double z = 0;
  for (int t : keep) z += p[size_t(t)] = std::exp(double(lg[size_t(t)]) / T);
  for (auto& x : p) x /= z;
  return p;
}

// Critical chi-square values at p = 0.001 by degrees of freedom.
constexpr double kChi999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};

TEST(SamplerDistribution, DrawsFollowSoftmaxOfLogitsOverTemperature) {
  const std::vector<float> lg = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.5f};
  for (float T : {0.6f, 1.7f}) {
    SamplingParams p;
    p.temperature = T;
    p.seed = 11;
    Sampler s(p);
    EXPECT_LT(chi_square(s, lg, softmax_over(lg, T), 20000), kChi999[5]) << "T = " << T;
  }
}

TEST(SamplerDistribution, TopPKeepsTheSmallestPrefixReachingTheMassAndRenormalises) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (T = 1). top_p 0.75 keeps {0, 1} (0.5 < 0.75 ≤ 0.8); 0.85 keeps {0, 1, 2};
  // 0.45 keeps {0}.
  const std::vector<float> lg = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  struct Case {
    float top_p;
    std::vector<int> keep;
  };
  for (const Case& c : {Case{0.75f, {1, 3}}, Case{0.85f, {1, 3, 0}}, Case{0.45f, {1}}, Case{1.0f, {}}}) {
    SamplingParams p;
    p.top_p = c.top_p;
    p.seed = 12;
    Sampler s(p);
    const double chi = chi_square(s, lg, softmax_over(lg, 1.f, c.keep), 20000);
    const size_t df = c.keep.empty() ? lg.size() - 1 : c.keep.size() - 1;
    if (df > 0) {
      EXPECT_LT(chi, kChi999[df]) << "top_p = " << c.top_p;
    }
  }
}

TEST(SamplerDistribution, TopPCutUsesTheTemperedDistribution) {
  // At T = 0.5 the probabilities of logits (log 0.5, log 0.3, log 0.2) become ∝ 0.25, 0.09, 0.04 → 0.658, 0.237,
  // 0.105: top_p 0.85 keeps two tokens (at T = 1 it would keep all three).
  const std::vector<float> lg = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_p = 0.85f;
  p.seed = 13;
  Sampler s(p);
  EXPECT_LT(chi_square(s, lg, softmax_over(lg, 0.5f, {0, 1}), 20000), kChi999[1]);
}

// ---- the fixed-point definition shared with the GPU sampler (base/rng.h) -------------------------------------------
TEST(SamplerFixedPoint, TheTopLogitWeighsTwoToTheFortyAndFarTokensWeighNothing) {
  EXPECT_EQ(sample_weight(3.5f, 3.5f, 0.7f), uint64_t(1) << 40);
  EXPECT_EQ(sample_weight(3.5f - 28.5f, 3.5f, 1.f), 0u);
  EXPECT_EQ(sample_weight(-INFINITY, 3.5f, 1.f), 0u);
  EXPECT_NEAR(double(sample_weight(0.f, 1.f, 1.f)) / (std::exp(-1.0) * 1099511627776.0), 1.0, 1e-6);
  for (float x = -27.9f; x < 0.f; x += 0.37f)  // the shared fp32 exp is within 1e-6 of libm's everywhere
    EXPECT_NEAR(double(sample_exp(x)) / std::exp(double(x)), 1.0, 1e-6) << x;
}

TEST(SamplerFixedPoint, TheDrawPicksTheFirstCandidateWhoseRunningMassExceedsIt) {
  // Sorted: id 2 (w = 2^40), then ids 0 and 1 (equal logits: the lower id first).
  const std::vector<float> lg = {0.f, 0.f, 1.f};
  SamplingParams p;
  const uint64_t w2 = uint64_t(1) << 40, w0 = sample_weight(0.f, 1.f, 1.f), total = w2 + 2 * w0;
  EXPECT_EQ(choose_token_bits(lg, p, 0), 2);
  // The smallest draw whose point reaches w2 goes to id 0; the largest one lands on id 1.
  uint64_t bits = uint64_t(((unsigned __int128)w2 << 53) / total);
  while (sample_draw_point(bits, total) < w2) ++bits;
  EXPECT_EQ(choose_token_bits(lg, p, bits - 1), 2);
  EXPECT_EQ(choose_token_bits(lg, p, bits), 0);
  EXPECT_EQ(choose_token_bits(lg, p, (uint64_t(1) << 53) - 1), 1);
}

TEST(SamplerFixedPoint, TopPCutsAtTheFirstPrefixReachingTheMassExactly) {
  const std::vector<float> lg(4, 2.f);  // four equal weights: top_p 0.5 keeps exactly ids 0 and 1
  SamplingParams p;
  p.top_p = 0.5f;
  EXPECT_EQ(choose_token_bits(lg, p, (uint64_t(1) << 53) - 1), 1);
  p.top_p = 0.51f;
  EXPECT_EQ(choose_token_bits(lg, p, (uint64_t(1) << 53) - 1), 2);
}

TEST(SamplerFixedPoint, MinPKeepsWeightsAtLeastTheFloorAndTopKCountsTheWholeRow) {
  std::vector<float> lg = {1.f, 1.f - std::log(4.f), 1.f - std::log(1.5f), -30.f};
  SamplingParams p;
  p.min_p = 0.5f;  // keeps ids 0 and 2 (weights 1 and 2/3), not id 1 (1/4)
  EXPECT_EQ(choose_token_bits(lg, p, (uint64_t(1) << 53) - 1), 2);
  p.min_p = 0.f;
  p.top_k = 2;
  EXPECT_EQ(choose_token_bits(lg, p, (uint64_t(1) << 53) - 1), 2);
  p.top_k = 4;  // id 3 weighs nothing: never drawn even as the last candidate
  EXPECT_EQ(choose_token_bits(lg, p, (uint64_t(1) << 53) - 1), 1);
}

TEST(SamplerFixedPoint, TheDoubleDrawAndTheBitsDrawAgree) {
  const std::vector<float> lg = {0.3f, -1.f, 2.f, 1.1f, 0.f};
  SamplingParams p;
  p.temperature = 0.9f;
  for (uint64_t step = 0; step < 200; ++step) {
    const uint64_t b = uniform_bits_from_seed(77, 0, step);
    EXPECT_EQ(choose_token(lg, p, uniform_from_seed(77, 0, step)), choose_token_bits(lg, p, b));
  }
}

}  // namespace
}  // namespace m3
