#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>

#include "base/error.h"

namespace m3 {

using Clock = std::chrono::steady_clock;

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

namespace {

EngineConfig resolve_config(const M3Config& c, EngineConfig cfg, int32_t num_pages) {
  cfg.num_pages = num_pages;
  const int64_t capacity = int64_t(num_pages) * c.sparse_block_size;
  if (cfg.max_model_len <= 0) cfg.max_model_len = c.max_position_embeddings > 0 ? c.max_position_embeddings : capacity;
  if (c.max_position_embeddings > 0) cfg.max_model_len = std::min(cfg.max_model_len, c.max_position_embeddings);
  // One sequence must always fit, or preemption could never make progress.
  cfg.max_model_len = std::min(cfg.max_model_len, capacity);
  return cfg;
}

SchedulerConfig scheduler_config(const M3Config& c, const EngineConfig& cfg) {
  SchedulerConfig sc;
  sc.block_size = c.sparse_block_size;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  sc.max_model_len = cfg.max_model_len;
  sc.enable_prefix_caching = cfg.enable_prefix_caching;
  sc.eos_token_id = c.eos_token_id;
  return sc;
}

bool is_media_slot(const M3Config& c, int32_t id) {
  return id >= 0 && (id == c.image_token_id || id == c.video_token_id);
}

}  // namespace

// The rows of the request's media embeddings that belong to the prompt slot tokens among the `n` tokens from
// s.computed on (prefill chunks; empty for decode steps and text requests). Features made on demand start at the
// first slot of item s.media_first (the admission check saw to it that the chunk's slots are at or after it).
std::span<const float> Engine::media_rows(const Sequence& s, int64_t n) const {
  const std::vector<float>* rows = s.req.media_embeds.get();
  int64_t base = 0;  // slot tokens before rows' first row
  if (s.req.media_encoder) {
    rows = s.media_features.get();
    const auto& slots = s.req.media_encoder->item_slots;
    for (size_t i = 0; i < s.media_first; ++i) base += slots[i];
  }
  if (s.computed >= s.prompt_len || (!s.req.media_encoder && (!rows || rows->empty()))) return {};
  const M3Config& c = exec_->config();
  const int64_t end = std::min<int64_t>(s.computed + n, s.prompt_len);
  int64_t before = 0, in = 0;
  for (int64_t i = 0; i < s.computed; ++i) before += is_media_slot(c, s.tokens[size_t(i)]);
  for (int64_t i = s.computed; i < end; ++i) in += is_media_slot(c, s.tokens[size_t(i)]);
  if (in == 0) return {};
  const int64_t have = rows ? int64_t(rows->size()) / c.hidden_size : 0;
  M3_CHECK(before >= base && before - base + in <= have,
           "media rows {}..{} of the prompt are not among the {} encoded from row {}", before, before + in, have,
           base);
  return std::span<const float>(*rows).subspan(size_t((before - base) * c.hidden_size), size_t(in * c.hidden_size));
}

size_t Engine::first_needed_item(const Sequence& s, int64_t computed) const {
  const M3Config& c = exec_->config();
  int64_t before = 0;
  const int64_t upto = std::min<int64_t>(computed, s.prompt_len);
  for (int64_t i = 0; i < upto; ++i) before += is_media_slot(c, s.tokens[size_t(i)]);
  const auto& slots = s.req.media_encoder->item_slots;
  int64_t end = 0;
  for (size_t i = 0; i < slots.size(); ++i)
    if ((end += slots[i]) > before) return i;
  return slots.size();
}

struct Engine::MediaPost {
  std::mutex mu;
  Engine* engine = nullptr;  // null once the engine is being destroyed
};

bool Engine::media_ready(Sequence& s, int rank) {
  if (!s.req.media_encoder) return true;
  const size_t first = first_needed_item(s, s.computed);
  if (first >= s.media_first) return true;
  request_media(s, rank, first);  // the prefix hit is shorter than the one the features were asked for
  return false;
}

void Engine::request_media(Sequence& s, int rank, size_t first) {
  s.held = true;
  media_waits_[s.arrival] = MediaWait{rank, &s, first};
  {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    metrics_.media_items_requested += s.media_first - first;
  }
  const uint64_t arrival = s.arrival;
  auto done = [post = media_post_, arrival, first](std::shared_ptr<const std::vector<float>> f, std::string error) {
    std::lock_guard<std::mutex> lk(post->mu);
    if (post->engine) post->engine->post_media({arrival, first, std::move(f), std::move(error)});
  };
  try {
    s.req.media_encoder->encode(first, s.media_first, std::move(done));
  } catch (const std::exception& e) {
    post_media({arrival, first, nullptr, fmt::format("the vision encoder failed: {}", e.what())});
  }
}

void Engine::post_media(MediaResult r) {
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    media_inbox_.push_back(std::move(r));
  }
  inbox_cv_.notify_one();
}

void Engine::apply_media_results() {
  std::vector<MediaResult> results;
  {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    results.swap(media_inbox_);
  }
  const int64_t H = exec_->config().hidden_size;
  for (MediaResult& m : results) {
    auto it = media_waits_.find(m.arrival);
    if (it == media_waits_.end() || it->second.first != m.first) continue;  // the sequence ended meanwhile
    const MediaWait w = it->second;
    media_waits_.erase(it);
    Sequence& s = *w.seq;
    int64_t rows = 0;
    for (size_t i = m.first; i < s.media_first; ++i) rows += s.req.media_encoder->item_slots[i];
    if (m.error.empty() && (!m.features || int64_t(m.features->size()) != rows * H))
      m.error = fmt::format("the vision encoder returned {} floats for {} rows of {}",
                            m.features ? m.features->size() : 0, rows, H);
    if (!m.error.empty()) {
      if (std::unique_ptr<Sequence> owned = ranks_[size_t(w.rank)].sched->remove_waiting(&s)) {
        owned->finish = FinishReason::Error;
        finish(*owned, m.error);
      }
      continue;
    }
    if (s.media_features) {  // asked again for earlier items (a shorter prefix hit than before): prepend them
      auto joined = std::make_shared<std::vector<float>>(*m.features);
      joined->insert(joined->end(), s.media_features->begin(), s.media_features->end());
      s.media_features = std::move(joined);
    } else {
      s.media_features = std::move(m.features);
    }
    s.media_first = m.first;
    s.held = false;
  }
}

Engine::Engine(const M3Model& model, EngineConfig cfg)
    : Engine(std::make_unique<CpuExecutor>(model,
                                           cfg.num_pages > 0 ? cfg.num_pages : default_cpu_pages(model.config())),
             nullptr, cfg) {}

Engine::Engine(ModelExecutor& executor, EngineConfig cfg) : Engine(nullptr, &executor, cfg) {}

Engine::Engine(std::unique_ptr<ModelExecutor> owned, ModelExecutor* executor, EngineConfig cfg) {
  ModelExecutor& e0 = owned ? *owned : *executor;
  const int P = cfg.data_parallel_size;
  M3_CHECK(P >= 1, "--data-parallel-size must be at least 1, got {}", P);
  cfg_ = resolve_config(e0.config(), cfg, e0.pool().capacity());
  ranks_.resize(size_t(P));
  ranks_[0].owned = std::move(owned);
  ranks_[0].exec = &e0;
  if (P > 1) {
    // Ranks are threads over one host model: the CPU executor is the only one with a data-parallel path so far
    // (the CUDA one needs the NCCL group and fixed-size EP buffers: docs/PARALLEL.md, status).
    auto* cpu = dynamic_cast<CpuExecutor*>(&e0);
    M3_CHECK(cpu, "--data-parallel-size {} needs the CPU backend for now (--device cpu); the {} executor has no "
             "data-parallel path yet", P, e0.describe());
    M3_CHECK(!cpu->expert_parallel(), "the executor is already a rank of an expert-parallel group");
    if (cfg_.enable_expert_parallel) group_ = std::make_unique<dist::InProcessGroup>(P);
    for (int r = 0; r < P; ++r) {
      Rank& rk = ranks_[size_t(r)];
      if (r > 0) {
        rk.owned = std::make_unique<CpuExecutor>(cpu->model(), e0.pool().capacity());
        rk.exec = rk.owned.get();
      }
      // The exchange is sized for the largest step a rank can schedule (fixed sizes: docs/PARALLEL.md).
      if (group_)
        static_cast<CpuExecutor*>(rk.exec)->set_expert_parallel(
            ExpertParallel{&group_->rank(r), int64_t(cfg_.max_num_batched_tokens)});
    }
    workers_ = std::make_unique<RankWorkers>(P);
  }
  exec_ = &e0;
  media_post_ = std::make_shared<MediaPost>();
  media_post_->engine = this;
  for (int r = 0; r < P; ++r) {
    Rank& rk = ranks_[size_t(r)];
    rk.sched = std::make_unique<Scheduler>(rk.exec->pool(), scheduler_config(e0.config(), cfg_));
    rk.sched->set_admit_check([this, r](Sequence& s) { return media_ready(s, r); });
  }
  metrics_.pages_total = cfg_.num_pages * P;
  metrics_.pages_free = 0;
  for (Rank& rk : ranks_) metrics_.pages_free += rk.exec->pool().num_free();
  metrics_.page_bytes = e0.page_bytes();
}

Engine::~Engine() {
  stop();
  {
    std::lock_guard<std::mutex> lk(media_post_->mu);  // encoders still running report to nobody from here
    media_post_->engine = nullptr;
  }
  for (Rank& rk : ranks_)
    for (auto& s : rk.sched->abort_all()) finish(*s);
  // The executor passed in outlives the engine: it must not keep a communicator of the group that dies with it.
  if (group_ && !ranks_[0].owned) static_cast<CpuExecutor*>(ranks_[0].exec)->set_expert_parallel(ExpertParallel{});
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
  const M3Config& c = exec_->config();
  M3_CHECK(!req.prompt.empty(), "the prompt is empty");
  for (int32_t id : req.prompt)
    M3_CHECK(id >= 0 && id < c.vocab_size, "prompt token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
  req.params.validate(c.vocab_size);
  if (req.constraint) {
    M3_CHECK(req.constraint->grammar, "constrained request without a grammar");
    M3_CHECK(req.constraint->grammar->vocab().size() == c.vocab_size,
             "the grammar's vocabulary has {} ids, the model {}", req.constraint->grammar->vocab().size(),
             c.vocab_size);
  }
  if (req.media_embeds || req.media_encoder) {
    int64_t slots = 0;
    for (int32_t id : req.prompt) slots += is_media_slot(c, id);
    if (req.media_embeds)
      M3_CHECK(int64_t(req.media_embeds->size()) == slots * c.hidden_size,
               "the prompt has {} image/video slot tokens but {} media embedding rows of width {}", slots,
               req.media_embeds->size() / size_t(std::max(c.hidden_size, 1)), c.hidden_size);
    if (const MediaEncoder* me = req.media_encoder.get()) {
      M3_CHECK(!req.media_embeds, "media features come up front or from an encoder, not both");
      M3_CHECK(bool(me->encode), "the media encoder has no encode function");
      int64_t sum = 0;
      for (int64_t n : me->item_slots) {
        M3_CHECK(n >= 1, "a media item has {} slot tokens", n);
        sum += n;
      }
      M3_CHECK(sum == slots, "the prompt has {} image/video slot tokens but its {} media items have {}", slots,
               me->item_slots.size(), sum);
    }
  }
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
        return stop_ || !inbox_.empty() || !abort_inbox_.empty() || !media_inbox_.empty() || has_work();
      });
      if (stop_) return;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failing step must not take the server down: fail the requests of this batch, keep serving.
      for (Rank& rk : ranks_)
        for (auto& s : rk.sched->fail_running()) finish(*s, e.what());
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
    auto s = std::make_unique<Sequence>(std::move(req), arrival_counter_++);
    s->sink = std::move(sink);
    s->seed = s->req.params.sampling.seed ? *s->req.params.sampling.seed : random_seed();
    if (s->req.constraint) s->constraint = std::make_unique<grammar::Constraint>(s->req.constraint);
    const int r = place(*s);
    Scheduler& sched = *ranks_[size_t(r)].sched;
    if (s->req.media_encoder) {
      // Ask for the features now, of the items the rank's prefix cache does not hold (the admission check asks
      // for more should the hit have shrunk by then), so they are made while the request waits.
      const int64_t hit = sched.prefix_cache().peek(s->tokens, 0, s->req.media) * sched.config().block_size;
      const size_t first = first_needed_item(*s, hit);
      if (first < s->media_first) request_media(*s, r, first);
    }
    sched.add(std::move(s));
  }
  apply_media_results();
  if (aborts.empty()) return;
  const std::unordered_set<std::string> ids(aborts.begin(), aborts.end());
  for (Rank& rk : ranks_)
    for (auto& s : rk.sched->abort(ids)) finish(*s);
}

bool Engine::has_work() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& rk) { return rk.sched->has_work(); });
}

int Engine::rank_of(const std::string& request_id) const {
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (ranks_[r].sched->holds(request_id)) return int(r);
  return -1;
}

// Affinity first: a rank that holds more of the prompt's pages skips that much prefill (and keeps one copy of a
// shared prefix instead of one per rank). Among equal hits (usually none), the rank with the fewest sequences,
// then the fewest tokens, then the lowest index. Counts the sequences placed earlier in the same drain.
int Engine::place(const Sequence& s) const {
  if (ranks_.size() == 1) return 0;
  int best = 0;
  int64_t best_hit = -1, best_seqs = 0, best_tokens = 0;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const Scheduler& sc = *ranks_[r].sched;
    const int64_t hit = sc.prefix_cache().peek(s.tokens, 0, s.req.media);
    const int64_t seqs = sc.num_running() + sc.num_waiting();
    const int64_t tokens = sc.num_tokens();
    if (hit > best_hit || (hit == best_hit && (seqs < best_seqs || (seqs == best_seqs && tokens < best_tokens)))) {
      best = int(r);
      best_hit = hit;
      best_seqs = seqs;
      best_tokens = tokens;
    }
  }
  return best;
}

void Engine::finish(Sequence& s, const std::string& error) {
  media_waits_.erase(s.arrival);
  EngineOutput o;
  o.finish = s.finish;
  o.error = error;
  o.prompt_tokens = s.prompt_len;
  o.cached_tokens = std::max(0, s.cached_tokens);
  o.completion_tokens = s.generated;
  {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    switch (s.finish) {
      case FinishReason::Stop: ++metrics_.requests_stop; break;
      case FinishReason::Length: ++metrics_.requests_length; break;
      case FinishReason::Abort: ++metrics_.requests_abort; break;
      default: ++metrics_.requests_error; break;
    }
    metrics_.e2e.observe(std::chrono::duration<double>(Clock::now() - s.t_arrival).count());
    if (s.req.media_encoder) metrics_.media_items_skipped += s.media_first;  // never asked for
  }
  if (s.sink) s.sink(o);
}

// One rank's share of a step: its plan, the executor's inputs, the sampled tokens.
struct Engine::RankStep {
  StepPlan plan;
  std::vector<SeqInput> inputs;
  std::vector<RowSampling> rows;
  std::vector<std::pair<const grammar::Constraint*, uint32_t*>> fills;  // grammar masks to fill
  std::vector<SampledToken> sampled;
  std::vector<std::unique_ptr<Sequence>> finished;  // kept alive until their final event is out
};

bool Engine::step() {
  drain_inbox();
  if (!has_work()) {
    publish_state();
    return !media_waits_.empty();  // a caller driving steps keeps going while media features are being made
  }
  // 1. Schedule every rank.
  std::vector<RankStep> st(ranks_.size());
  bool any_rows = false;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    st[r].plan = ranks_[r].sched->schedule();
    any_rows |= !st[r].plan.rows.empty();
    std::lock_guard<std::mutex> lk(metrics_mu_);
    const ScheduleStats& ss = st[r].plan.stats;
    metrics_.preemptions += ss.preemptions;
    metrics_.prompt_tokens += ss.prompt_tokens;
    metrics_.prefix_query_tokens += ss.prefix_query_tokens;
    metrics_.prefix_hit_tokens += ss.prefix_hit_tokens;
  }
  if (!any_rows) {  // nothing fit anywhere; the schedulers made room for the next step
    publish_state();
    return true;
  }

  // 2. Run: one forward over each rank's batch, one token per row that reached its sequence's end.
  for (size_t r = 0; r < ranks_.size(); ++r) prepare(ranks_[r], st[r]);
  run(st);

  // 3. Update and 4. emit, in rank then row order; the final event carries the last token and the reason. The
  //    step's metrics are published before any sink runs, so a client that saw its final event sees it counted.
  std::vector<std::pair<Sequence*, EngineOutput>> events;
  for (size_t r = 0; r < ranks_.size(); ++r) apply(ranks_[r], st[r], events);
  publish_state();
  for (auto& [s, o] : events)
    if (s->sink) s->sink(o);
  return true;
}

void Engine::prepare(Rank& rank, RankStep& st) {
  // Grammar masks of the constrained rows (cached per grammar state: grammar/grammar.h), filled by the executor's
  // before_sampling hook — on a device while the forward runs; the samplers apply them after penalties and bias.
  const int words = (exec_->config().vocab_size + 31) / 32;
  size_t n_masks = 0;
  for (const ScheduledRow& r : st.plan.rows)
    if (r.samples && r.seq->constraint && r.seq->constraint->active()) ++n_masks;
  rank.masks.resize(n_masks * size_t(words));
  size_t mask_at = 0;
  for (const ScheduledRow& r : st.plan.rows) {
    Sequence& s = *r.seq;
    st.inputs.push_back(SeqInput{std::span<const int32_t>(s.tokens.data() + s.computed, size_t(r.num_tokens)),
                                 s.computed, s.pages, false, media_rows(s, r.num_tokens)});
    RowSampling rs;
    if (r.samples) {
      rs.params = &s.req.params;
      rs.tokens = s.tokens;
      rs.prompt_len = s.prompt_len;
      rs.seed = s.seed;
      rs.eos_token_id = exec_->config().eos_token_id;
      if (s.constraint && s.constraint->active()) {
        uint32_t* m = rank.masks.data() + mask_at++ * size_t(words);
        st.fills.emplace_back(s.constraint.get(), m);
        rs.allowed = m;
      }
    }
    st.rows.push_back(rs);
  }
}

void Engine::run(std::vector<RankStep>& st) {
  double mask_seconds = 0;
  size_t n_fills = 0;
  auto fill_all = [&] {
    const auto t0 = Clock::now();
    for (RankStep& x : st)
      for (auto& [c, m] : x.fills) c->fill_mask(m);
    for (RankStep& x : st) n_fills += x.fills.size();
    mask_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  if (ranks_.size() == 1) {
    if (!st[0].rows.empty()) st[0].sampled = exec_->forward_sample(st[0].inputs, st[0].rows, fill_all);
  } else {
    // The masks are filled here, before the ranks start: the grammar caches are shared between requests, and
    // so possibly between ranks.
    fill_all();
    // Lockstep: every rank runs this step's forward (or, with expert parallelism, the idle step) on its own thread,
    // rank 0 on this one; the MoE exchange inside each forward is collective.
    std::vector<std::exception_ptr> err(ranks_.size());
    auto run_rank = [&](size_t r) {
      try {
        RankStep& x = st[r];
        ModelExecutor& ex = *ranks_[r].exec;
        if (!x.rows.empty())
          x.sampled = ex.forward_sample(x.inputs, x.rows);
        else if (ex.expert_parallel())
          ex.idle_step();
      } catch (const std::exception& e) {
        err[r] = std::current_exception();
        // The other ranks may be waiting for this one inside an MoE exchange: wake them with an error.
        if (group_) group_->abort("rank " + std::to_string(r) + " failed: " + e.what());
      } catch (...) {
        err[r] = std::current_exception();
        if (group_) group_->abort("rank " + std::to_string(r) + " failed");
      }
    };
    workers_->run([&](int r) { run_rank(size_t(r)); });  // run_rank catches: every rank returns
    if (group_) group_->reset();  // every rank is out of its collectives: the next step may use the group again
    // The failing rank's own error first (the others only say the group was aborted).
    dist::InProcessGroup::rethrow_rank_errors(err);
  }
  if (n_fills > 0) {
    std::lock_guard<std::mutex> lk(metrics_mu_);
    metrics_.grammar_mask_seconds += mask_seconds;
    metrics_.grammar_masks += n_fills;
  }
}

void Engine::apply(Rank& rank, RankStep& st, std::vector<std::pair<Sequence*, EngineOutput>>& events) {
  if (st.plan.rows.empty()) return;
  const StepPlan& plan = st.plan;
  std::vector<SampledToken>& sampled = st.sampled;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < plan.rows.size(); ++i)
    if (plan.rows[i].samples) {
      tokens.push_back(sampled[i].id);
      // The grammar refuses the token only when its mask allowed none (a vocabulary that cannot continue the
      // document here, or EOS as the only way on while min_tokens masks it): the request ends with an error and
      // the token is not emitted — never output outside the grammar.
      Sequence& s = *plan.rows[i].seq;
      if (s.constraint && !s.constraint->accept(sampled[i].id)) s.finish = FinishReason::Error;
    }

  // The scheduler appends the tokens, checks stops and releases finished sequences (kept alive in `st` until
  // their final event is out).
  st.finished = rank.sched->update(plan, tokens);

  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(metrics_mu_);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (!plan.rows[i].samples) continue;
    Sequence& s = *plan.rows[i].seq;
    EngineOutput o;
    const bool refused = s.finish == FinishReason::Error;  // by the grammar, above
    if (refused) {
      o.error = "constrained decoding reached a point where no token of the vocabulary continues the grammar";
    } else {
      o.tokens = {sampled[i].id};
      if (sampled[i].logprob) o.logprobs.push_back(std::move(*sampled[i].logprob));
    }
    o.prompt_tokens = s.prompt_len;
    o.cached_tokens = std::max(0, s.cached_tokens);
    o.completion_tokens = s.generated;
    o.finish = s.finish;
    if (!s.first_token_sent)
      metrics_.ttft.observe(std::chrono::duration<double>(now - s.t_arrival).count());
    else
      metrics_.itl.observe(std::chrono::duration<double>(now - s.t_last).count());
    s.first_token_sent = true;
    s.t_last = now;
    if (s.finish != FinishReason::None) {
      (refused ? metrics_.requests_error
               : s.finish == FinishReason::Stop ? metrics_.requests_stop : metrics_.requests_length)++;
      metrics_.e2e.observe(std::chrono::duration<double>(now - s.t_arrival).count());
      if (s.req.media_encoder) metrics_.media_items_skipped += s.media_first;  // never asked for
    }
    events.emplace_back(&s, std::move(o));
  }
  metrics_.generation_tokens += tokens.size();
}

void Engine::publish_state() {
  int running = 0, waiting = 0;
  int64_t free = 0, cached = 0, used = 0;
  for (const Rank& rk : ranks_) {
    const PrefixCache& prefix = rk.sched->prefix_cache();
    running += rk.sched->num_running();
    waiting += rk.sched->num_waiting();
    free += rk.exec->pool().num_free();
    cached += prefix.num_cached();
    used += rk.exec->pool().num_used() - prefix.num_evictable();
  }
  std::lock_guard<std::mutex> lk(metrics_mu_);
  metrics_.num_running = running;
  metrics_.num_waiting = waiting;
  metrics_.pages_free = decltype(metrics_.pages_free)(free);
  metrics_.pages_cached = decltype(metrics_.pages_cached)(cached);
  metrics_.pages_used = decltype(metrics_.pages_used)(used);
}

}  // namespace m3
