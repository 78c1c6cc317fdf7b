// The engine over data-parallel ranks (engine/engine.h, docs/PARALLEL.md) on the tiny random MoE model
// (test::tiny_config: 2 MoE layers of 8 experts, top-2, shared expert): P ranks with expert parallelism give the
// one-rank greedy tokens; requests are placed by prefix-cache affinity, then load; pages return on the rank that
// held them however a request ends.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "model/tp_executor.h"
#include "model/weight_plan.h"
#include "test_model_util.h"

namespace m3 {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  int cached = -1;
};

class EngineDpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    M3Config c = test::tiny_config();
    c.eos_token_id = -1;  // random weights: never stop early
    model_ = new M3Model(c, test::random_weights(c, 11));
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
  static std::vector<int32_t> prompt(int n, uint64_t seed) {
    return test::random_ids(n, model_->config().vocab_size, seed);
  }
  static void run_until_idle(Engine& e) {
    while (e.step()) {
    }
  }
  // Pages rank r's sequences still reference (cached-only pages excluded): 0 once every request has ended.
  static int32_t pages_in_use(const Engine& e, int r) {
    const Scheduler& s = e.scheduler(r);
    return s.pool().num_used() - s.prefix_cache().num_evictable();
  }
  static EngineConfig dp(int P, EngineConfig c = {}) {
    c.data_parallel_size = P;
    c.enable_expert_parallel = true;
    return c;
  }
};
M3Model* EngineDpTest::model_ = nullptr;

// Several concurrent requests of different prompt and output lengths, served under a small per-rank pool and token
// budget (chunked prefills, preemption, ranks idle for some steps while others decode) — the tokens of every
// request equal the one-rank engine's.
TEST_F(EngineDpTest, TwoAndThreeRanksGiveTheOneRankGreedyTokensUnderPreemption) {
  const int lens[] = {20, 75, 33, 90, 48, 17, 61};
  const int news[] = {25, 4, 30, 6, 20, 28, 3};
  auto submit_all = [&](Engine& e, const std::string& tag) {
    for (int i = 0; i < 7; ++i)
      e.submit(request(tag + std::to_string(i), prompt(lens[i], 200 + uint64_t(i)), news[i]),
               sink(tag + std::to_string(i)));
  };
  const EngineConfig base{.num_pages = 9, .max_num_seqs = 4, .max_num_batched_tokens = 48};
  {
    Engine one(*model_, base);
    submit_all(one, "one");
    run_until_idle(one);
  }
  // Without --enable-expert-parallel every rank runs every expert (replicas in lockstep): the same tokens too.
  for (auto [P, ep] : {std::pair{2, true}, std::pair{3, true}, std::pair{2, false}}) {
    EngineConfig cfg = dp(P, base);
    cfg.enable_expert_parallel = ep;
    Engine e(*model_, cfg);
    ASSERT_EQ(e.data_parallel_size(), P);
    for (int r = 0; r < P; ++r) EXPECT_EQ(e.executor(r).expert_parallel(), ep);
    const std::string tag = "dp" + std::to_string(P) + (ep ? "ep-" : "-");
    submit_all(e, tag);
    ASSERT_TRUE(e.step());
    std::vector<int> placed(size_t(P), 0);
    for (int i = 0; i < 7; ++i) {
      const int r = e.rank_of(tag + std::to_string(i));
      ASSERT_GE(r, 0);
      placed[size_t(r)]++;
    }
    for (int r = 0; r < P; ++r) EXPECT_GE(placed[size_t(r)], 7 / P) << P << " ranks, rank " << r;
    run_until_idle(e);
    for (int i = 0; i < 7; ++i) {
      const std::string a = "one" + std::to_string(i), b = tag + std::to_string(i);
      ASSERT_EQ(out_[b].finish, FinishReason::Length) << b;
      EXPECT_EQ(out_[b].tokens.size(), size_t(news[i])) << b;
      EXPECT_EQ(out_[b].tokens, out_[a].tokens) << b;
    }
    for (int r = 0; r < P; ++r) EXPECT_EQ(pages_in_use(e, r), 0) << P << " ranks, rank " << r;
    EngineMetrics m = e.metrics();
    EXPECT_EQ(m.pages_used, 0);
    EXPECT_EQ(m.pages_total, 9 * P);
    EXPECT_GT(m.preemptions, 0u) << "the per-rank pool was meant to be too small";
  }
}

// Attention split over the 2 KV heads (TpCpuExecutor: two ranks, each with its heads' share of the dummy weights and
// a cache of its KV head, o all-reduced; with split experts and vocabulary each rank runs its own experts (slot
// outputs summed) and its vocabulary rows (embedding rows summed, logit columns gathered))
// behind one engine: the same requests under the same small pool (chunked prefills, preemption, prefix hits) give
// the one-rank greedy tokens, and every page comes back.
class KvHeadSplit : public EngineDpTest, public ::testing::WithParamInterface<bool> {};
TEST_P(KvHeadSplit, ExecutorGivesTheOneRankGreedyTokensUnderPreemption) {
  const bool split_experts = GetParam();
  M3Config c = test::tiny_config();
  c.eos_token_id = -1;
  const M3Model whole(c, dummy_weights(c, 7));
  std::vector<std::unique_ptr<const M3Model>> shares;
  for (int r = 0; r < 2; ++r)
    shares.push_back(std::make_unique<M3Model>(c, dummy_weights(c, 7, RankShare{r, 2, split_experts, 2, split_experts ? 2 : 1})));
  TpCpuExecutor tp(std::move(shares), 9);
  EXPECT_NE(tp.describe().find("2 KV-head ranks"), std::string::npos) << tp.describe();
  const int64_t rank_page = CpuExecutor::page_bytes_for(RankShare{0, 2, false, 2, 1}.kv_config(c));
  EXPECT_LT(rank_page, CpuExecutor::page_bytes_for(c)) << "a rank caches half the K/V heads";
  EXPECT_EQ(tp.page_bytes(), 2 * rank_page);
  const int lens[] = {20, 75, 33, 90, 48};
  const int news[] = {25, 4, 30, 6, 20};
  const EngineConfig base{.num_pages = 9, .max_num_seqs = 4, .max_num_batched_tokens = 48};
  CpuExecutor one_exec(whole, 9);
  for (auto [ex, tag] : {std::pair<ModelExecutor*, std::string>{&one_exec, "one"}, {&tp, "tp"}}) {
    Engine e(*ex, base);
    for (int i = 0; i < 5; ++i)
      e.submit(request(tag + std::to_string(i), test::random_ids(lens[i], c.vocab_size, 300 + uint64_t(i)), news[i]),
               sink(tag + std::to_string(i)));
    run_until_idle(e);
    EXPECT_EQ(pages_in_use(e, 0), 0) << tag;
    EXPECT_GT(e.metrics().preemptions, 0u) << tag << ": the pool was meant to be too small";
  }
  for (int i = 0; i < 5; ++i) {
    const std::string a = "one" + std::to_string(i), b = "tp" + std::to_string(i);
    ASSERT_EQ(out_[b].finish, FinishReason::Length) << b;
    EXPECT_EQ(out_[b].tokens, out_[a].tokens) << b;
  }
}
INSTANTIATE_TEST_SUITE_P(WholeAndSplitExperts, KvHeadSplit, ::testing::Bool());

// Shares that are not one KV-head split (wrong rank order, experts or vocabulary split on some ranks only) are
// refused with a message.
TEST_F(EngineDpTest, KvHeadSplitExecutorRefusesSharesThatAreNotOneSplit) {
  const M3Config c = test::tiny_config();
  auto build = [&](RankShare a, RankShare b) {
    std::vector<std::unique_ptr<const M3Model>> v;
    v.push_back(std::make_unique<M3Model>(c, dummy_weights(c, 7, a)));
    v.push_back(std::make_unique<M3Model>(c, dummy_weights(c, 7, b)));
    return TpCpuExecutor(std::move(v), 4);
  };
  EXPECT_THROW(build(RankShare{1, 2, false, 2, 1}, RankShare{0, 2, false, 2, 1}), Error);
  EXPECT_THROW(build(RankShare{0, 2, true, 2, 1}, RankShare{1, 2, false, 2, 1}), Error);  // experts split on one
  EXPECT_THROW(build(RankShare{0, 2, false, 2, 2}, RankShare{1, 2, false, 2, 1}), Error);  // vocabulary on one
  EXPECT_NO_THROW(build(RankShare{0, 2, false, 2, 2}, RankShare{1, 2, false, 2, 2}));
  EXPECT_NO_THROW(build(RankShare{0, 2, false, 2, 1}, RankShare{1, 2, false, 2, 1}));
  EXPECT_NO_THROW(build(RankShare{0, 2, true, 2, 1}, RankShare{1, 2, true, 2, 1}));
}

// A step that fails on the ranks (a page id outside the pool) is an error for the caller; the group is usable again
// and the next step gives the logits a fresh executor gives.
TEST_F(EngineDpTest, KvHeadSplitExecutorRecoversFromAFailedStep) {
  const M3Config c = test::tiny_config();
  auto make = [&] {
    std::vector<std::unique_ptr<const M3Model>> v;
    for (int r = 0; r < 2; ++r) v.push_back(std::make_unique<M3Model>(c, dummy_weights(c, 7, RankShare{r, 2, false, 2, 1})));
    return std::make_unique<TpCpuExecutor>(std::move(v), 4);
  };
  auto tp = make(), fresh = make();
  const std::vector<int32_t> ids = test::random_ids(20, c.vocab_size, 5);
  const std::vector<int32_t> bad_pages{0, 99}, pages{0, 1};
  const SeqInput bad{std::span<const int32_t>(ids), 0, bad_pages, false};
  EXPECT_THROW(tp->forward(std::span<const SeqInput>(&bad, 1), nullptr), Error);
  const SeqInput in{std::span<const int32_t>(ids), 0, pages, false};
  EXPECT_EQ(tp->forward(std::span<const SeqInput>(&in, 1), nullptr),
            fresh->forward(std::span<const SeqInput>(&in, 1), nullptr));
}

TEST_F(EngineDpTest, RequestWhosePrefixIsCachedOnRankOneIsPlacedOnRankOne) {
  Engine e(*model_, dp(2, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 160}));
  const auto pa = prompt(70, 1), pb = prompt(70, 2);
  e.submit(request("a", pa, 3), sink("a"));
  e.submit(request("b", pb, 3), sink("b"));
  ASSERT_TRUE(e.step());
  ASSERT_EQ(e.rank_of("a"), 0);
  ASSERT_EQ(e.rank_of("b"), 1);  // independent: the less loaded rank
  run_until_idle(e);
  EXPECT_EQ(e.scheduler(1).prefix_cache().peek(pb), 4);  // 4 full pages of b's 70 tokens
  EXPECT_EQ(e.scheduler(0).prefix_cache().peek(pb), 0);

  // "b2" continues b's prompt. "x" (unrelated) lands on rank 0, "y" shares b's prefix and lands on rank 1, and
  // then "b2" still goes to rank 1 although rank 1 is now the busier one: affinity comes before load.
  auto b2 = pb;
  b2.insert(b2.end(), {5, 6, 7, 8});
  auto y = pb;
  y.resize(40);
  e.submit(request("x", prompt(30, 3), 4), sink("x"));
  e.submit(request("y", y, 4), sink("y"));
  e.submit(request("b2", b2, 4), sink("b2"));
  ASSERT_TRUE(e.step());
  EXPECT_EQ(e.rank_of("x"), 0);
  EXPECT_EQ(e.rank_of("y"), 1);
  EXPECT_EQ(e.rank_of("b2"), 1);
  run_until_idle(e);
  EXPECT_EQ(out_["b2"].cached, 64);  // served from rank 1's cache
  EXPECT_EQ(out_["y"].cached, 32);
  EXPECT_EQ(out_["x"].cached, 0);
  EXPECT_EQ(e.metrics().prefix_hit_tokens, 96u);
}

TEST_F(EngineDpTest, LoadBalancingPlacesIndependentRequestsOnDifferentRanks) {
  Engine e(*model_, dp(3, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 160}));
  for (int i = 0; i < 6; ++i)
    e.submit(request("r" + std::to_string(i), prompt(25, 40 + uint64_t(i)), 8), sink("r" + std::to_string(i)));
  ASSERT_TRUE(e.step());
  std::map<int, int> per_rank;
  for (int i = 0; i < 6; ++i) per_rank[e.rank_of("r" + std::to_string(i))]++;
  EXPECT_EQ(per_rank, (std::map<int, int>{{0, 2}, {1, 2}, {2, 2}}));
  run_until_idle(e);

  // Equal sequence counts: the rank with fewer tokens takes the next request.
  Engine f(*model_, dp(2, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 160}));
  f.submit(request("long", prompt(150, 50), 8), sink("long"));
  f.submit(request("short", prompt(20, 51), 8), sink("short"));
  f.submit(request("next", prompt(20, 52), 8), sink("next"));
  ASSERT_TRUE(f.step());
  EXPECT_EQ(f.rank_of("long"), 0);
  EXPECT_EQ(f.rank_of("short"), 1);
  EXPECT_EQ(f.rank_of("next"), 1);
  run_until_idle(f);
  for (const char* id : {"long", "short", "next"}) EXPECT_EQ(out_[id].finish, FinishReason::Length) << id;
}

TEST_F(EngineDpTest, CancellationAndFinishFreePagesOnTheRankThatHeldThem) {
  Engine e(*model_, dp(2, EngineConfig{.num_pages = 24, .max_num_batched_tokens = 160}));
  for (int i = 0; i < 4; ++i)
    e.submit(request("q" + std::to_string(i), prompt(40 + 10 * i, 60 + uint64_t(i)), i < 2 ? 30 : 5),
             sink("q" + std::to_string(i)));
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.step());
  // q0 on rank 0 and q1 on rank 1 (fewest sequences first) are long: cancel both mid-decode.
  ASSERT_EQ(e.rank_of("q0"), 0);
  ASSERT_EQ(e.rank_of("q1"), 1);
  EXPECT_GT(pages_in_use(e, 0), 0);
  EXPECT_GT(pages_in_use(e, 1), 0);
  e.abort("q0");
  e.abort("q1");
  ASSERT_TRUE(e.step());
  EXPECT_EQ(e.rank_of("q0"), -1);
  EXPECT_EQ(e.rank_of("q1"), -1);
  run_until_idle(e);
  EXPECT_EQ(out_["q0"].finish, FinishReason::Abort);
  EXPECT_EQ(out_["q1"].finish, FinishReason::Abort);
  EXPECT_EQ(out_["q2"].finish, FinishReason::Length);
  EXPECT_EQ(out_["q3"].finish, FinishReason::Length);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(pages_in_use(e, r), 0) << "rank " << r;
    // Only cached pages remain, and every free page is allocatable again.
    const Scheduler& s = e.scheduler(r);
    EXPECT_EQ(s.pool().num_free() + s.prefix_cache().num_evictable(), s.pool().capacity()) << "rank " << r;
  }
  EngineMetrics m = e.metrics();
  EXPECT_EQ(m.pages_used, 0);
  EXPECT_EQ(m.num_running + m.num_waiting, 0);
  EXPECT_EQ(m.requests_abort, 2u);
  EXPECT_EQ(m.requests_length, 2u);
}

TEST_F(EngineDpTest, TheEngineThreadServesDataParallelRanks) {
  Engine e(*model_, dp(2, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 160}));
  e.start();
  for (int i = 0; i < 3; ++i)
    e.submit(request("t" + std::to_string(i), prompt(30 + 7 * i, 90 + uint64_t(i)), 6), sink("t" + std::to_string(i)));
  for (int spin = 0; spin < 2000 && e.metrics().requests_length < 3; ++spin)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  e.stop();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out_["t" + std::to_string(i)].tokens.size(), 6u) << i;
}

// Executors without a data-parallel path refuse P > 1 with a message naming the backend.
class OtherBackend final : public ModelExecutor {
 public:
  OtherBackend() : pool_(8) {
    cfg_.vocab_size = 4;
    cfg_.sparse_block_size = 16;
    cfg_.max_position_embeddings = 64;
  }
  const M3Config& config() const override { return cfg_; }
  PagePool& pool() override { return pool_; }
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace*) override {
    return std::vector<std::vector<float>>(seqs.size(), std::vector<float>(4, 0.f));
  }
  std::string describe() const override { return "other backend"; }
  int64_t page_bytes() const override { return 1; }

 private:
  M3Config cfg_;
  PagePool pool_;
};

TEST_F(EngineDpTest, DataParallelOnABackendWithoutItIsAClearError) {
  OtherBackend other;
  try {
    Engine e(other, dp(2));
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("needs the CPU backend"), std::string::npos) << err.what();
  }
  EXPECT_NO_THROW(Engine(other, EngineConfig{}));  // one rank: any executor
  // A CpuExecutor passed in becomes rank 0 for the engine's lifetime only.
  CpuExecutor cpu(*model_, 8);
  {
    Engine e(cpu, dp(2));
    EXPECT_TRUE(cpu.expert_parallel());
  }
  EXPECT_FALSE(cpu.expert_parallel());
  EXPECT_THROW(Engine(*model_, EngineConfig{.num_pages = 8, .data_parallel_size = 0}), Error);
}

}  // namespace
}  // namespace m3
