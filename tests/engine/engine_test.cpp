// Serving engine behaviour on the tiny random model: equality with direct generation, continuous batching under
// a small page pool (preemption by recompute), prefix-cache hits, aborts, and the page invariants of
// docs/KV_CACHE.md (every page returns however a request ends).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "engine/engine.h"
#include "kv/sequence_kv.h"
#include "test_model_util.h"

namespace m3 {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  int cached = -1;
  int events = 0;
  std::vector<float> logprobs;  // of the chosen tokens, when requested
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    M3Config c = test::tiny_config();
    c.eos_token_id = -1;  // random weights: never stop early unless a test asks
    model_ = new M3Model(c, test::random_weights(c, 7));
  }
  static void TearDownTestSuite() { delete model_; }
  static M3Model* model_;

  std::map<std::string, Collected> out_;
  std::mutex mu_;

  OutputSink sink(const std::string& id) {
    return [this, id](const EngineOutput& o) {
      std::lock_guard<std::mutex> lk(mu_);
      auto& c = out_[id];
      c.tokens.insert(c.tokens.end(), o.tokens.begin(), o.tokens.end());
      for (const auto& lp : o.logprobs) c.logprobs.push_back(lp.logprob);
      c.events++;
      if (o.finish != FinishReason::None) {
        c.finish = o.finish;
        c.cached = o.cached_tokens;
      }
    };
  }
  static EngineRequest request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.params.max_tokens = max_tokens;
    r.params.sampling.temperature = 0;
    return r;
  }
  static void run_until_idle(Engine& e) {
    while (e.step()) {
    }
  }
  // Greedy generation straight through the model (no engine), the reference for the engine's outputs.
  // When `logits` is given it receives the raw logits [V] of every step.
  static std::vector<int32_t> direct_greedy(const std::vector<int32_t>& prompt, int n,
                                            std::vector<std::vector<float>>* logits = nullptr) {
    const M3Config& c = model_->config();
    KVCache cache(c, 64);
    SequenceKV seq(cache);
    std::vector<int32_t> toks = prompt, out;
    seq.reserve(int64_t(toks.size()));
    SeqInput in{toks, 0, seq.pages(), false};
    auto lg = model_->forward(std::span<const SeqInput>(&in, 1), cache)[0];
    for (int i = 0; i < n; ++i) {
      if (logits) logits->push_back(lg);
      int32_t t = argmax(lg);
      out.push_back(t);
      toks.push_back(t);
      if (i + 1 == n) break;
      seq.reserve(int64_t(toks.size()));
      SeqInput step{std::span<const int32_t>(&toks.back(), 1), int64_t(toks.size()) - 1, seq.pages(), false};
      lg = model_->forward(std::span<const SeqInput>(&step, 1), cache)[0];
    }
    return out;
  }
};
M3Model* EngineTest::model_ = nullptr;

TEST_F(EngineTest, SingleRequestEqualsDirectGreedyGeneration) {
  Engine e(*model_, EngineConfig{.num_pages = 32});
  auto prompt = test::random_ids(70, model_->config().vocab_size, 1);
  e.submit(request("a", prompt, 20), sink("a"));
  run_until_idle(e);
  EXPECT_EQ(out_["a"].finish, FinishReason::Length);
  EXPECT_EQ(out_["a"].tokens, direct_greedy(prompt, 20));
}

TEST_F(EngineTest, ManyRequestsUnderASmallPoolAllFinishWithUnchangedOutputsAndNoLeakedPages) {
  // 12 requests of 50-token prompts + 30 new tokens need 60 pages at once; the pool has 14 (each holds 16
  // tokens), so the engine must queue, chunk and preempt — and still produce what each would alone.
  EngineConfig cfg{.num_pages = 14, .max_num_seqs = 8, .max_num_batched_tokens = 40};
  Engine e(*model_, cfg);
  std::map<std::string, std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    const std::string id = "r" + std::to_string(i);
    prompts[id] = test::random_ids(50, model_->config().vocab_size, 100 + i);
    e.submit(request(id, prompts[id], 30), sink(id));
  }
  run_until_idle(e);
  for (auto& [id, p] : prompts) {
    ASSERT_EQ(out_[id].finish, FinishReason::Length) << id;
    EXPECT_EQ(out_[id].tokens, direct_greedy(p, 30)) << id;
  }
  EngineMetrics m = e.metrics();
  EXPECT_GT(m.preemptions, 0u) << "the pool was meant to be too small";
  EXPECT_EQ(m.pages_used, 0);
  EXPECT_EQ(m.num_running + m.num_waiting, 0);
}

TEST_F(EngineTest, RepeatedPrefixIsServedFromTheCacheWithIdenticalOutput) {
  Engine e(*model_, EngineConfig{.num_pages = 32});
  auto prompt = test::random_ids(100, model_->config().vocab_size, 5);
  e.submit(request("cold", prompt, 12), sink("cold"));
  run_until_idle(e);
  e.submit(request("warm", prompt, 12), sink("warm"));
  run_until_idle(e);
  EXPECT_EQ(out_["cold"].cached, 0);
  EXPECT_EQ(out_["warm"].cached, 96);  // 6 full pages of 16; the last prompt token is always recomputed
  EXPECT_EQ(out_["warm"].tokens, out_["cold"].tokens);
  // A different continuation of the same prefix shares only the common full pages.
  auto other = prompt;
  other[40] = (other[40] + 1) % model_->config().vocab_size;
  e.submit(request("fork", other, 4), sink("fork"));
  run_until_idle(e);
  EXPECT_EQ(out_["fork"].cached, 32);
  EngineMetrics m = e.metrics();
  EXPECT_EQ(m.pages_used, 0);
  EXPECT_GT(m.pages_cached, 0);
  EXPECT_EQ(m.prefix_hit_tokens, 128u);
  // KV bytes for /metrics: the pool is 32 pages of the executor's page size.
  EXPECT_EQ(m.page_bytes, e.executor().page_bytes());
  EXPECT_NE(m.to_prometheus("t").find("m3serve:kv_cache_bytes{model_name=\"t\"} " +
                                      std::to_string(32 * e.executor().page_bytes())),
            std::string::npos);
}

TEST_F(EngineTest, RepeatedContentGivesTheSameOutputColdAndCached) {
  // A prompt made of one page repeated four times: each repetition is its own cache entry, so the cached run reuses
  // all four pages and must produce the cold run's tokens and logprobs.
  const int V = model_->config().vocab_size;
  auto page = test::random_ids(16, V, 21);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), page.begin(), page.end());
  prompt.push_back(3);
  Engine e(*model_, EngineConfig{.num_pages = 32});
  for (const char* id : {"cold", "warm"}) {
    EngineRequest r = request(id, prompt, 8);
    r.params.top_logprobs = 0;
    e.submit(r, sink(id));
    run_until_idle(e);
  }
  EXPECT_EQ(out_["cold"].cached, 0);
  EXPECT_EQ(out_["warm"].cached, 64);
  EXPECT_EQ(out_["warm"].tokens, out_["cold"].tokens);
  ASSERT_EQ(out_["warm"].logprobs.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(out_["warm"].logprobs[i], out_["cold"].logprobs[i], 1e-4) << i;
}

TEST_F(EngineTest, EqualPagesAfterDifferentPrefixesAreNotShared) {
  // Pages A B X and C B D are cached; A B D must reuse only A B (D's cached KV was computed after C B), and its
  // output must equal a cold run without any cache.
  const int V = model_->config().vocab_size;
  auto blk = [&](uint64_t seed) { return test::random_ids(16, V, seed); };
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> v;
    for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    v.push_back(5);
    return v;
  };
  const auto A = blk(31), B = blk(32), C = blk(33), D = blk(34), X = blk(35);
  Engine e(*model_, EngineConfig{.num_pages = 48});
  e.submit(request("abx", cat({A, B, X}), 1), sink("abx"));
  run_until_idle(e);
  e.submit(request("cbd", cat({C, B, D}), 1), sink("cbd"));
  run_until_idle(e);
  // Repeated content behind another prefix: B B B after C B D.
  for (auto [id, prompt] : {std::pair{"abd", cat({A, B, D})}, std::pair{"bbb", cat({B, B, B})}}) {
    EngineRequest r = request(id, prompt, 6);
    r.params.top_logprobs = 0;
    e.submit(r, sink(id));
    run_until_idle(e);
    Engine fresh(*model_, EngineConfig{.num_pages = 48, .enable_prefix_caching = false});
    const std::string ref = std::string(id) + "-ref";
    fresh.submit(r, sink(ref));
    run_until_idle(fresh);
    EXPECT_EQ(out_[id].tokens, out_[ref].tokens) << id;
    ASSERT_EQ(out_[id].logprobs.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(out_[id].logprobs[i], out_[ref].logprobs[i], 1e-4) << id << i;
  }
  EXPECT_EQ(out_["abd"].cached, 32);
  EXPECT_EQ(out_["bbb"].cached, 0);
}

TEST_F(EngineTest, LogprobsAreLogSoftmaxOfTheModelLogits) {
  Engine e(*model_, EngineConfig{.num_pages = 32});
  auto prompt = test::random_ids(25, model_->config().vocab_size, 12);
  EngineRequest r = request("lp", prompt, 5);
  r.params.top_logprobs = 3;
  std::vector<TokenLogprob> got;
  e.submit(r, [&](const EngineOutput& o) { got.insert(got.end(), o.logprobs.begin(), o.logprobs.end()); });
  run_until_idle(e);
  std::vector<std::vector<float>> logits;
  auto ref = direct_greedy(prompt, 5, &logits);
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const auto& lg = logits[i];
    double m = *std::max_element(lg.begin(), lg.end()), z = 0;
    for (float x : lg) z += std::exp(double(x) - m);
    auto lsm = [&](int32_t t) { return double(lg[size_t(t)]) - m - std::log(z); };
    EXPECT_EQ(got[i].id, ref[i]);
    EXPECT_NEAR(got[i].logprob, lsm(ref[i]), 1e-4) << i;
    ASSERT_EQ(got[i].top.size(), 3u);
    EXPECT_EQ(got[i].top[0].first, ref[i]);
    for (auto [t, lp] : got[i].top) EXPECT_NEAR(lp, lsm(t), 1e-4) << i;
    EXPECT_GE(got[i].top[1].second, got[i].top[2].second);
  }
}

TEST_F(EngineTest, PrefixCachingOffNeverReportsHits) {
  Engine e(*model_, EngineConfig{.num_pages = 32, .enable_prefix_caching = false});
  auto prompt = test::random_ids(60, model_->config().vocab_size, 6);
  e.submit(request("a", prompt, 3), sink("a"));
  e.submit(request("b", prompt, 3), sink("b"));
  run_until_idle(e);
  EXPECT_EQ(out_["b"].cached, 0);
  EXPECT_EQ(e.metrics().pages_free, 32);
}

TEST_F(EngineTest, AbortFreesPagesAndEndsTheStream) {
  Engine e(*model_, EngineConfig{.num_pages = 32});
  e.submit(request("x", test::random_ids(40, model_->config().vocab_size, 7), 400), sink("x"));
  for (int i = 0; i < 5; ++i) e.step();
  e.abort("x");
  e.abort("never-existed");
  run_until_idle(e);
  EXPECT_EQ(out_["x"].finish, FinishReason::Abort);
  EXPECT_LT(out_["x"].tokens.size(), 10u);
  EXPECT_EQ(e.metrics().pages_used, 0);
}

TEST_F(EngineTest, StopTokenEndsWithStopAndMinTokensDefersIt) {
  Engine e(*model_, EngineConfig{.num_pages = 32});
  auto prompt = test::random_ids(30, model_->config().vocab_size, 8);
  auto ref = direct_greedy(prompt, 10);
  const int32_t stop = ref[3];
  const size_t first_stop = size_t(std::find(ref.begin(), ref.end(), stop) - ref.begin());
  EngineRequest r = request("s", prompt, 10);
  r.params.stop_token_ids = {stop};
  e.submit(r, sink("s"));
  run_until_idle(e);
  EXPECT_EQ(out_["s"].finish, FinishReason::Stop);
  EXPECT_EQ(out_["s"].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + long(first_stop) + 1));
  // min_tokens 6: the stop id is masked for the first six tokens (the greedy path diverges where it was drawn).
  r.id = "m";
  r.params.min_tokens = 6;
  e.submit(r, sink("m"));
  run_until_idle(e);
  const auto& got = out_["m"].tokens;
  ASSERT_GE(got.size(), 6u);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + long(first_stop)),
            std::vector<int32_t>(ref.begin(), ref.begin() + long(first_stop)));
  EXPECT_EQ(std::count(got.begin(), got.begin() + 6, stop), 0);
  if (out_["m"].finish == FinishReason::Stop) {
    EXPECT_EQ(got.back(), stop);
  } else {
    EXPECT_EQ(got.size(), 10u);
  }
}

TEST_F(EngineTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  Engine e(*model_, EngineConfig{.num_pages = 64});
  auto prompt = test::random_ids(20, model_->config().vocab_size, 9);
  for (const char* id : {"s1", "s1b", "s2"}) {
    EngineRequest r = request(id, prompt, 24);
    r.params.sampling.temperature = 1.5f;
    r.params.sampling.seed = std::string(id) == "s2" ? 2 : 1;
    e.submit(r, sink(id));
  }
  run_until_idle(e);
  EXPECT_EQ(out_["s1"].tokens, out_["s1b"].tokens);
  EXPECT_NE(out_["s1"].tokens, out_["s2"].tokens);
}

TEST_F(EngineTest, RequestsThatCanNeverFitAreRejectedWithTheNumbers) {
  Engine e(*model_, EngineConfig{.num_pages = 4, .max_model_len = 64});
  try {
    e.submit(request("big", test::random_ids(60, model_->config().vocab_size, 1), 10), sink("big"));
    FAIL() << "accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("maximum context length is 64"), std::string::npos) << err.what();
  }
  EXPECT_THROW(e.submit(request("empty", {}, 10), sink("empty")), Error);
  EXPECT_THROW(e.submit(request("oov", {1, 2, 100000}, 1), sink("oov")), Error);
  EngineRequest bad = request("t", {1, 2}, 1);
  bad.params.sampling.top_p = 0;
  EXPECT_THROW(e.submit(bad, sink("t")), Error);
}

TEST_F(EngineTest, EngineThreadServesConcurrentSubmitters) {
  Engine e(*model_, EngineConfig{.num_pages = 24, .max_num_seqs = 4});
  e.start();
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i)
    clients.emplace_back([&, i] {
      const std::string id = "t" + std::to_string(i);
      e.submit(request(id, test::random_ids(20 + i, model_->config().vocab_size, 50 + i), 8), sink(id));
    });
  for (auto& t : clients) t.join();
  for (int spin = 0; spin < 2000; ++spin) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      int done = 0;
      for (auto& [id, c] : out_) done += c.finish != FinishReason::None;
      if (done == 6) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  e.stop();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out_["t" + std::to_string(i)].finish, FinishReason::Length) << i;
  EXPECT_EQ(e.metrics().pages_used, 0);
}

}  // namespace
}  // namespace m3
