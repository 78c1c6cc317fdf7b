// The serving engine: one thread owns the model executor, the scheduler and the KV cache. Other threads talk to it
// only through submit()/abort() (a locked inbox) and the OutputSink callbacks it calls.
//
// Each step is schedule → run → update: the Scheduler (engine/scheduler.h) plans which sequences compute how many
// tokens, the executor runs the forward and samples (ModelExecutor::forward_sample), the scheduler applies the
// tokens (stop checks, prefix-cache inserts, page release), and the engine emits outputs and publishes the step's
// metrics once. No request fails because the cache is full: preemption by recompute makes room.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/request.h"
#include "engine/metrics.h"
#include "engine/scheduler.h"
#include "model/executor.h"
#include "model/m3_model.h"

namespace m3 {

struct EngineConfig {
  int32_t num_pages = 0;              // KV pages for the CPU executor the M3Model constructor builds (0 = default)
  int max_num_seqs = 64;              // running sequences at most
  int max_num_batched_tokens = 2048;  // tokens per step (decode rows + prefill chunk tokens)
  int64_t max_model_len = 0;          // prompt + generated, at most (0 = model's max_position_embeddings)
  bool enable_prefix_caching = true;
};

class Engine {
 public:
  // Runs on the CPU reference backend with an executor of cfg.num_pages pages.
  Engine(const M3Model& model, EngineConfig cfg);
  // Runs on any executor (e.g. CUDA); the page count is the executor's.
  Engine(ModelExecutor& executor, EngineConfig cfg);
  ~Engine();  // stops the thread; pending requests finish with Abort

  void start();
  void stop();

  // Thread-safe. Validates (prompt length, params) and throws m3::Error with a client-facing message when the
  // request can never run; otherwise queues it. The sink receives every output event, the last one final.
  void submit(EngineRequest req, OutputSink sink);
  // Thread-safe; unknown or finished ids are ignored. The request's pages return to the pool within one step.
  void abort(const std::string& request_id);

  const EngineConfig& config() const { return cfg_; }
  ModelExecutor& executor() { return exec_; }
  int64_t max_model_len() const { return cfg_.max_model_len; }
  EngineMetrics metrics() const;  // thread-safe snapshot

  // Runs one scheduling step on the calling thread (tests drive the engine without its thread). Returns false
  // when there was nothing to do.
  bool step();

 private:
  void loop();
  void drain_inbox();
  // Sends a sequence's final event (no new tokens) and counts it.
  void finish(Sequence& s, const std::string& error = {});
  void publish_state();  // running/waiting/page gauges for metrics()
  // The media embedding rows of the prompt slot tokens among the next `n` tokens of `s` (engine.cpp).
  std::span<const float> media_rows(const Sequence& s, int64_t n) const;

  std::unique_ptr<ModelExecutor> owned_executor_;
  ModelExecutor& exec_;
  EngineConfig cfg_;

  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::pair<EngineRequest, OutputSink>> inbox_;
  std::vector<std::string> abort_inbox_;
  bool stop_ = false;
  std::thread thread_;

  // Owned by the engine thread (or by step() callers when no thread runs).
  Scheduler sched_;
  uint64_t arrival_counter_ = 0;
  std::vector<uint32_t> masks_;  // this step's grammar masks [constrained rows, words]

  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
};

}  // namespace m3
