// The scheduler without a model: fake sequences over a bare page pool. Admission order, chunked prefill, decode
// rows first, prefix hits, preemption under page pressure, abort in every state, stop checks, and the page
// invariants of docs/KV_CACHE.md (pages being written are never shared; every page returns however a sequence
// ends).
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "base/error.h"
#include "engine/scheduler.h"

namespace m3 {
namespace {

constexpr int kB = 4;  // tokens per page

std::unique_ptr<Sequence> seq(const std::string& id, int prompt_len, int max_tokens, uint64_t order,
                              int first_token = 1, int priority = 0) {
  EngineRequest r;
  r.id = id;
  r.prompt.resize(size_t(prompt_len));
  std::iota(r.prompt.begin(), r.prompt.end(), first_token);
  r.params.max_tokens = max_tokens;
  r.priority = priority;
  return std::make_unique<Sequence>(std::move(r), order);
}

SchedulerConfig config(int budget, int max_seqs = 8) {
  SchedulerConfig c;
  c.block_size = kB;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = 1000;
  c.eos_token_id = 0;
  return c;
}

// Checks invariant 2 on a plan: the pages a row writes belong to its sequence alone (not shared, not cached).
void expect_writes_unshared(const StepPlan& plan, const PagePool& pool) {
  for (const ScheduledRow& r : plan.rows) {
    const Sequence& s = *r.seq;
    ASSERT_GE(int64_t(s.pages.size()) * kB, s.computed + r.num_tokens) << s.req.id;
    for (int64_t b = s.computed / kB; b <= (s.computed + r.num_tokens - 1) / kB; ++b)
      EXPECT_EQ(pool.refcount(s.pages[size_t(b)]), 1) << s.req.id << " writes into shared page " << b;
  }
}

// Runs steps until idle, sampling token 7 (never a stop id) for every sampling row; returns the finished ids in
// order and the number of preemptions.
struct RunResult {
  std::vector<std::string> finished;
  std::map<std::string, std::pair<FinishReason, int>> how;  // id → (reason, generated tokens)
  uint64_t preemptions = 0;
  int steps = 0;
};
RunResult run_to_end(Scheduler& s, const PagePool& pool) {
  RunResult out;
  while (s.has_work()) {
    StepPlan plan = s.schedule();
    out.preemptions += plan.stats.preemptions;
    expect_writes_unshared(plan, pool);
    std::vector<int32_t> toks(size_t(plan.num_sampled()), 7);
    for (auto& f : s.update(plan, toks)) {
      out.finished.push_back(f->req.id);
      out.how[f->req.id] = {f->finish, f->generated};
    }
    if (++out.steps > 10000) ADD_FAILURE() << "no progress";
    if (out.steps > 10000) break;
  }
  return out;
}

// Runs `n` steps, sampling token 7 for every sampling row.
void run_steps(Scheduler& s, int n) {
  for (int i = 0; i < n; ++i) {
    StepPlan plan = s.schedule();
    std::vector<int32_t> toks(size_t(plan.num_sampled()), 7);
    s.update(plan, toks);
  }
}

// After an abort: every sequence is marked Abort and holds no page, nothing is left to schedule, and only the
// prefix cache still holds pages, none referenced by anyone else.
void expect_aborted_with_pages_back(const std::vector<std::unique_ptr<Sequence>>& out, const Scheduler& s,
                                    const PagePool& pool) {
  for (auto& q : out) {
    EXPECT_EQ(q->finish, FinishReason::Abort) << q->req.id;
    EXPECT_TRUE(q->pages.empty()) << q->req.id;
  }
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(pool.num_used(), s.prefix_cache().num_cached());
  EXPECT_EQ(s.prefix_cache().num_evictable(), s.prefix_cache().num_cached());
}

TEST(Scheduler, AdmitsInPriorityThenArrivalOrder) {
  PagePool pool(64);
  Scheduler s(pool, config(100));
  s.add(seq("late", 5, 1, 2));
  s.add(seq("early", 5, 1, 1));
  s.add(seq("urgent", 5, 1, 3, 1, /*priority=*/-1));
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.rows.size(), 3u);
  EXPECT_EQ(plan.rows[0].seq->req.id, "urgent");
  EXPECT_EQ(plan.rows[1].seq->req.id, "early");
  EXPECT_EQ(plan.rows[2].seq->req.id, "late");
  EXPECT_EQ(plan.stats.prompt_tokens, 15u);
  EXPECT_EQ(s.num_running(), 3);
}

TEST(Scheduler, ChunksAPrefillUnderTheTokenBudgetAndSamplesOnlyAtItsEnd) {
  PagePool pool(64);
  Scheduler s(pool, config(8));
  s.add(seq("a", 20, 2, 0));
  std::vector<int64_t> chunks;
  std::vector<bool> samples;
  for (int i = 0; i < 3; ++i) {
    StepPlan plan = s.schedule();
    ASSERT_EQ(plan.rows.size(), 1u);
    chunks.push_back(plan.rows[0].num_tokens);
    samples.push_back(plan.rows[0].samples);
    std::vector<int32_t> toks(size_t(plan.num_sampled()), 7);
    EXPECT_TRUE(s.update(plan, toks).empty());
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{8, 8, 4}));
  EXPECT_EQ(samples, (std::vector<bool>{false, false, true}));
}

TEST(Scheduler, PutsDecodeRowsBeforeNewPrefills) {
  PagePool pool(64);
  Scheduler s(pool, config(100));
  s.add(seq("a", 6, 5, 0));
  StepPlan p1 = s.schedule();
  std::vector<int32_t> t1{7};
  s.update(p1, t1);
  s.add(seq("b", 6, 5, 1, 100));
  StepPlan p2 = s.schedule();
  ASSERT_EQ(p2.rows.size(), 2u);
  EXPECT_EQ(p2.rows[0].seq->req.id, "a");
  EXPECT_EQ(p2.rows[0].num_tokens, 1);
  EXPECT_EQ(p2.rows[1].seq->req.id, "b");
  EXPECT_EQ(p2.rows[1].num_tokens, 6);
}

// A running chunked prefill that could fill the whole budget still leaves one token for every decoding sequence:
// decodes are scheduled before prefill chunks, so a long prompt never stalls streams that are already generating.
TEST(Scheduler, ARunningChunkedPrefillDoesNotStarveDecodeRows) {
  PagePool pool(64);
  Scheduler s(pool, config(8));
  s.add(seq("short", 2, 5, 0));
  s.add(seq("long", 20, 5, 1, 100));
  StepPlan p1 = s.schedule();  // short: its 2 prompt tokens (samples); long: the first 6-token chunk
  ASSERT_EQ(p1.rows.size(), 2u);
  std::vector<int32_t> t1{7};
  s.update(p1, t1);
  StepPlan p2 = s.schedule();
  ASSERT_EQ(p2.rows.size(), 2u);
  EXPECT_EQ(p2.rows[0].seq->req.id, "short");
  EXPECT_EQ(p2.rows[0].num_tokens, 1);
  EXPECT_EQ(p2.rows[1].seq->req.id, "long");
  EXPECT_EQ(p2.rows[1].num_tokens, 7);
}

TEST(Scheduler, RespectsMaxNumSeqs) {
  PagePool pool(64);
  Scheduler s(pool, config(100, /*max_seqs=*/2));
  for (int i = 0; i < 3; ++i) s.add(seq("r" + std::to_string(i), 4, 3, uint64_t(i)));
  StepPlan plan = s.schedule();
  EXPECT_EQ(plan.rows.size(), 2u);
  EXPECT_EQ(s.num_waiting(), 1);
}

TEST(Scheduler, ASharedPromptPrefixIsServedFromTheCacheExceptTheLastToken) {
  PagePool pool(64);
  Scheduler s(pool, config(100));
  s.add(seq("a", 13, 1, 0));
  run_to_end(s, pool);
  EXPECT_EQ(pool.num_used(), 3);  // a's three full pages stay cached
  s.add(seq("b", 13, 1, 1));
  StepPlan plan = s.schedule();
  ASSERT_EQ(plan.rows.size(), 1u);
  EXPECT_EQ(plan.rows[0].seq->cached_tokens, 12);
  EXPECT_EQ(plan.rows[0].num_tokens, 1);
  EXPECT_EQ(plan.stats.prefix_hit_tokens, 12u);
  EXPECT_EQ(plan.stats.prefix_query_tokens, 13u);
  expect_writes_unshared(plan, pool);
  // A 12-token prompt matches only 2 pages: the page holding the last token is always recomputed.
  s.update(plan, std::vector<int32_t>{7});
  s.add(seq("c", 12, 1, 2));
  StepPlan pc = s.schedule();
  EXPECT_EQ(pc.rows[0].seq->cached_tokens, 8);
}

// The admission check (the engine's: media features still being made) holds a sequence: its prefix match is given
// back, later arrivals are admitted past it, a scheduler with only held sequences has no work and evicts nothing,
// and once the flag is cleared it is admitted with the cached prefix.
TEST(Scheduler, AHeldSequenceIsSkippedWithoutCostingTheCacheItsPagesAndRunsOnceReleased) {
  PagePool pool(8);
  Scheduler s(pool, config(100));
  s.add(seq("a", 13, 1, 0));
  run_to_end(s, pool);
  ASSERT_EQ(s.prefix_cache().num_cached(), 3);
  bool ready = false;
  int asked = 0;
  s.set_admit_check([&](Sequence& q) {
    if (q.req.id != "h") return true;
    ++asked;
    EXPECT_EQ(q.computed, 12) << "asked after the prefix match";
    return ready;
  });
  auto held = seq("h", 13, 1, 1);
  Sequence* h = held.get();
  s.add(std::move(held));
  s.add(seq("b", 5, 1, 2, 100));
  StepPlan p1 = s.schedule();
  ASSERT_EQ(p1.rows.size(), 1u);
  EXPECT_EQ(p1.rows[0].seq->req.id, "b") << "admitted past the held one";
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(h->held);
  EXPECT_TRUE(h->pages.empty());
  EXPECT_EQ(h->computed, 0);
  EXPECT_EQ(h->cached_tokens, -1) << "not admitted: not counted yet";
  s.update(p1, std::vector<int32_t>{7});
  EXPECT_FALSE(s.has_work()) << "only a held sequence left";
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_TRUE(s.schedule().rows.empty());
  EXPECT_EQ(asked, 1) << "a held sequence is not asked again";
  EXPECT_EQ(s.prefix_cache().num_cached(), 4) << "nothing evicted for it (a's 3 pages + b's 1)";
  EXPECT_EQ(pool.num_used(), s.prefix_cache().num_cached()) << "its match was given back";
  ready = true;
  EXPECT_TRUE(s.schedule().rows.empty()) << "still held until the flag is cleared";
  h->held = false;  // what the engine does when the features arrive
  EXPECT_TRUE(s.has_work());
  StepPlan p2 = s.schedule();
  ASSERT_EQ(p2.rows.size(), 1u);
  EXPECT_EQ(p2.rows[0].seq, h);
  EXPECT_EQ(h->cached_tokens, 12);
  EXPECT_EQ(p2.rows[0].num_tokens, 1);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(s.remove_waiting(h), nullptr) << "running, not waiting";
  s.update(p2, std::vector<int32_t>{7});
  // remove_waiting takes a held sequence out with its pages back (the engine, when its encoder fails).
  auto w = seq("w", 13, 1, 3);
  Sequence* wp = w.get();
  ready = false;
  s.set_admit_check([&](Sequence& q) { return q.req.id != "w"; });
  s.add(std::move(w));
  EXPECT_TRUE(s.schedule().rows.empty());
  auto out = s.remove_waiting(wp);
  ASSERT_EQ(out.get(), wp);
  EXPECT_TRUE(out->pages.empty());
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_EQ(pool.num_used(), s.prefix_cache().num_cached());
}

TEST(Scheduler, PreemptsTheNewestUnderPagePressureAndStillFinishesEverything) {
  PagePool pool(6);  // 24 tokens: two sequences growing to 16 tokens each cannot both fit
  SchedulerConfig c = config(100);
  c.enable_prefix_caching = false;
  Scheduler s(pool, c);
  s.add(seq("old", 4, 12, 0));
  s.add(seq("new", 4, 12, 1, 100));
  RunResult r = run_to_end(s, pool);
  EXPECT_GE(r.preemptions, 1u);
  EXPECT_EQ(r.finished.front(), "old");  // the newer one is the victim, the older one runs through
  EXPECT_EQ(r.finished.size(), 2u);
  EXPECT_EQ(pool.num_used(), 0);
}

TEST(Scheduler, APreemptedSequenceKeepsItsTokensAndRecomputesFromTheCache) {
  PagePool pool(7);  // both reach 3 pages; "old" takes the last free one, "new" must then be preempted
  Scheduler s(pool, config(100));
  s.add(seq("old", 4, 12, 0));
  s.add(seq("new", 4, 12, 1, 100));
  const Sequence* victim = nullptr;
  bool preempted = false;
  int64_t resumed_at = -1;
  int steps = 0;
  while (s.has_work()) {
    ASSERT_LT(++steps, 1000) << "no progress";
    StepPlan plan = s.schedule();
    for (auto& r : plan.rows)
      if (r.seq->req.id == "new") {
        if (!victim) victim = r.seq;
        if (preempted && resumed_at < 0) resumed_at = r.seq->computed;
      }
    if (plan.stats.preemptions) {
      preempted = true;
      ASSERT_NE(victim, nullptr);
      EXPECT_TRUE(victim->pages.empty());
      EXPECT_EQ(victim->computed, 0);
      EXPECT_EQ(int(victim->tokens.size()), 4 + victim->generated);  // prompt + generated survive
      EXPECT_GT(victim->generated, 0);
    }
    std::vector<int32_t> toks(size_t(plan.num_sampled()), 7);
    s.update(plan, toks);
  }
  EXPECT_EQ(resumed_at, 12);  // its three full pages came back from the prefix cache
}

TEST(Scheduler, AbortInEveryStateReturnsEveryPage) {
  PagePool pool(64);
  Scheduler s(pool, config(8, /*max_seqs=*/3));
  s.add(seq("decoding", 3, 50, 0));
  s.add(seq("prefilling", 30, 5, 1, 200));
  s.add(seq("admitted_later", 4, 5, 2, 400));
  s.add(seq("waiting", 4, 5, 3, 600));
  run_steps(s, 2);
  ASSERT_EQ(s.num_running(), 2);  // decoding + prefilling (its chunks use the budget)
  auto out = s.abort({"decoding", "prefilling", "waiting", "admitted_later", "unknown"});
  ASSERT_EQ(out.size(), 4u);
  expect_aborted_with_pages_back(out, s, pool);
}

// Engine shutdown aborts everything at once: running and waiting sequences all come back marked Abort, and only
// the prefix cache (unreferenced) still holds pages.
TEST(Scheduler, AbortAllReturnsEveryPageOfRunningAndWaitingSequences) {
  PagePool pool(64);
  Scheduler s(pool, config(8, /*max_seqs=*/2));
  s.add(seq("decoding", 3, 50, 0));
  s.add(seq("prefilling", 30, 5, 1, 200));
  s.add(seq("waiting", 4, 5, 2, 400));
  run_steps(s, 2);
  ASSERT_EQ(s.num_running(), 2);
  ASSERT_EQ(s.num_waiting(), 1);
  auto out = s.abort_all();
  ASSERT_EQ(out.size(), 3u);
  expect_aborted_with_pages_back(out, s, pool);
}

TEST(Scheduler, AbortOfAPreemptedSequenceAndFailureOfRunningOnesReturnPages) {
  PagePool pool(6);
  SchedulerConfig c = config(100);
  c.enable_prefix_caching = false;
  Scheduler s(pool, c);
  s.add(seq("old", 4, 12, 0));
  s.add(seq("new", 4, 12, 1, 100));
  int steps = 0;
  do {
    ASSERT_LT(++steps, 1000) << "no preemption";
    StepPlan plan = s.schedule();
    std::vector<int32_t> toks(size_t(plan.num_sampled()), 7);
    s.update(plan, toks);
  } while (s.num_waiting() == 0);
  ASSERT_EQ(s.num_running(), 1);
  auto aborted = s.abort({"new"});
  ASSERT_EQ(aborted.size(), 1u);
  auto failed = s.fail_running();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0]->finish, FinishReason::Error);
  EXPECT_EQ(pool.num_used(), 0);
}

TEST(Scheduler, StopsOnEosAfterMinTokensOnStopIdsAndOnLength) {
  PagePool pool(64);
  SchedulerConfig c = config(100);
  c.max_model_len = 10;
  Scheduler s(pool, c);
  auto a = seq("eos", 3, 10, 0);
  a->req.params.min_tokens = 2;
  auto b = seq("stop_id", 3, 10, 1);
  b->req.params.stop_token_ids = {5};
  s.add(std::move(a));
  s.add(std::move(b));
  std::map<std::string, FinishReason> why;
  std::map<std::string, int> gen;
  for (int step = 0; step < 5 && s.has_work(); ++step) {
    StepPlan plan = s.schedule();
    std::vector<int32_t> toks;
    for (auto& r : plan.rows)
      if (r.samples) toks.push_back(r.seq->req.id == "stop_id" ? 5 : 0);  // everyone else offers EOS (id 0)
    for (auto& f : s.update(plan, toks)) {
      why[f->req.id] = f->finish;
      gen[f->req.id] = f->generated;
    }
  }
  EXPECT_EQ(why["eos"], FinishReason::Stop);
  EXPECT_EQ(gen["eos"], 2);  // EOS before min_tokens does not stop
  EXPECT_EQ(why["stop_id"], FinishReason::Stop);
  EXPECT_EQ(gen["stop_id"], 1);
  EXPECT_EQ(pool.num_used(), s.prefix_cache().num_cached());
}

TEST(Scheduler, EndsAtMaxTokensOrMaxModelLen) {
  PagePool pool(64);
  SchedulerConfig c = config(100);
  c.max_model_len = 10;
  Scheduler s(pool, c);
  s.add(seq("len", 3, 2, 0));
  s.add(seq("ctx", 8, 100, 1));
  RunResult r = run_to_end(s, pool);
  ASSERT_EQ(r.finished.size(), 2u);
  EXPECT_EQ(r.how["len"], std::make_pair(FinishReason::Length, 2));
  EXPECT_EQ(r.how["ctx"], std::make_pair(FinishReason::Length, 2));  // 8 + 2 = max_model_len
  EXPECT_EQ(pool.num_used(), s.prefix_cache().num_cached());
}

TEST(Scheduler, UpdateRejectsAWrongNumberOfSampledTokens) {
  PagePool pool(64);
  Scheduler s(pool, config(100));
  s.add(seq("a", 4, 3, 0));
  StepPlan plan = s.schedule();
  EXPECT_THROW(s.update(plan, std::vector<int32_t>{}), Error);
}

TEST(Scheduler, WithNothingRunningAFullCacheIsEvictedToAdmit) {
  PagePool pool(4);
  Scheduler s(pool, config(100));
  s.add(seq("a", 13, 1, 0));  // 4 pages, 3 of them cached afterwards
  run_to_end(s, pool);
  EXPECT_EQ(pool.num_free(), 1);
  s.add(seq("b", 13, 1, 1, 500));  // different tokens: needs 4 fresh pages
  RunResult r = run_to_end(s, pool);
  EXPECT_EQ(r.finished, (std::vector<std::string>{"b"}));
}

}  // namespace
}  // namespace m3
