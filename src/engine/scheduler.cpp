#include "engine/scheduler.h"

#include <algorithm>

#include "base/error.h"

namespace m3 {

namespace {

// Requests of a lower priority value run first; FCFS within a priority. The last in this order is preempted first.
bool runs_before(const Sequence& a, const Sequence& b) {
  return a.req.priority != b.req.priority ? a.req.priority < b.req.priority : a.arrival < b.arrival;
}

}  // namespace

int StepPlan::num_sampled() const {
  return int(std::count_if(rows.begin(), rows.end(), [](const ScheduledRow& r) { return r.samples; }));
}

Scheduler::Scheduler(PagePool& pool, SchedulerConfig cfg)
    : pool_(pool), cfg_(cfg), prefix_(pool, cfg.block_size, cfg.enable_prefix_caching) {
  M3_CHECK(cfg_.block_size >= 1, "scheduler: block_size must be at least 1");
  M3_CHECK(cfg_.max_num_seqs >= 1, "max_num_seqs must be at least 1");
  M3_CHECK(cfg_.max_num_batched_tokens >= 1, "max_num_batched_tokens must be at least 1");
}

Scheduler::~Scheduler() {
  for (auto& s : running_) free_pages(*s, false);
  for (auto& s : waiting_) free_pages(*s, false);
}

bool Scheduler::has_work() const {
  return !running_.empty() || std::any_of(waiting_.begin(), waiting_.end(), [](const auto& w) { return !w->held; });
}

std::unique_ptr<Sequence> Scheduler::remove_waiting(const Sequence* s) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w.get() == s; });
  if (it == waiting_.end()) return nullptr;
  std::unique_ptr<Sequence> out = std::move(*it);
  waiting_.erase(it);
  free_pages(*out, false);
  return out;
}

void Scheduler::add(std::unique_ptr<Sequence> s) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return runs_before(*s, *w); });
  waiting_.insert(it, std::move(s));
}

std::vector<std::unique_ptr<Sequence>> Scheduler::abort(const std::unordered_set<std::string>& ids) {
  std::vector<std::unique_ptr<Sequence>> out;
  auto drop = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if (ids.count((*it)->req.id)) {
        free_pages(**it, true);
        (*it)->finish = FinishReason::Abort;
        out.push_back(std::move(*it));
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop(running_);
  drop(waiting_);
  return out;
}

int64_t Scheduler::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : running_) n += int64_t(s->tokens.size());
  for (const auto& s : waiting_) n += int64_t(s->tokens.size());
  return n;
}

bool Scheduler::holds(const std::string& request_id) const {
  auto is = [&](const auto& s) { return s->req.id == request_id; };
  return std::any_of(running_.begin(), running_.end(), is) || std::any_of(waiting_.begin(), waiting_.end(), is);
}

std::vector<std::unique_ptr<Sequence>> Scheduler::abort_all() {
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto& s : running_) out.push_back(std::move(s));
  for (auto& s : waiting_) out.push_back(std::move(s));
  running_.clear();
  waiting_.clear();
  for (auto& s : out) {
    free_pages(*s, true);
    s->finish = FinishReason::Abort;
  }
  return out;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::fail_running() {
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto& s : running_) {
    free_pages(*s, false);
    s->finish = FinishReason::Error;
    out.push_back(std::move(s));
  }
  running_.clear();
  return out;
}

bool Scheduler::ensure_pages(Sequence& s, int64_t tokens) {
  while (int64_t(s.pages.size()) * cfg_.block_size < tokens) {
    auto p = prefix_.alloc();
    if (!p) return false;
    s.pages.push_back(*p);
  }
  return true;
}

void Scheduler::register_full_pages(Sequence& s) {
  const int64_t full = s.computed / cfg_.block_size;
  for (int64_t i = s.registered; i < full; ++i) prefix_.insert(s.tokens, int(i), s.pages[size_t(i)], 0, s.req.media);
  s.registered = int(std::max<int64_t>(s.registered, full));
}

void Scheduler::free_pages(Sequence& s, bool cache_full_pages) {
  if (cache_full_pages) register_full_pages(s);
  for (int32_t p : s.pages) pool_.release(p);
  s.pages.clear();
  s.registered = 0;
}

void Scheduler::preempt_one(ScheduleStats& stats) {
  // Victim: the least important, newest running sequence. Its full pages stay in the prefix cache, so the
  // recompute is mostly cache hits when it comes back.
  auto victim = std::max_element(running_.begin(), running_.end(),
                                 [](const auto& a, const auto& b) { return runs_before(*a, *b); });
  std::unique_ptr<Sequence> s = std::move(*victim);
  running_.erase(victim);
  free_pages(*s, true);
  s->computed = 0;
  waiting_.push_front(std::move(s));
  ++stats.preemptions;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  if (!has_work()) return plan;
  const int64_t B = cfg_.block_size;
  int64_t budget = cfg_.max_num_batched_tokens;
  auto take = [&](Sequence& s, int64_t n) {
    plan.rows.push_back(ScheduledRow{&s, n, s.computed + n == int64_t(s.tokens.size())});
    budget -= n;
  };

  // 1. Decode rows first (one token each). Every decoding sequence needs room for one more token; when the pool
  //    cannot provide it, preempt the least important sequence and try again.
  auto decoding = [](const Sequence& s) { return s.pending() == 1; };
  for (bool retry = true; retry;) {
    retry = false;
    for (auto& r : running_)
      if (decoding(*r) && !ensure_pages(*r, r->computed + 1)) {
        preempt_one(plan.stats);
        retry = true;
        break;
      }
  }
  for (auto& r : running_)
    if (decoding(*r) && budget > 0) take(*r, 1);

  // 2. Continue chunked prefills of running sequences.
  for (auto& r : running_) {
    if (budget <= 0) break;
    Sequence& s = *r;
    if (s.pending() <= 1) continue;
    const int64_t n = std::min(s.pending(), budget);
    if (!ensure_pages(s, s.computed + n)) continue;  // try again next step (decodes may finish)
    take(s, n);
  }

  // 3. Admit waiting sequences while budget, sequence slots and pages allow; held ones are skipped.
  for (size_t w = 0; budget > 0 && w < waiting_.size() && int(running_.size()) < cfg_.max_num_seqs;) {
    Sequence& s = *waiting_[w];
    if (s.held) {
      ++w;
      continue;
    }
    if (s.pages.empty() && s.computed == 0) {
      std::vector<int32_t> hit = prefix_.match(s.tokens, 0, s.req.media);
      s.pages = hit;
      s.registered = int(hit.size());
      s.computed = int64_t(hit.size()) * B;
      if (admit_check_ && !admit_check_(s)) {
        // Not yet (its media features are being made): give the match back; the next attempt matches again.
        free_pages(s, false);
        s.computed = 0;
        s.held = true;
        ++w;
        continue;
      }
      if (s.cached_tokens < 0) {
        s.cached_tokens = int(s.computed);
        plan.stats.prompt_tokens += uint64_t(s.prompt_len);
        if (prefix_.enabled()) {
          plan.stats.prefix_query_tokens += uint64_t(s.prompt_len);
          plan.stats.prefix_hit_tokens += uint64_t(s.computed);
        }
      }
    }
    const int64_t n = std::min(s.pending(), budget);
    if (!ensure_pages(s, s.computed + n)) {
      // Not enough pages now: give back what was taken and wait for running requests to finish.
      free_pages(s, false);
      s.computed = 0;
      break;
    }
    take(s, n);
    running_.push_back(std::move(waiting_[w]));
    waiting_.erase(waiting_.begin() + ptrdiff_t(w));
  }
  if (plan.rows.empty() && has_work()) {
    // Nothing fits. With nothing running, only cached pages can hold the pool: evict them. With requests running
    // but none able to grow (their prefills all wait for pages), make room by preempting one — otherwise no step
    // would ever free a page. (Held sequences wait for something else: they never cost the cache its pages.)
    if (running_.empty())
      prefix_.evict_all_unreferenced();
    else
      preempt_one(plan.stats);
  }
  return plan;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::update(const StepPlan& plan, std::span<const int32_t> sampled) {
  M3_CHECK(int(sampled.size()) == plan.num_sampled(), "scheduler update: {} sampled tokens for {} sampling rows",
           sampled.size(), plan.num_sampled());
  std::vector<Sequence*> done;
  size_t next = 0;
  for (const ScheduledRow& row : plan.rows) {
    Sequence& s = *row.seq;
    s.computed += row.num_tokens;
    register_full_pages(s);
    if (!row.samples) continue;  // prefill not finished yet
    const int32_t tok = sampled[next++];
    if (s.finish == FinishReason::Error) {  // the engine refused this row's token (grammar): no token, done
      free_pages(s, false);
      done.push_back(&s);
      continue;
    }
    const GenerationParams& p = s.req.params;
    s.tokens.push_back(tok);
    ++s.generated;
    const bool is_stop_id =
        (!p.ignore_eos && tok == cfg_.eos_token_id) ||
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
    if (is_stop_id && s.generated >= p.min_tokens)
      s.finish = FinishReason::Stop;
    else if (s.generated >= p.max_tokens || int64_t(s.tokens.size()) >= cfg_.max_model_len)
      s.finish = FinishReason::Length;
    if (s.finish != FinishReason::None) {
      free_pages(s, true);
      done.push_back(&s);
    }
  }
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto& r : running_)
    if (std::find(done.begin(), done.end(), r.get()) != done.end()) out.push_back(std::move(r));
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  return out;
}

}  // namespace m3
