#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
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

}  // namespace
}  // namespace m3
