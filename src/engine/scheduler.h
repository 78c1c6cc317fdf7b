// The scheduler decides what one engine step computes and keeps the page accounting; it never touches a tensor.
//   schedule() → StepPlan: decode rows first (one token each), then running chunked prefills, then admissions
//                (prefix-cache match first, then the owner's admission check: a refused sequence is held and
//                skipped) under the token budget, max_num_seqs and the free pages. When a
//                decoding sequence cannot get a page, the least important, newest running sequence is preempted by
//                recompute (its full pages stay in the prefix cache) and requeued.
//   update(plan, sampled) → the sequences that finished: advances `computed`, offers newly full pages to the
//                prefix cache, appends the sampled tokens, checks stop ids / max_tokens / max_model_len, and
//                releases finished sequences' pages.
// Invariants it keeps are listed in docs/KV_CACHE.md; tests/engine/scheduler_test.cpp drives it without a model.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/sequence.h"
#include "kv/page_pool.h"
#include "kv/prefix_cache.h"

namespace m3 {

struct SchedulerConfig {
  int block_size = 16;                // tokens per page (the model's sparse_block_size)
  int max_num_seqs = 64;              // running sequences at most
  int max_num_batched_tokens = 2048;  // tokens per step (decode rows + prefill chunk tokens)
  int64_t max_model_len = 0;          // prompt + generated, at most
  bool enable_prefix_caching = true;
  int32_t eos_token_id = -1;          // −1: none
};

// One sequence's share of a step: `num_tokens` new tokens starting at seq->computed. `samples` is true when the
// row reaches the end of the sequence's tokens, so its last logits row yields the next token.
struct ScheduledRow {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;
  bool samples = false;
};

// Counters of one schedule() call, folded into the engine metrics once per step.
struct ScheduleStats {
  uint64_t preemptions = 0;
  uint64_t prompt_tokens = 0;        // prompts admitted for the first time
  uint64_t prefix_query_tokens = 0;  // of those, looked up in the prefix cache
  uint64_t prefix_hit_tokens = 0;    // served from it
};

struct StepPlan {
  std::vector<ScheduledRow> rows;  // decode rows first, then prefill chunks, in scheduling order
  ScheduleStats stats;
  int num_sampled() const;
};

class Scheduler {
 public:
  Scheduler(PagePool& pool, SchedulerConfig cfg);
  ~Scheduler();  // releases the pages of every sequence still held

  const SchedulerConfig& config() const { return cfg_; }
  // Asked at every admission attempt, after the prefix-cache match has set s.computed: whether the sequence can
  // prefill from there now. When it returns false the match is given back and the sequence is held
  // (Sequence::held: skipped, not work) until its owner clears the flag. The engine's check asks for the media
  // features the uncached part needs (engine.cpp). Unset: every sequence can.
  using AdmitCheck = std::function<bool(Sequence&)>;
  void set_admit_check(AdmitCheck check) { admit_check_ = std::move(check); }
  // Queues a sequence, ordered by (priority, arrival).
  void add(std::unique_ptr<Sequence> s);
  // Takes a waiting sequence out of the queue (pages released without caching); null when it is not waiting.
  std::unique_ptr<Sequence> remove_waiting(const Sequence* s);
  // Removes the sequences whose request id is in `ids` (running first, then waiting), releases their pages (full
  // computed pages stay in the prefix cache) and returns them with finish = Abort.
  std::vector<std::unique_ptr<Sequence>> abort(const std::unordered_set<std::string>& ids);
  // Every sequence, finish = Abort, pages released (engine shutdown).
  std::vector<std::unique_ptr<Sequence>> abort_all();
  // The running sequences, finish = Error, pages released without caching (their step failed).
  std::vector<std::unique_ptr<Sequence>> fail_running();

  // Plans one step. An empty plan means nothing fits now; it has already made room (evicted cached pages when
  // nothing runs, preempted a sequence otherwise), so the next call makes progress.
  StepPlan schedule();
  // Applies a computed step. `sampled` holds one token per row with samples = true, in row order. Returns the
  // sequences that finished (finish = Stop or Length), their pages released; the plan's pointers to them stay
  // valid while the caller holds them.
  std::vector<std::unique_ptr<Sequence>> update(const StepPlan& plan, std::span<const int32_t> sampled);

  // Running sequences, or waiting ones not held.
  bool has_work() const;
  int num_running() const { return int(running_.size()); }
  int num_waiting() const { return int(waiting_.size()); }
  // Tokens (prompt + generated) of every running and waiting sequence: the data-parallel engine's load measure.
  int64_t num_tokens() const;
  // Whether a running or waiting sequence has this request id.
  bool holds(const std::string& request_id) const;
  const PrefixCache& prefix_cache() const { return prefix_; }
  const PagePool& pool() const { return pool_; }

 private:
  bool ensure_pages(Sequence& s, int64_t tokens);
  // The one place a sequence gives its page references back (docs/KV_CACHE.md invariant 3).
  void free_pages(Sequence& s, bool cache_full_pages);
  void preempt_one(ScheduleStats& stats);
  void register_full_pages(Sequence& s);

  PagePool& pool_;
  SchedulerConfig cfg_;
  PrefixCache prefix_;
  AdmitCheck admit_check_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
};

}  // namespace m3
