// The startup warm-up request (engine/warmup.h) on the tiny random model: it runs to completion through a started
// engine with its prompt clipped to one step, returns every page it used to the pool, and leaves the engine serving
// exactly what it would have served without it.
#include <gtest/gtest.h>

#include <future>
#include <memory>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/warmup.h"
#include "test_model_util.h"

namespace m3 {
namespace {

std::vector<int32_t> serve_one(Engine& e, const std::vector<int32_t>& prompt, int n) {
  EngineRequest r;
  r.id = "after";
  r.prompt = prompt;
  r.params.max_tokens = n;
  r.params.sampling.temperature = 0;
  auto done = std::make_shared<std::promise<void>>();
  auto toks = std::make_shared<std::vector<int32_t>>();
  e.submit(std::move(r), [done, toks](const EngineOutput& o) {
    toks->insert(toks->end(), o.tokens.begin(), o.tokens.end());
    if (o.finish != FinishReason::None) done->set_value();
  });
  done->get_future().get();
  return *toks;
}

TEST(EngineWarmup, RunsOneClippedStepRequestAndLeavesTheEngineUnchanged) {
  M3Config c = test::tiny_config();
  c.eos_token_id = -1;
  const M3Model model(c, test::random_weights(c, 7));
  const auto prompt = test::random_ids(40, c.vocab_size, 3);

  Engine cold(model, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 96, .enable_prefix_caching = false});
  cold.start();
  const std::vector<int32_t> want = serve_one(cold, prompt, 12);
  cold.stop();

  Engine e(model, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 96, .enable_prefix_caching = false});
  e.start();
  const WarmupResult w = warm_up_engine(e, 100000, c.vocab_size);
  EXPECT_EQ(w.prompt_tokens, 96);  // clipped to one step's tokens
  EXPECT_GT(w.seconds, 0.0);
  EngineMetrics m = e.metrics();
  EXPECT_EQ(m.num_running + m.num_waiting, 0);
  EXPECT_EQ(m.pages_used, 0);
  EXPECT_EQ(serve_one(e, prompt, 12), want);
  e.stop();
}

TEST(EngineWarmup, PromptIsClippedToTheModelLength) {
  M3Config c = test::tiny_config();
  c.eos_token_id = -1;
  const M3Model model(c, test::random_weights(c, 8));
  Engine e(model, EngineConfig{.num_pages = 32, .max_num_batched_tokens = 512, .max_model_len = 50});
  e.start();
  EXPECT_EQ(warm_up_engine(e, 4096, c.vocab_size).prompt_tokens, 48);  // room for its two new tokens
  e.stop();
}

}  // namespace
}  // namespace m3
