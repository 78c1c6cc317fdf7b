// The serving engine: one thread owns the model executor, the scheduler and the KV cache. Other threads talk to it
// only through submit()/abort() (a locked inbox) and the OutputSink callbacks it calls.
//
// Each step is schedule → run → update: the Scheduler (engine/scheduler.h) plans which sequences compute how many
// tokens, the executor runs the forward and samples (ModelExecutor::forward_sample), the scheduler applies the
// tokens (stop checks, prefix-cache inserts, page release), and the engine emits outputs and publishes the step's
// metrics once. No request fails because the cache is full: preemption by recompute makes room.
//
// Data parallelism (EngineConfig::data_parallel_size = P > 1; docs/PARALLEL.md): P ranks, each with its own
// executor, KV pool, Scheduler and prefix cache. The engine places every new request on one rank — the rank whose
// prefix cache holds the longest prefix of the prompt, then the least loaded (fewest sequences, then fewest tokens)
// — and it stays there: preemption, prefix caching and page accounting are per rank. Every step schedules all
// ranks and runs them in lockstep on one thread each; with expert parallelism a rank without rows runs the idle
// step, so the MoE exchange of every layer still has all ranks. P = 1 is the same code with one rank, run on the
// engine thread.
//
// Media features on demand (EngineRequest::media_encoder; docs/MEDIA.md "Through the engine"): on arrival the engine
// peeks at the placed rank's prefix cache and asks the encoder for the items from the first one whose slot tokens
// are not all in the hit; the sequence is held (not scheduled) until they come back through the inbox. Every
// admission checks again against the hit it actually gets (pages evicted meanwhile, preemption) and asks for any
// earlier items then.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "engine/metrics.h"
#include "dist/inprocess_communicator.h"
#include "base/rank_workers.h"
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
  // Ranks (--data-parallel-size). > 1: CPU backend only for now; each rank gets the page count of the executor
  // the engine is built with.
  int data_parallel_size = 1;
  // --enable-expert-parallel: with data_parallel_size > 1, routed expert e runs on rank e mod P and the MoE layers
  // exchange rows through an in-process group (model/expert_parallel.h); without it every rank runs every expert.
  bool enable_expert_parallel = false;
};

class Engine {
 public:
  // Runs on the CPU reference backend with an executor of cfg.num_pages pages.
  Engine(const M3Model& model, EngineConfig cfg);
  // Runs on any executor (e.g. CUDA); the page count is the executor's. With data_parallel_size > 1 the executor
  // must be a CpuExecutor: it becomes rank 0 and the engine builds the other ranks over the same model (throws
  // m3::Error naming the unsupported combination otherwise).
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
  ModelExecutor& executor() { return *ranks_[0].exec; }
  int data_parallel_size() const { return int(ranks_.size()); }
  ModelExecutor& executor(int rank) { return *ranks_[size_t(rank)].exec; }
  // Rank r's scheduler (its pool and prefix cache). Like step(): engine thread only, or no thread running.
  const Scheduler& scheduler(int rank) const { return *ranks_[size_t(rank)].sched; }
  // The rank holding a running or waiting request, −1 when none does (engine thread only, or no thread running).
  int rank_of(const std::string& request_id) const;
  int64_t max_model_len() const { return cfg_.max_model_len; }
  EngineMetrics metrics() const;  // thread-safe snapshot

  // Runs one scheduling step on the calling thread (tests drive the engine without its thread). Returns false
  // when there was nothing to do and no media features are awaited (while they are, it returns true at once).
  bool step();

 private:
  struct Rank {
    std::unique_ptr<ModelExecutor> owned;  // null for the executor passed in (rank 0)
    ModelExecutor* exec = nullptr;
    std::unique_ptr<Scheduler> sched;      // declared after `owned`: gives its pages back first
    std::vector<uint32_t> masks;           // this step's grammar masks [constrained rows, words]
  };
  struct RankStep;  // one rank's share of a step (engine.cpp)
  // Media features on demand (EngineRequest::media_encoder): an encoder's answer, queued by its thread.
  struct MediaResult {
    uint64_t arrival = 0;  // the sequence's
    size_t first = 0;      // items [first, the sequence's media_first) were asked for
    std::shared_ptr<const std::vector<float>> features;
    std::string error;
  };
  struct MediaPost;  // what the encoders' callbacks hold: the engine while it lives (engine.cpp)
  struct MediaWait {
    int rank = 0;
    Sequence* seq = nullptr;  // held, in that rank's waiting queue
    size_t first = 0;
  };

  Engine(std::unique_ptr<ModelExecutor> owned, ModelExecutor* executor, EngineConfig cfg);
  void loop();
  bool has_work() const;
  // The rank a new sequence goes to: longest cached prefix, then fewest sequences, then fewest tokens.
  int place(const Sequence& s) const;
  void prepare(Rank& rank, RankStep& st);
  void run(std::vector<RankStep>& st);
  // Applies rank r's sampled tokens, updates its scheduler and collects its output events.
  void apply(Rank& rank, RankStep& st, std::vector<std::pair<Sequence*, EngineOutput>>& events);
  void drain_inbox();
  // Sends a sequence's final event (no new tokens) and counts it.
  void finish(Sequence& s, const std::string& error = {});
  void publish_state();  // running/waiting/page gauges for metrics()
  // The media embedding rows of the prompt slot tokens among the next `n` tokens of `s` (engine.cpp).
  std::span<const float> media_rows(const Sequence& s, int64_t n) const;
  // The first media item with a slot token at or after position `computed` of the prompt (items before it lie
  // entirely in the computed prefix); the item count when none.
  size_t first_needed_item(const Sequence& s, int64_t computed) const;
  // Rank r's admission check: true when s has the features of every item it will prefill from s.computed;
  // otherwise asks the encoder for the missing ones and returns false (the scheduler holds s).
  bool media_ready(Sequence& s, int rank);
  // Asks s's encoder for items [first, s.media_first) and holds s until they come back.
  void request_media(Sequence& s, int rank, size_t first);
  void post_media(MediaResult r);  // any thread
  void apply_media_results();      // engine thread, from drain_inbox

  EngineConfig cfg_;
  std::unique_ptr<dist::InProcessGroup> group_;  // expert-parallel collectives; outlives the ranks' executors
  std::vector<Rank> ranks_;
  std::unique_ptr<RankWorkers> workers_;  // ranks 1 … P−1 of a step (P > 1); destroyed before the ranks
  ModelExecutor* exec_ = nullptr;  // rank 0's: config, vocabulary

  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::pair<EngineRequest, OutputSink>> inbox_;
  std::vector<std::string> abort_inbox_;
  std::vector<MediaResult> media_inbox_;
  bool stop_ = false;
  std::thread thread_;

  // Owned by the engine thread (or by step() callers when no thread runs); so are ranks_' schedulers.
  uint64_t arrival_counter_ = 0;
  std::unordered_map<uint64_t, MediaWait> media_waits_;  // by arrival: sequences held for their media features
  std::shared_ptr<MediaPost> media_post_;

  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
};

}  // namespace m3
