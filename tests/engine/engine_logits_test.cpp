// Logit processing on the engine's generation path, checked against hand-computed token sequences: presence /
// frequency penalties (generated tokens only), repetition penalty (prompt + generated), logit_bias, min_tokens, and
// logprobs (log_softmax of the model's raw logits, before any penalty — vLLM's default "raw_logprobs").
//
// The model is a scripted executor whose logits are the same vector at every step, so each expected sequence can be
// worked out by hand from the rules in docs/TESTING.md; the comments show the arithmetic. The tests use only the
// Engine's public request/output API.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>

#include "base/error.h"
#include "engine/engine.h"

namespace m3 {
namespace {

// Returns `logits` for every sequence of every step; owns a page pool like a real executor.
class ConstLogitsExecutor final : public ModelExecutor {
 public:
  ConstLogitsExecutor(std::vector<float> logits, int eos) : logits_(std::move(logits)), pool_(64) {
    cfg_.vocab_size = int(logits_.size());
    cfg_.sparse_block_size = 16;
    cfg_.max_position_embeddings = 1024;
    cfg_.eos_token_id = eos;
  }
  const M3Config& config() const override { return cfg_; }
  PagePool& pool() override { return pool_; }
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace*) override {
    return std::vector<std::vector<float>>(seqs.size(), logits_);
  }
  std::string describe() const override { return "const logits"; }
  int64_t page_bytes() const override { return 1; }  // no cache behind the pages

 private:
  std::vector<float> logits_;
  M3Config cfg_;
  PagePool pool_;
};

struct Result {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::None;
};

// Runs one greedy request to completion on the calling thread.
Result generate(const std::vector<float>& logits, int eos, std::vector<int32_t> prompt, GenerationParams p) {
  ConstLogitsExecutor exec(logits, eos);
  Engine e(exec, EngineConfig{});
  Result r;
  EngineRequest req;
  req.id = "r";
  req.prompt = std::move(prompt);
  req.params = std::move(p);
  e.submit(req, [&](const EngineOutput& o) {
    r.tokens.insert(r.tokens.end(), o.tokens.begin(), o.tokens.end());
    r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    if (o.finish != FinishReason::None) r.finish = o.finish;
  });
  while (e.step()) {
  }
  EXPECT_EQ(e.metrics().pages_used, 0);
  return r;
}

GenerationParams greedy(int max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

const std::vector<float> kLogits = {3.0f, 2.0f, 1.2f, 0.0f, -1.0f};
constexpr int kNoEos = -1;

TEST(EngineLogits, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  // presence 0.5, frequency 0.4: a token generated n times loses 0.5 + 0.4·n. The prompt is all token 0, which must
  // not count (else token 0 would start at 3.0 − 0.5 − 1.6 = 0.9 and lose to token 1).
  //   step 1: 3.0 2.0 1.2        → 0   step 5: 1.3 1.1 1.2 → 0 (0 now 0.9)
  //   step 2: 2.1 2.0 1.2        → 0   step 6: 0.9 1.1 1.2 → 2 (2 now 0.3)
  //   step 3: 1.7 2.0 1.2        → 1   step 7: 0.9 1.1 0.3 → 1 (1 now 0.7)
  //   step 4: 1.7 1.1 1.2        → 0   step 8: 0.9 0.7 0.3 → 0
  GenerationParams p = greedy(8);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.4f;
  Result r = generate(kLogits, kNoEos, {0, 0, 0, 0}, p);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0, 0, 1, 0, 0, 2, 1, 0}));
  EXPECT_EQ(r.finish, FinishReason::Length);
}

TEST(EngineLogits, NegativePenaltiesEncourageRepetition) {
  // presence −0.5, frequency −0.4 on token 1 once it is drawn by a bias: it keeps winning.
  GenerationParams p = greedy(4);
  p.presence_penalty = -0.5f;
  p.frequency_penalty = -0.4f;
  p.logit_bias = {{1, 1.5f}};  // step 1: 3.0 vs 3.5 → 1; then 1 only grows
  EXPECT_EQ(generate(kLogits, kNoEos, {2}, p).tokens, (std::vector<int32_t>{1, 1, 1, 1}));
}

TEST(EngineLogits, RepetitionPenaltyCoversPromptAndGeneratedTokens) {
  // repetition 2: a seen token's positive logit is halved, a negative one doubled. Token 0 is in the prompt.
  //   step 1: 1.0 1.8 0.9 → 1 (prompt token 0 halved)
  //   step 2: 1.0 0.9 0.9 → 0 (generated token 1 halved too); later steps: the same → 0
  GenerationParams p = greedy(5);
  p.repetition_penalty = 2.0f;
  Result r = generate({2.0f, 1.8f, 0.9f, -1.0f, -1.2f, -3.0f}, kNoEos, {0, 3}, p);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 0, 0, 0, 0}));
}

TEST(EngineLogits, RepetitionPenaltyMultipliesNegativeLogits) {
  // repetition 1.5 over all-negative logits: the prompt's token 0 goes −1.0 → −1.5, below token 1 (−1.2); once
  // drawn, token 1 goes to −1.8 and token 0 wins from then on.
  GenerationParams p = greedy(4);
  p.repetition_penalty = 1.5f;
  Result r = generate({-1.0f, -1.2f, -3.0f, -4.0f}, kNoEos, {0}, p);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 0, 0, 0}));
}

TEST(EngineLogits, LogitBiasIsAddedBeforePenaltiesAreCompared) {
  // bias +3.4 on token 3, −100 on token 2 (banned), frequency 1.0:
  //   step 1: 3.0 1.9 ·  3.4 → 3      step 4: 2.0 1.9 · 1.4 → 0
  //   step 2: 3.0 1.9 ·  2.4 → 0      step 5: 1.0 1.9 · 1.4 → 1
  //   step 3: 2.0 1.9 ·  2.4 → 3      step 6: 1.0 0.9 · 1.4 → 3
  GenerationParams p = greedy(6);
  p.frequency_penalty = 1.0f;
  p.logit_bias = {{3, 3.4f}, {2, -100.f}};
  Result r = generate({3.0f, 1.9f, 1.2f, 0.0f, -1.0f}, kNoEos, {1}, p);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{3, 0, 3, 0, 1, 3}));
}

TEST(EngineLogits, MinTokensSuppressesEosAndStopIdsUntilReached) {
  // EOS (3) has the top logit and stop id 0 the next; with min_tokens 3 both are masked for the first three
  // tokens (token 1 wins), then EOS ends the request at the fourth.
  const std::vector<float> lg = {1.0f, 0.5f, 0.2f, 3.0f};
  GenerationParams p = greedy(6);
  p.stop_token_ids = {0};
  Result plain = generate(lg, 3, {1}, p);
  EXPECT_EQ(plain.tokens, (std::vector<int32_t>{3}));
  EXPECT_EQ(plain.finish, FinishReason::Stop);
  p.min_tokens = 3;
  Result r = generate(lg, 3, {1}, p);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 1, 1, 3}));
  EXPECT_EQ(r.finish, FinishReason::Stop);
  // ignore_eos: EOS is an ordinary token (no stop), the stop id is still masked until min_tokens.
  p.ignore_eos = true;
  p.max_tokens = 4;
  Result ign = generate(lg, 3, {1}, p);
  EXPECT_EQ(ign.tokens, (std::vector<int32_t>{3, 3, 3, 3}));
  EXPECT_EQ(ign.finish, FinishReason::Length);
}

TEST(EngineLogits, LogprobsAreLogSoftmaxOfTheRawLogitsBeforePenalties) {
  // The documented logits (docs/TESTING.md): the model's output before penalties, bias and temperature, like
  // vLLM's default. With a frequency penalty the chosen tokens change, their logprobs stay the raw ones.
  GenerationParams p = greedy(3);
  p.frequency_penalty = 1.5f;  // 0 (3.0) → then 1 (2.0 vs 1.5) → then 0 (1.5 vs 0.5)
  p.top_logprobs = 2;
  Result r = generate(kLogits, kNoEos, {4}, p);
  ASSERT_EQ(r.tokens, (std::vector<int32_t>{0, 1, 0}));
  ASSERT_EQ(r.logprobs.size(), 3u);
  double z = 0;
  for (float x : kLogits) z += std::exp(double(x));
  auto lsm = [&](int t) { return double(kLogits[size_t(t)]) - std::log(z); };
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.logprobs[i].id, r.tokens[i]);
    EXPECT_NEAR(r.logprobs[i].logprob, lsm(r.tokens[i]), 1e-5) << i;
    ASSERT_EQ(r.logprobs[i].top.size(), 2u);
    EXPECT_EQ(r.logprobs[i].top[0].first, 0);
    EXPECT_NEAR(r.logprobs[i].top[0].second, lsm(0), 1e-5);
    EXPECT_EQ(r.logprobs[i].top[1].first, 1);
    EXPECT_NEAR(r.logprobs[i].top[1].second, lsm(1), 1e-5);
  }
}

TEST(EngineLogits, ValidationRejectsOutOfRangeLogitParametersWithTheFieldName) {
  ConstLogitsExecutor exec(kLogits, kNoEos);
  Engine e(exec, EngineConfig{});
  auto rejected = [&](auto mutate, const char* field) {
    EngineRequest r;
    r.id = field;
    r.prompt = {1};
    mutate(r.params);
    try {
      e.submit(r, [](const EngineOutput&) {});
      ADD_FAILURE() << field << " accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(field), std::string::npos) << err.what();
    }
  };
  rejected([](GenerationParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  rejected([](GenerationParams& p) { p.presence_penalty = -2.5f; }, "presence_penalty");
  rejected([](GenerationParams& p) { p.frequency_penalty = 2.5f; }, "frequency_penalty");
  rejected([](GenerationParams& p) { p.repetition_penalty = 0.f; }, "repetition_penalty");
  rejected([](GenerationParams& p) { p.min_tokens = p.max_tokens + 1; }, "min_tokens");
  rejected([](GenerationParams& p) { p.logit_bias = {{5, 1.f}}; }, "logit_bias");
  rejected([](GenerationParams& p) { p.logit_bias = {{1, 101.f}}; }, "logit_bias");
  rejected([](GenerationParams& p) { p.top_logprobs = 21; }, "top_logprobs");
}

}  // namespace
}  // namespace m3
