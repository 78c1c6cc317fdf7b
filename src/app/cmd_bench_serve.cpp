// m3serve bench-serve: a load client for any OpenAI-compatible server, in the style of `vllm bench serve`.
// Sends streaming /v1/completions requests with random token-id prompts (exact input lengths without a
// tokenizer) at a fixed concurrency and reports TTFT, TPOT, ITL and E2E latency (mean / median / p99) and
// throughput. Shared-prefix ("agentic") mode: --num-groups groups, each with its own --shared-prefix-len common
// prefix, plus a --suffix-len random suffix per request. One JSON line per request goes to --output-file.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "base/error.h"

namespace m3::app {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;
  int num_prompts = 100;
  int max_concurrency = 8;
  int input_len = 128;
  int output_len = 64;
  int shared_prefix_len = 0;
  int suffix_len = 32;
  int num_groups = 1;
  int token_low = 1000, token_high = 20000;
  bool ignore_eos = true;
  double temperature = 0.0;
  uint64_t seed = 0;
  std::string output_file;
};

struct Target {
  std::string host, port, path;
};

Target parse_url(const std::string& url) {
  const std::string scheme = "http://";
  M3_CHECK(url.rfind(scheme, 0) == 0, "--base-url must start with http:// (got '{}')", url);
  std::string rest = url.substr(scheme.size());
  Target t;
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  t.path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!t.path.empty() && t.path.back() == '/') t.path.pop_back();
  size_t colon = hostport.rfind(':');
  t.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  t.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  return t;
}

struct Result {
  int index = 0, group = 0;
  int prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
};

// One blocking client connection (keep-alive) per worker.
class Client {
 public:
  explicit Client(const Target& t) : t_(t), stream_(ioc_) {}

  std::string get(const std::string& path) {
    connect();
    http::request<http::empty_body> req{http::verb::get, path, 11};
    req.set(http::field::host, t_.host);
    http::write(stream_, req);
    http::response<http::string_body> res;
    http::read(stream_, buf_, res);
    M3_CHECK(res.result_int() == 200, "GET {} → {}: {}", path, res.result_int(), res.body());
    return res.body();
  }

  // POSTs a streaming request and calls on_event(data) for each SSE "data:" payload as it arrives.
  template <typename F>
  int post_stream(const std::string& path, const std::string& body, F&& on_event, std::string& error_body) {
    connect();
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, t_.host);
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    http::write(stream_, req);
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    http::read_header(stream_, buf_, p);
    const int status = p.get().result_int();
    std::string pending;
    char chunk[16384];
    while (!p.is_done()) {
      p.get().body().data = chunk;
      p.get().body().size = sizeof(chunk);
      beast::error_code ec;
      // read_some: return as soon as some body bytes arrived (http::read would wait for a full buffer).
      http::read_some(stream_, buf_, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) throw beast::system_error(ec);
      const size_t n = sizeof(chunk) - p.get().body().size;
      pending.append(chunk, n);
      if (status != 200) continue;
      size_t pos;
      while ((pos = pending.find("\n\n")) != std::string::npos) {
        std::string ev = pending.substr(0, pos);
        pending.erase(0, pos + 2);
        if (ev.rfind("data: ", 0) == 0) on_event(ev.substr(6));
      }
    }
    if (status != 200) error_body = pending;
    if (!p.get().keep_alive()) close();
    return status;
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    connected_ = false;
  }

 private:
  void connect() {
    if (connected_) return;
    tcp::resolver r(ioc_);
    stream_.connect(r.resolve(t_.host, t_.port));
    stream_.socket().set_option(tcp::no_delay(true));
    buf_.clear();
    connected_ = true;
  }
  Target t_;
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  bool connected_ = false;
};

struct Stats {
  double mean = 0, median = 0, p99 = 0;
};

Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  // Linear interpolation between closest ranks (numpy's default percentile).
  double rank = 0.99 * double(v.size() - 1);
  size_t lo = size_t(rank);
  size_t hi = std::min(lo + 1, v.size() - 1);
  s.p99 = v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
  return s;
}

}  // namespace

CommandRun register_bench_serve(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench-serve", "Load-test an OpenAI-compatible server (like `vllm bench serve`)");
  cmd->add_option("--base-url", o->base_url, "Server URL")->capture_default_str();
  cmd->add_option("--model", o->model, "Model name (default: the first of /v1/models)");
  cmd->add_option("--num-prompts", o->num_prompts, "Requests to send")->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--max-concurrency", o->max_concurrency, "Requests in flight at most")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--random-input-len", o->input_len, "Prompt tokens (random mode)")->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--random-output-len", o->output_len, "max_tokens per request")->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--shared-prefix-len", o->shared_prefix_len,
                  "Shared-prefix mode when > 0: common prefix tokens per group")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--suffix-len", o->suffix_len, "Shared-prefix mode: random suffix tokens per request")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--num-groups", o->num_groups, "Shared-prefix mode: prefix groups (requests round-robin)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--token-id-low", o->token_low, "Random prompt ids are drawn from [low, high)");
  cmd->add_option("--token-id-high", o->token_high, "Random prompt ids are drawn from [low, high)");
  cmd->add_flag("--ignore-eos,!--no-ignore-eos", o->ignore_eos, "Generate exactly --random-output-len tokens");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for prompts (and request seeds)")->capture_default_str();
  cmd->add_option("--output-file", o->output_file, "Write one JSON line per request here");

  return [o]() -> int {
    M3_CHECK(o->token_low >= 0 && o->token_high > o->token_low, "--token-id-low/high must give a non-empty range");
    const Target target = parse_url(o->base_url);
    std::string model = o->model;
    if (model.empty()) {
      Client c(target);
      auto j = nlohmann::json::parse(c.get(target.path + "/v1/models"));
      M3_CHECK(!j["data"].empty(), "server lists no models");
      model = j["data"][0]["id"].get<std::string>();
    }

    // Build every prompt up front (deterministic in --seed).
    std::mt19937_64 rng(o->seed);
    std::uniform_int_distribution<int> tok(o->token_low, o->token_high - 1);
    const bool shared = o->shared_prefix_len > 0;
    std::vector<std::vector<int>> prefixes;
    if (shared)
      for (int g = 0; g < o->num_groups; ++g) {
        std::vector<int> p(size_t(o->shared_prefix_len));
        for (auto& x : p) x = tok(rng);
        prefixes.push_back(std::move(p));
      }
    std::vector<std::string> bodies(size_t(o->num_prompts));
    std::vector<int> groups(size_t(o->num_prompts), 0), prompt_lens(size_t(o->num_prompts), 0);
    for (int i = 0; i < o->num_prompts; ++i) {
      std::vector<int> ids;
      if (shared) {
        groups[size_t(i)] = i % o->num_groups;
        ids = prefixes[size_t(groups[size_t(i)])];
        for (int k = 0; k < o->suffix_len; ++k) ids.push_back(tok(rng));
      } else {
        for (int k = 0; k < o->input_len; ++k) ids.push_back(tok(rng));
      }
      prompt_lens[size_t(i)] = int(ids.size());
      nlohmann::json b = {{"model", model},
                          {"prompt", ids},
                          {"max_tokens", o->output_len},
                          {"temperature", o->temperature},
                          {"ignore_eos", o->ignore_eos},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}};
      if (o->temperature > 0) b["seed"] = o->seed + uint64_t(i);
      bodies[size_t(i)] = b.dump();
    }

    std::vector<Result> results(size_t(o->num_prompts));
    std::atomic<int> next{0};
    std::atomic<int> finished{0};
    const auto t_start = Clock::now();
    auto worker = [&]() {
      Client client(target);
      for (int i; (i = next.fetch_add(1)) < o->num_prompts;) {
        Result& r = results[size_t(i)];
        r.index = i;
        r.group = groups[size_t(i)];
        r.prompt_tokens = prompt_lens[size_t(i)];
        const auto t0 = Clock::now();
        auto last = t0;
        bool first = true;
        int chunks = 0;
        try {
          std::string err;
          int status = client.post_stream(
              target.path + "/v1/completions", bodies[size_t(i)],
              [&](const std::string& data) {
                if (data == "[DONE]") return;
                auto j = nlohmann::json::parse(data, nullptr, false);
                if (!j.is_object()) return;
                if (j.contains("error")) {
                  r.error = j["error"].dump();
                  return;
                }
                if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
                  r.output_tokens = u->value("completion_tokens", 0);
                  r.prompt_tokens = u->value("prompt_tokens", r.prompt_tokens);
                  if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
                    r.cached_tokens = d->value("cached_tokens", 0);
                }
                auto ch = j.find("choices");
                if (ch == j.end() || !ch->is_array() || ch->empty()) return;
                const auto& c0 = (*ch)[0];
                std::string text = c0.value("text", "");
                if (text.empty()) return;
                const auto now = Clock::now();
                if (first) {
                  r.ttft = std::chrono::duration<double>(now - t0).count();
                  first = false;
                } else {
                  r.itl.push_back(std::chrono::duration<double>(now - last).count());
                }
                last = now;
                ++chunks;
              },
              err);
          r.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
          if (status != 200) {
            r.error = fmt::format("HTTP {}: {}", status, err);
          } else if (r.error.empty()) {
            r.ok = true;
            if (r.output_tokens == 0) r.output_tokens = chunks;
            if (first) r.ttft = r.e2e;  // nothing streamed (e.g. all whitespace-free empty output)
          }
        } catch (const std::exception& e) {
          r.error = e.what();
          r.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
          client.close();
        }
        int done = finished.fetch_add(1) + 1;
        if (done % std::max(1, o->num_prompts / 10) == 0)
          std::fprintf(stderr, "  %d/%d requests done\n", done, o->num_prompts);
      }
    };
    std::vector<std::thread> threads;
    for (int k = 0; k < std::min(o->max_concurrency, o->num_prompts); ++k) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    const double duration = std::chrono::duration<double>(Clock::now() - t_start).count();

    std::vector<double> ttft, tpot, itl, e2e;
    int64_t in_tokens = 0, out_tokens = 0, cached = 0;
    int ok = 0;
    std::string first_error;
    for (const auto& r : results) {
      if (!r.ok) {
        if (first_error.empty()) first_error = r.error;
        continue;
      }
      ++ok;
      in_tokens += r.prompt_tokens;
      out_tokens += r.output_tokens;
      cached += r.cached_tokens;
      ttft.push_back(r.ttft * 1e3);
      e2e.push_back(r.e2e * 1e3);
      if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) * 1e3 / double(r.output_tokens - 1));
      for (double x : r.itl) itl.push_back(x * 1e3);
    }
    auto line = [](const char* k, const std::string& v) { std::printf("%-40s %s\n", k, v.c_str()); };
    auto block = [&](const char* title, const char* name, const std::vector<double>& v) {
      Stats s = stats(v);
      std::printf("%s\n", fmt::format("{:-^50}", title).c_str());
      line(fmt::format("Mean {} (ms):", name).c_str(), fmt::format("{:.2f}", s.mean));
      line(fmt::format("Median {} (ms):", name).c_str(), fmt::format("{:.2f}", s.median));
      line(fmt::format("P99 {} (ms):", name).c_str(), fmt::format("{:.2f}", s.p99));
    };
    std::printf("%s\n", fmt::format("{:=^50}", " Serving Benchmark Result ").c_str());
    line("Backend:", "m3serve bench-serve (openai-completions, streaming)");
    line("Model:", model);
    line("Mode:", shared ? fmt::format("shared prefix: {} groups x {} prefix + {} suffix tokens", o->num_groups,
                                       o->shared_prefix_len, o->suffix_len)
                         : fmt::format("random: {} in / {} out", o->input_len, o->output_len));
    line("Maximum request concurrency:", std::to_string(o->max_concurrency));
    line("Successful requests:", std::to_string(ok));
    line("Failed requests:", std::to_string(o->num_prompts - ok));
    line("Benchmark duration (s):", fmt::format("{:.2f}", duration));
    line("Total input tokens:", std::to_string(in_tokens));
    line("Total generated tokens:", std::to_string(out_tokens));
    line("Request throughput (req/s):", fmt::format("{:.2f}", ok / duration));
    line("Input token throughput (tok/s):", fmt::format("{:.2f}", double(in_tokens) / duration));
    line("Output token throughput (tok/s):", fmt::format("{:.2f}", double(out_tokens) / duration));
    line("Total token throughput (tok/s):", fmt::format("{:.2f}", double(in_tokens + out_tokens) / duration));
    line("Prefix cache hit rate (cached/input):",
         fmt::format("{:.2f} %", in_tokens ? 100.0 * double(cached) / double(in_tokens) : 0.0));
    block(" Time to First Token ", "TTFT", ttft);
    block(" Time per Output Token (excl. 1st token) ", "TPOT", tpot);
    block(" Inter-token Latency ", "ITL", itl);
    block(" End-to-end Latency ", "E2EL", e2e);
    std::printf("%s\n", std::string(50, '=').c_str());
    if (!first_error.empty()) std::fprintf(stderr, "first error: %s\n", first_error.c_str());

    if (!o->output_file.empty()) {
      std::ofstream f(o->output_file);
      M3_CHECK(f.good(), "cannot write --output-file '{}'", o->output_file);
      for (const auto& r : results) {
        nlohmann::json j = {{"index", r.index},         {"group", r.group},
                            {"ok", r.ok},               {"prompt_tokens", r.prompt_tokens},
                            {"output_tokens", r.output_tokens}, {"cached_tokens", r.cached_tokens},
                            {"ttft_s", r.ttft},         {"e2e_s", r.e2e},
                            {"itl_s", r.itl}};
        if (!r.error.empty()) j["error"] = r.error;
        f << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
    }
    return ok == o->num_prompts ? 0 : 1;
  };
}

}  // namespace m3::app
