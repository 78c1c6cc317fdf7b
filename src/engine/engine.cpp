#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <unordered_set>

#include "base/error.h"

namespace m3 {

using Clock = std::chrono::steady_clock;

int32_t default_cpu_pages(const M3Config& c) {
  // Without an explicit size: room for 8 full-length sequences of at most 4096 tokens.
  const int64_t len = std::min<int64_t>(c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096, 4096);
  return int32_t(8 * ((len + c.sparse_block_size - 1) / c.sparse_block_size));
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
    default: return "";
  }
}

void GenerationParams::validate(int vocab_size) const {
  sampling.validate();
  M3_CHECK(max_tokens >= 1, "max_tokens must be at least 1, got {}", max_tokens);
  M3_CHECK(min_tokens >= 0 && min_tokens <= max_tokens, "min_tokens must be in [0, max_tokens], got {}", min_tokens);
  M3_CHECK(std::isfinite(presence_penalty) && presence_penalty >= -2.f && presence_penalty <= 2.f,
           "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  M3_CHECK(std::isfinite(frequency_penalty) && frequency_penalty >= -2.f && frequency_penalty <= 2.f,
           "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  M3_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.f && repetition_penalty <= 2.f,
           "repetition_penalty must be in (0, 2], got {}", repetition_penalty);
  M3_CHECK(top_logprobs >= -1 && top_logprobs <= 20, "top_logprobs must be in [0, 20], got {}", top_logprobs);
  for (int32_t id : stop_token_ids)
    M3_CHECK(id >= 0 && id < vocab_size, "stop_token_ids: {} is outside the vocabulary [0, {})", id, vocab_size);
  for (auto [id, bias] : logit_bias) {
    M3_CHECK(id >= 0 && id < vocab_size, "logit_bias: token {} is outside the vocabulary [0, {})", id, vocab_size);
    M3_CHECK(std::isfinite(bias) && bias >= -100.f && bias <= 100.f, "logit_bias: value {} must be in [-100, 100]",
             bias);
  }
}

struct Engine::Sequence {
  EngineRequest req;
  OutputSink sink;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int prompt_len = 0;
  int generated = 0;
  std::vector<int32_t> pages;
  int64_t computed = 0;     // tokens whose K/V/index-K are in the pages
  int registered = 0;       // leading pages already offered to the prefix cache
  int cached_tokens = -1;   // prefix-cache hit at first admission (−1: not admitted yet)
  uint64_t arrival = 0;
  Clock::time_point t_arrival, t_last;
  bool first_token_sent = false;
  Sampler sampler;

  Sequence(EngineRequest r, OutputSink s, uint64_t order)
      : req(std::move(r)), sink(std::move(s)), arrival(order), t_arrival(Clock::now()),
        sampler(req.params.sampling, req.params.choice_index) {
    tokens = req.prompt;
    prompt_len = int(tokens.size());
  }
};

namespace {

// Later requests of a higher priority value (= less important) and newer arrival are preempted first.
bool runs_before(const EngineRequest& a, uint64_t arr_a, const EngineRequest& b, uint64_t arr_b) {
  return a.priority != b.priority ? a.priority < b.priority : arr_a < arr_b;
}

}  // namespace

namespace {

EngineConfig resolve_config(const M3Config& c, EngineConfig cfg, int32_t num_pages) {
  cfg.num_pages = num_pages;
  const int64_t capacity = int64_t(num_pages) * c.sparse_block_size;
  if (cfg.max_model_len <= 0) cfg.max_model_len = c.max_position_embeddings > 0 ? c.max_position_embeddings : capacity;
  if (c.max_position_embeddings > 0) cfg.max_model_len = std::min(cfg.max_model_len, c.max_position_embeddings);
  // One sequence must always fit, or preemption could never make progress.
  cfg.max_model_len = std::min(cfg.max_model_len, capacity);
  M3_CHECK(cfg.max_num_seqs >= 1, "max_num_seqs must be at least 1");
  M3_CHECK(cfg.max_num_batched_tokens >= 1, "max_num_batched_tokens must be at least 1");
  return cfg;
}

}  // namespace

Engine::Engine(const M3Model& model, EngineConfig cfg)
    : owned_executor_(std::make_unique<CpuExecutor>(
          model, cfg.num_pages > 0 ? cfg.num_pages : default_cpu_pages(model.config()))),
      exec_(*owned_executor_),
      cfg_(resolve_config(model.config(), cfg, exec_.pool().capacity())),
      prefix_(exec_.pool(), model.config().sparse_block_size, cfg_.enable_prefix_caching) {
  metrics_.pages_total = cfg_.num_pages;
  metrics_.pages_free = cfg_.num_pages;
}

Engine::Engine(ModelExecutor& executor, EngineConfig cfg)
    : exec_(executor),
      cfg_(resolve_config(executor.config(), cfg, executor.pool().capacity())),
      prefix_(exec_.pool(), executor.config().sparse_block_size, cfg_.enable_prefix_caching) {
  metrics_.pages_total = cfg_.num_pages;
  metrics_.pages_free = exec_.pool().num_free();
}

Engine::~Engine() {
  stop();
  for (auto& s : running_) finish(*s, FinishReason::Abort);
  for (auto& s : waiting_) finish(*s, FinishReason::Abort);
  for (auto& [req, sink] : inbox_) {
    EngineOutput o;
    o.finish = FinishReason::Abort;
    sink(o);
  }
}

void Engine::start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::submit(EngineRequest req, OutputSink sink) {
  const M3Config& c = exec_.config();
  M3_CHECK(!req.prompt.empty(), "the prompt is empty");
  for (int32_t id : req.prompt)
    M3_CHECK(id >= 0 && id < c.vocab_size, "prompt token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
  req.params.validate(c.vocab_size);
  const int64_t need = int64_t(req.prompt.size()) + req.params.max_tokens;
  M3_CHECK(need <= cfg_.max_model_len,
           "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} "
           "for the completion). Please reduce the prompt or max_tokens.",
           cfg_.max_model_len, need, req.prompt.size(), req.params.max_tokens);
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    inbox_.emplace_back(std::move(req), std::move(sink));
  }
  inbox_cv_.notify_one();
}

void Engine::abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    abort_inbox_.push_back(id);
  }
  inbox_cv_.notify_one();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  return metrics_;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(inbox_mu_);
      inbox_cv_.wait(lk, [&] {
        return stop_ || !inbox_.empty() || !abort_inbox_.empty() || !running_.empty() || !waiting_.empty();
      });
      if (stop_) return;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failing step must not take the server down: fail the requests of this batch, keep serving.
      for (auto& s : running_) finish(*s, FinishReason::Error, e.what());
      running_.clear();
    }
  }
}

void Engine::drain_inbox() {
  std::vector<std::pair<EngineRequest, OutputSink>> reqs;
  std::vector<std::string> aborts;
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    reqs.swap(inbox_);
    aborts.swap(abort_inbox_);
  }
  for (auto& [req, sink] : reqs) {
    auto s = std::make_unique<Sequence>(std::move(req), std::move(sink), arrival_counter_++);
    // Keep the waiting queue ordered by (priority, arrival).
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) {
      return runs_before(s->req, s->arrival, w->req, w->arrival);
    });
    waiting_.insert(it, std::move(s));
  }
  if (aborts.empty()) return;
  std::unordered_set<std::string> ids(aborts.begin(), aborts.end());
  auto drop = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if (ids.count((*it)->req.id)) {
        finish(**it, FinishReason::Abort);
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop(running_);
  drop(waiting_);
}

void Engine::free_pages(Sequence& s, bool cache_full_pages) {
  const int64_t B = exec_.config().sparse_block_size;
  if (cache_full_pages) {
    const int64_t full = s.computed / B;
    for (int64_t i = s.registered; i < full; ++i) prefix_.insert(s.tokens, int(i), s.pages[i]);
  }
  for (int32_t p : s.pages) exec_.pool().release(p);
  s.pages.clear();
  s.registered = 0;
}

void Engine::finish(Sequence& s, FinishReason why, const std::string& error) {
  free_pages(s, why != FinishReason::Error);
  EngineOutput o;
  o.finish = why;
  o.error = error;
  o.prompt_tokens = s.prompt_len;
  o.cached_tokens = std::max(0, s.cached_tokens);
  o.completion_tokens = s.generated;
  {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    switch (why) {
      case FinishReason::Stop: ++metrics_.requests_stop; break;
      case FinishReason::Length: ++metrics_.requests_length; break;
      case FinishReason::Abort: ++metrics_.requests_abort; break;
      default: ++metrics_.requests_error; break;
    }
    metrics_.e2e.observe(std::chrono::duration<double>(Clock::now() - s.t_arrival).count());
  }
  if (s.sink) s.sink(o);
}

bool Engine::ensure_pages(Sequence& s, int64_t tokens) {
  const int64_t B = exec_.config().sparse_block_size;
  while (int64_t(s.pages.size()) * B < tokens) {
    auto p = prefix_.alloc();
    if (!p) return false;
    s.pages.push_back(*p);
  }
  return true;
}

void Engine::preempt_one() {
  // Victim: the least important, newest running sequence. Its full pages stay in the prefix cache, so the
  // recompute is mostly cache hits when it comes back.
  auto victim = std::max_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
    return runs_before(a->req, a->arrival, b->req, b->arrival);
  });
  std::unique_ptr<Sequence> s = std::move(*victim);
  running_.erase(victim);
  free_pages(*s, true);
  s->computed = 0;
  waiting_.push_front(std::move(s));
  std::lock_guard<std::mutex> lk(metrics_mu_);
  ++metrics_.preemptions;
}

namespace {

// Applies penalties, logit bias and min_tokens suppression in place (vLLM semantics).
void adjust_logits(std::vector<float>& lg, const std::vector<int32_t>& tokens, int prompt_len,
                   const GenerationParams& p, int generated, int eos) {
  if (p.repetition_penalty != 1.f) {
    std::unordered_set<int32_t> seen(tokens.begin(), tokens.end());
    for (int32_t t : seen) lg[t] = lg[t] > 0 ? lg[t] / p.repetition_penalty : lg[t] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    std::unordered_map<int32_t, int> counts;
    for (size_t i = size_t(prompt_len); i < tokens.size(); ++i) ++counts[tokens[i]];
    for (auto [t, n] : counts) lg[t] -= p.presence_penalty + p.frequency_penalty * float(n);
  }
  for (auto [t, b] : p.logit_bias) lg[t] += b;
  if (generated < p.min_tokens) {
    const float ninf = -std::numeric_limits<float>::infinity();
    if (eos >= 0 && !p.ignore_eos) lg[eos] = ninf;
    for (int32_t t : p.stop_token_ids) lg[t] = ninf;
  }
}

TokenLogprob logprobs_of(std::span<const float> raw, int32_t chosen, int top) {
  double m = -INFINITY;
  for (float x : raw) m = std::max(m, double(x));
  double sum = 0;
  for (float x : raw) sum += std::exp(double(x) - m);
  const double lse = m + std::log(sum);
  TokenLogprob lp;
  lp.id = chosen;
  lp.logprob = float(double(raw[chosen]) - lse);
  if (top > 0) {
    std::vector<int32_t> idx(raw.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
    const size_t k = std::min(size_t(top), idx.size());
    std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                      [&](int32_t a, int32_t b) { return raw[a] != raw[b] ? raw[a] > raw[b] : a < b; });
    for (size_t i = 0; i < k; ++i) lp.top.emplace_back(idx[i], float(double(raw[idx[i]]) - lse));
  }
  return lp;
}

}  // namespace

bool Engine::step() {
  drain_inbox();
  if (running_.empty() && waiting_.empty()) {
    publish_state();
    return false;
  }
  const M3Config& c = exec_.config();
  const int64_t B = c.sparse_block_size;
  int64_t budget = cfg_.max_num_batched_tokens;

  // Work list for this step: (sequence, number of new tokens to compute).
  std::vector<std::pair<Sequence*, int64_t>> work;

  // 1. Decode rows first (one token each). Every decoding sequence needs room for one more token; when the pool
  //    cannot provide it, preempt the least important sequence and try again.
  auto decoding = [&](const Sequence& s) { return int64_t(s.tokens.size()) - s.computed == 1; };
  for (bool retry = true; retry;) {
    retry = false;
    for (auto& r : running_)
      if (decoding(*r) && !ensure_pages(*r, r->computed + 1)) {
        preempt_one();
        retry = true;
        break;
      }
  }
  for (auto& r : running_)
    if (decoding(*r) && budget > 0) {
      work.emplace_back(r.get(), 1);
      --budget;
    }

  // 2. Continue chunked prefills of running sequences.
  for (auto& r : running_) {
    if (budget <= 0) break;
    Sequence& s = *r;
    const int64_t pending = int64_t(s.tokens.size()) - s.computed;
    if (pending <= 1) continue;
    const int64_t n = std::min(pending, budget);
    if (!ensure_pages(s, s.computed + n)) continue;  // try again next step (decodes may finish)
    work.emplace_back(&s, n);
    budget -= n;
  }

  // 3. Admit waiting sequences while budget, sequence slots and pages allow.
  while (budget > 0 && !waiting_.empty() && int(running_.size()) < cfg_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    if (s.pages.empty() && s.computed == 0) {
      std::vector<int32_t> hit = prefix_.match(s.tokens);
      s.pages = hit;
      s.registered = int(hit.size());
      s.computed = int64_t(hit.size()) * B;
      if (s.cached_tokens < 0) {
        s.cached_tokens = int(s.computed);
        std::lock_guard<std::mutex> lk(metrics_mu_);
        metrics_.prompt_tokens += uint64_t(s.prompt_len);
        if (prefix_.enabled()) {
          metrics_.prefix_query_tokens += uint64_t(s.prompt_len);
          metrics_.prefix_hit_tokens += uint64_t(s.computed);
        }
      }
    }
    const int64_t pending = int64_t(s.tokens.size()) - s.computed;
    const int64_t n = std::min(pending, budget);
    if (!ensure_pages(s, s.computed + n)) {
      // Not enough pages now: give back what was taken and wait for running requests to finish.
      free_pages(s, false);
      s.computed = 0;
      break;
    }
    work.emplace_back(&s, n);
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (work.empty()) {
    // Nothing fits. With nothing running, only cached pages can hold the pool: evict them. With requests running
    // but none able to grow (their prefills all wait for pages), make room by preempting one — otherwise no step
    // would ever free a page.
    if (running_.empty())
      prefix_.evict_all_unreferenced();
    else
      preempt_one();
    publish_state();
    return true;
  }

  // 4. One forward over the batch.
  std::vector<SeqInput> inputs;
  for (auto& [s, n] : work)
    inputs.push_back(SeqInput{std::span<const int32_t>(s->tokens.data() + s->computed, size_t(n)), s->computed,
                              s->pages, false});
  std::vector<std::vector<float>> logits = exec_.forward(inputs);

  // 5. Advance, sample where a sequence reached its end, emit, retire.
  std::vector<Sequence*> done;
  std::vector<FinishReason> done_why;
  uint64_t new_tokens = 0;
  for (size_t w = 0; w < work.size(); ++w) {
    Sequence& s = *work[w].first;
    s.computed += work[w].second;
    for (int64_t i = s.registered; i < s.computed / B; ++i) prefix_.insert(s.tokens, int(i), s.pages[i]);
    s.registered = int(std::max<int64_t>(s.registered, s.computed / B));
    if (s.computed < int64_t(s.tokens.size())) continue;  // prefill not finished yet
    const GenerationParams& p = s.req.params;
    std::vector<float>& lg = logits[w];
    const std::vector<float> raw = p.top_logprobs >= 0 ? lg : std::vector<float>{};
    adjust_logits(lg, s.tokens, s.prompt_len, p, s.generated, c.eos_token_id);
    const int32_t tok = s.sampler.sample(lg);
    s.tokens.push_back(tok);
    ++s.generated;
    ++new_tokens;
    EngineOutput o;
    o.tokens = {tok};
    if (p.top_logprobs >= 0) o.logprobs.push_back(logprobs_of(raw, tok, p.top_logprobs));
    o.prompt_tokens = s.prompt_len;
    o.cached_tokens = std::max(0, s.cached_tokens);
    o.completion_tokens = s.generated;
    FinishReason why = FinishReason::None;
    const bool is_stop_id =
        (!p.ignore_eos && tok == c.eos_token_id) ||
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
    if (is_stop_id && s.generated >= p.min_tokens)
      why = FinishReason::Stop;
    else if (s.generated >= p.max_tokens || int64_t(s.tokens.size()) >= cfg_.max_model_len)
      why = FinishReason::Length;
    const auto now = Clock::now();
    {
      std::lock_guard<std::mutex> lk(metrics_mu_);
      if (!s.first_token_sent)
        metrics_.ttft.observe(std::chrono::duration<double>(now - s.t_arrival).count());
      else
        metrics_.itl.observe(std::chrono::duration<double>(now - s.t_last).count());
    }
    s.first_token_sent = true;
    s.t_last = now;
    if (why == FinishReason::None) {
      if (s.sink) s.sink(o);
    } else {
      // The final event carries the last token too; finish() sends it with the reason.
      EngineOutput last = o;
      last.finish = why;
      free_pages(s, true);
      {
        std::lock_guard<std::mutex> lk(metrics_mu_);
        (why == FinishReason::Stop ? metrics_.requests_stop : metrics_.requests_length)++;
        metrics_.e2e.observe(std::chrono::duration<double>(now - s.t_arrival).count());
      }
      if (s.sink) s.sink(last);
      done.push_back(&s);
    }
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const auto& r) { return std::find(done.begin(), done.end(), r.get()) != done.end(); }),
                 running_.end());
  {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    metrics_.generation_tokens += new_tokens;
  }
  publish_state();
  return true;
}

void Engine::publish_state() {
  std::lock_guard<std::mutex> lk(metrics_mu_);
  metrics_.num_running = int(running_.size());
  metrics_.num_waiting = int(waiting_.size());
  metrics_.pages_free = exec_.pool().num_free();
  metrics_.pages_cached = prefix_.num_cached();
  metrics_.pages_used = exec_.pool().num_used() - prefix_.num_evictable();
}

}  // namespace m3
