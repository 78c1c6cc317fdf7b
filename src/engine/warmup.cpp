#include "engine/warmup.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"

namespace m3 {

WarmupResult warm_up_engine(Engine& engine, int64_t tokens, int64_t vocab) {
  const EngineConfig& c = engine.config();
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>({tokens, c.max_num_batched_tokens, c.max_model_len - 2}));
  EngineRequest req;
  req.id = "m3serve-warmup";
  req.prompt.resize(size_t(n));
  uint64_t x = 0x9E3779B97F4A7C15ull;  // fixed pseudo-random ids: no structure a prefix cache could later match
  for (auto& t : req.prompt) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = int32_t((x >> 33) % uint64_t(std::max<int64_t>(1, vocab)));
  }
  req.params.max_tokens = 2;  // one prefill step, then one decode step
  req.params.ignore_eos = true;
  req.params.sampling.temperature = 0.f;
  auto done = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = done->get_future();
  const auto t0 = std::chrono::steady_clock::now();
  engine.submit(std::move(req), [done](const EngineOutput& out) {
    if (out.finish == FinishReason::None) return;
    done->set_value(out.finish == FinishReason::Error ? "error: " + out.error : std::string());
  });
  const std::string err = result.get();
  M3_CHECK(err.empty(), "startup warm-up request failed ({}); start with --no-warmup to skip it", err);
  return {n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

}  // namespace m3
