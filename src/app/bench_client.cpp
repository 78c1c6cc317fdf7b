#include "app/bench_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
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

#include "base/error.h"

namespace m3::app::bench {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

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
  M3_CHECK(!t.host.empty(), "--base-url '{}' has no host", url);
  return t;
}

// One blocking client connection (keep-alive) per worker.
class Client {
 public:
  explicit Client(const Target& t) : t_(t), stream_(ioc_) {}

  // GET/POST with a whole-body answer; returns {status, body}.
  std::pair<int, std::string> request(http::verb verb, const std::string& path, const std::string& body = "") {
    connect();
    http::request<http::string_body> req{verb, path, 11};
    req.set(http::field::host, t_.host);
    req.keep_alive(true);
    if (verb == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream_, req);
    http::response_parser<http::string_body> p;
    p.body_limit(boost::none);
    http::read(stream_, buf_, p);
    auto res = p.release();
    if (!res.keep_alive()) close();
    return {res.result_int(), res.body()};
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
        if (ev.rfind("data: ", 0) == 0) on_event(ev.substr(6));  // ": keep-alive" comments are skipped
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

struct Result {
  int index = 0, group = 0, session = 0, turn = 0;
  int prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
};

// A prompt under construction: token ids or text, whichever --prompt-format asks for.
struct Piece {
  std::vector<int> ids;
  std::string text;
};

// What one request sends: the concatenation of pieces (shared prefix first, then the session's suffixes).
struct Work {
  int session = 0, turn = 0, group = 0;
  std::vector<const Piece*> pieces;
  int64_t approx_tokens = 0;
};

const char* const kWords[] = {
    "the",     "of",      "and",    "to",     "in",     "is",      "that",    "for",    "it",     "as",
    "was",     "with",    "be",     "by",     "on",     "not",     "he",      "this",   "are",    "or",
    "his",     "from",    "at",     "which",  "but",    "have",    "an",      "had",    "they",   "you",
    "were",    "their",   "one",    "all",    "we",     "can",     "her",     "has",    "there",  "been",
    "if",      "more",    "when",   "will",   "would",  "who",     "so",      "no",     "time",   "people",
    "year",    "way",     "day",    "man",    "thing",  "woman",   "life",    "child",  "world",  "school",
    "state",   "family",  "student", "group", "country", "problem", "hand",   "part",   "place",  "case",
    "week",    "company", "system", "program", "question", "work", "government", "number", "night", "point",
    "home",    "water",   "room",   "mother", "area",   "money",   "story",   "fact",   "month",  "lot",
    "right",   "study",   "book",   "eye",    "job",    "word",    "business", "issue", "side",   "kind",
    "head",    "house",   "service", "friend", "father", "power",  "hour",    "game",   "line",   "end",
    "member",  "law",     "car",    "city",   "community", "name", "president", "team", "minute", "idea",
    "kid",     "body",    "information", "back", "parent", "face", "others",  "level",  "office", "door",
    "health",  "person",  "art",    "war",    "history", "party",  "result",  "change", "morning", "reason",
    "research", "girl",   "guy",    "moment", "air",    "teacher", "force",   "education", "file", "function",
    "return",  "value",   "list",   "table",  "code",   "test",    "server",  "request", "model", "token"};
constexpr int64_t kNumWords = int64_t(sizeof(kWords) / sizeof(kWords[0]));

double pick(const std::map<std::string, double>& m, const std::string& name, double dflt = 0.0) {
  auto it = m.find(name);
  return it == m.end() ? dflt : it->second;
}

}  // namespace

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  auto q = [&](double f) {
    double rank = f * double(v.size() - 1);
    size_t lo = size_t(rank);
    size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
  };
  s.p50 = q(0.5);
  s.p90 = q(0.9);
  s.p95 = q(0.95);
  s.p99 = q(0.99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    std::string series = line.substr(0, sp);
    double v = 0;
    try {
      v = std::stod(line.substr(sp + 1));
    } catch (...) {
      continue;  // "+Inf", "NaN" spellings stod may refuse: not needed here
    }
    out[series] = v;
    std::string name = series.substr(0, series.find('{'));
    out.emplace(name, v);  // first series of a name only
  }
  return out;
}

std::string token_text(uint64_t seed, int64_t words, bool leading_newline) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> w(0, kNumWords - 1);
  std::string s;
  s.reserve(size_t(words) * 6 + 1);
  for (int64_t i = 0; i < words; ++i) {
    // A newline before a letter every 16 words: realistic, and where the tokenizer may split long inputs for its
    // parallel encode (src/text/tokenizer/tokenizer.cpp, candidate_cuts).
    if (i == 0) {
      if (leading_newline) s += '\n';
    } else {
      s += (i % 16 == 0) ? '\n' : ' ';
    }
    s += kWords[w(rng)];
  }
  return s;
}

int run_bench(BenchOptions o) {
  M3_CHECK(o.token_low >= 0 && o.token_high > o.token_low, "--token-id-low/high must give a non-empty range");
  M3_CHECK(o.prompt_format == "ids" || o.prompt_format == "text", "--prompt-format must be ids or text (got '{}')",
           o.prompt_format);
  if (o.traffic.empty()) o.traffic = o.shared_prefix_len > 0 ? "shared-prefix" : "random";
  const std::string& traffic = o.traffic;
  M3_CHECK(traffic == "random" || traffic == "shared-prefix" || traffic == "agentic" || traffic == "long",
           "--traffic must be random, shared-prefix, agentic or long (got '{}')", traffic);
  if (o.output_len < 0) o.output_len = traffic == "agentic" ? 300 : 64;
  M3_CHECK(o.output_len >= 1, "--random-output-len must be at least 1");
  if (traffic == "agentic") {
    if (o.shared_prefix_len <= 0) o.shared_prefix_len = 60000;
    if (o.num_sessions <= 0) o.num_sessions = o.max_concurrency;
    M3_CHECK(o.suffix_len_min >= 1 && o.suffix_len_max >= o.suffix_len_min,
             "--suffix-len-min/max must satisfy 1 <= min <= max");
    M3_CHECK(o.turns >= 1, "--turns must be at least 1");
  }
  if (traffic == "shared-prefix") M3_CHECK(o.shared_prefix_len > 0, "--traffic shared-prefix needs --shared-prefix-len");
  if (traffic == "long") M3_CHECK(o.prompt_tokens >= 1, "--prompt-tokens must be at least 1");
  std::map<std::string, std::string> tags;
  for (const auto& t : o.tags) {
    size_t eq = t.find('=');
    M3_CHECK(eq != std::string::npos && eq > 0, "--tag must be KEY=VALUE (got '{}')", t);
    tags[t.substr(0, eq)] = t.substr(eq + 1);
  }

  const Target target = parse_url(o.base_url);
  Client control(target);
  std::string model = o.model;
  if (model.empty()) {
    auto [st, body] = control.request(http::verb::get, target.path + "/v1/models");
    M3_CHECK(st == 200, "GET /v1/models → {}: {}", st, body);
    auto j = json::parse(body);
    M3_CHECK(j.contains("data") && !j["data"].empty(), "server lists no models");
    model = j["data"][0]["id"].get<std::string>();
  }

  // ---- prompts ---------------------------------------------------------------------------------------------------
  const bool text = o.prompt_format == "text";
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> tok(o.token_low, o.token_high - 1);
  // Text mode: tokens per word, measured once with the server's tokenizer (POST /tokenize).
  auto count_tokens = [&](const std::string& s) -> int64_t {
    json b = {{"model", model}, {"prompt", s}, {"add_special_tokens", false}};
    auto [st, body] = control.request(http::verb::post, "/tokenize", b.dump());
    M3_CHECK(st == 200, "POST /tokenize → {}: {} (--prompt-format text needs the server's /tokenize)", st,
             body.substr(0, 300));
    return json::parse(body).at("count").get<int64_t>();
  };
  double tokens_per_word = 1.0;
  if (text) {
    const int64_t sample_words = 4000;
    tokens_per_word = double(count_tokens(token_text(o.seed ^ 0x5eedULL, sample_words, true))) / double(sample_words);
    M3_CHECK(tokens_per_word > 0, "the server's tokenizer maps the sample text to no tokens");
  }
  uint64_t piece_seed = o.seed * 1000003ULL + 17;
  // A piece of about n tokens; `exact` (text mode) re-counts with /tokenize once and corrects the word count.
  auto make_piece = [&](int64_t n, bool exact) {
    Piece p;
    if (!text) {
      p.ids.resize(size_t(n));
      for (auto& x : p.ids) x = tok(rng);
      return p;
    }
    const uint64_t seed = piece_seed++;
    int64_t words = std::max<int64_t>(1, int64_t(double(n) / tokens_per_word + 0.5));
    p.text = token_text(seed, words, true);
    if (exact) {
      const int64_t got = count_tokens(p.text);
      if (got != n && got > 0) {
        words = std::max<int64_t>(1, int64_t(double(words) * double(n) / double(got) + 0.5));
        p.text = token_text(seed, words, true);
      }
    }
    return p;
  };

  std::vector<Piece> prefixes;                   // shared-prefix: one per group; agentic: one
  std::vector<std::vector<Piece>> own;           // per session: its suffixes / its prompt
  std::vector<std::vector<Work>> sessions;       // per session: its requests in order
  if (traffic == "agentic") {
    prefixes.push_back(make_piece(o.shared_prefix_len, true));
    std::uniform_int_distribution<int> suf(o.suffix_len_min, o.suffix_len_max);
    own.resize(size_t(o.num_sessions));
    for (int s = 0; s < o.num_sessions; ++s)
      for (int t = 0; t < o.turns; ++t) own[size_t(s)].push_back(make_piece(suf(rng), false));
    for (int s = 0; s < o.num_sessions; ++s) {
      std::vector<Work> ws;
      int64_t approx = o.shared_prefix_len;
      for (int t = 0; t < o.turns; ++t) {
        Work w;
        w.session = s;
        w.turn = t;
        w.pieces.push_back(&prefixes[0]);
        for (int k = 0; k <= t; ++k) w.pieces.push_back(&own[size_t(s)][size_t(k)]);
        approx += text ? int64_t(own[size_t(s)][size_t(t)].text.size() / 5) : int64_t(own[size_t(s)][size_t(t)].ids.size());
        w.approx_tokens = approx;
        ws.push_back(std::move(w));
      }
      sessions.push_back(std::move(ws));
    }
  } else if (traffic == "long") {
    own.resize(1);
    own[0].push_back(make_piece(o.prompt_tokens, true));
    Work w;
    w.pieces.push_back(&own[0][0]);
    w.approx_tokens = o.prompt_tokens;
    sessions.push_back({w});
  } else {
    const bool shared = traffic == "shared-prefix";
    if (shared)
      for (int g = 0; g < o.num_groups; ++g) prefixes.push_back(make_piece(o.shared_prefix_len, true));
    own.resize(size_t(o.num_prompts));
    for (int i = 0; i < o.num_prompts; ++i) {
      own[size_t(i)].push_back(make_piece(shared ? o.suffix_len : o.input_len, false));
      Work w;
      w.session = i;
      if (shared) {
        w.group = i % o.num_groups;
        w.pieces.push_back(&prefixes[size_t(w.group)]);
      }
      w.pieces.push_back(&own[size_t(i)][0]);
      sessions.push_back({w});
    }
  }
  int num_requests = 0;
  for (const auto& s : sessions) num_requests += int(s.size());

  auto body_of = [&](const std::vector<const Piece*>& pieces, int max_tokens, uint64_t seed) {
    json b = {{"model", model},
              {"max_tokens", max_tokens},
              {"temperature", o.temperature},
              {"ignore_eos", o.ignore_eos},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
    if (text) {
      std::string s;
      for (const Piece* p : pieces) s += p->text;
      b["prompt"] = std::move(s);
    } else {
      std::vector<int> ids;
      for (const Piece* p : pieces) ids.insert(ids.end(), p->ids.begin(), p->ids.end());
      b["prompt"] = std::move(ids);
    }
    if (o.temperature > 0) b["seed"] = seed;
    return b.dump();
  };

  // One streaming request; fills r.
  auto send = [&](Client& client, const std::string& body, Result& r) {
    const auto t0 = Clock::now();
    auto last = t0;
    bool first = true;
    int chunks = 0;
    try {
      std::string err;
      int status = client.post_stream(
          target.path + "/v1/completions", body,
          [&](const std::string& data) {
            if (data == "[DONE]") return;
            auto j = json::parse(data, nullptr, false);
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
            std::string t = c0.value("text", "");
            if (t.empty()) return;
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
        r.error = fmt::format("HTTP {}: {}", status, err.substr(0, 2000));
      } else if (r.error.empty()) {
        r.ok = true;
        if (r.output_tokens == 0) r.output_tokens = chunks;
        if (first) r.ttft = r.e2e;  // nothing streamed (e.g. every token decoded to no text)
      }
    } catch (const std::exception& e) {
      r.error = e.what();
      r.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
      client.close();
    }
  };

  auto scrape = [&]() -> std::map<std::string, double> {
    try {
      Client c(target);
      auto [st, body] = c.request(http::verb::get, "/metrics");
      if (st == 200) return parse_prometheus(body);
    } catch (const std::exception&) {
    }
    return {};
  };

  // ---- warm-up: the shared prefix alone, untimed -------------------------------------------------------------------
  json warm = nullptr;
  if (o.warmup && (traffic == "agentic" || traffic == "shared-prefix")) {
    for (size_t g = 0; g < prefixes.size(); ++g) {
      Result r;
      send(control, body_of({&prefixes[g]}, 1, o.seed), r);
      M3_CHECK(r.ok, "warm-up request (the shared prefix alone) failed: {}", r.error);
      if (g == 0) warm = {{"prompt_tokens", r.prompt_tokens}, {"ttft_ms", r.ttft * 1e3}, {"e2e_ms", r.e2e * 1e3}};
      std::fprintf(stderr, "  warm-up: prefix of %d tokens in %.1f ms\n", r.prompt_tokens, r.e2e * 1e3);
    }
  }

  // ---- the run -----------------------------------------------------------------------------------------------------
  const auto before = scrape();
  std::vector<std::vector<Result>> results(sessions.size());
  for (size_t s = 0; s < sessions.size(); ++s) results[s].resize(sessions[s].size());
  std::atomic<size_t> next{0};
  std::atomic<int> finished{0};
  std::atomic<bool> past_deadline{false};
  const auto t_start = Clock::now();
  auto deadline_passed = [&]() {
    if (o.max_duration <= 0) return false;
    if (std::chrono::duration<double>(Clock::now() - t_start).count() > o.max_duration) past_deadline = true;
    return past_deadline.load();
  };
  int index = 0;
  std::vector<std::vector<int>> indices(sessions.size());
  for (size_t s = 0; s < sessions.size(); ++s)
    for (size_t t = 0; t < sessions[s].size(); ++t) indices[s].push_back(index++);
  auto worker = [&]() {
    Client client(target);
    for (size_t s; (s = next.fetch_add(1)) < sessions.size();) {
      for (size_t t = 0; t < sessions[s].size(); ++t) {
        if (deadline_passed()) break;
        const Work& w = sessions[s][t];
        Result& r = results[s][t];
        r.index = indices[s][t];
        r.session = w.session;
        r.turn = w.turn;
        r.group = w.group;
        r.prompt_tokens = int(w.approx_tokens);
        send(client, body_of(w.pieces, o.output_len, o.seed + uint64_t(r.index)), r);
        if (!r.ok) r.error = r.error.empty() ? "failed" : r.error;
        int done = finished.fetch_add(1) + 1;
        if (done % std::max(1, num_requests / 10) == 0 || traffic == "long")
          std::fprintf(stderr, "  %d/%d requests done\n", done, num_requests);
        if (!r.ok) break;  // a session's later turns depend on this one
      }
    }
  };
  // A poller records the peak of the KV gauges while requests run.
  std::mutex poll_mu;
  std::condition_variable poll_cv;
  bool poll_stop = false;
  double peak_pages_used = 0, peak_kv_used_bytes = 0, peak_running = 0;
  std::thread poller;
  if (o.metrics_interval > 0 && !before.empty()) {
    poller = std::thread([&] {
      std::unique_lock<std::mutex> lk(poll_mu);
      while (!poll_stop) {
        lk.unlock();
        auto m = scrape();
        lk.lock();
        peak_pages_used = std::max(peak_pages_used, pick(m, "m3serve:kv_pages_used"));
        peak_kv_used_bytes = std::max(peak_kv_used_bytes, pick(m, "m3serve:kv_cache_used_bytes"));
        peak_running = std::max(peak_running, pick(m, "m3serve:num_requests_running"));
        poll_cv.wait_for(lk, std::chrono::duration<double>(o.metrics_interval), [&] { return poll_stop; });
      }
    });
  }
  std::vector<std::thread> threads;
  const int workers = std::max(1, std::min<int>(o.max_concurrency, int(sessions.size())));
  for (int k = 0; k < workers; ++k) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (poller.joinable()) {
    {
      std::lock_guard<std::mutex> lk(poll_mu);
      poll_stop = true;
    }
    poll_cv.notify_all();
    poller.join();
  }
  const auto after = scrape();

  // ---- statistics --------------------------------------------------------------------------------------------------
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t in_tokens = 0, out_tokens = 0, cached = 0;
  int ok = 0, attempted = 0;
  std::string first_error;
  std::vector<const Result*> flat;
  for (const auto& rs : results)
    for (const auto& r : rs) {
      if (r.e2e == 0 && !r.ok && r.error.empty()) continue;  // never sent (deadline or an earlier turn failed)
      flat.push_back(&r);
      ++attempted;
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
  const int not_sent = num_requests - attempted;

  auto delta = [&](const std::string& name) { return pick(after, name) - pick(before, name); };
  const bool have_metrics = !before.empty() && !after.empty();
  const double hit_q = delta("m3serve:prefix_cache_queries_total"), hit_h = delta("m3serve:prefix_cache_hits_total");
  const double client_hit = in_tokens ? double(cached) / double(in_tokens) : 0.0;
  const double server_hit = hit_q > 0 ? hit_h / hit_q : 0.0;
  auto hist_mean = [&](const std::string& name) {
    const double c = delta("m3serve:" + name + "_count");
    return c > 0 ? delta("m3serve:" + name + "_sum") / c : 0.0;
  };

  auto line = [](const char* k, const std::string& v) { std::printf("%-40s %s\n", k, v.c_str()); };
  auto block = [&](const char* title, const char* name, const std::vector<double>& v) {
    Summary s = summarize(v);
    std::printf("%s\n", fmt::format("{:-^50}", title).c_str());
    line(fmt::format("Mean {} (ms):", name).c_str(), fmt::format("{:.2f}", s.mean));
    line(fmt::format("Median {} (ms):", name).c_str(), fmt::format("{:.2f}", s.p50));
    line(fmt::format("P99 {} (ms):", name).c_str(), fmt::format("{:.2f}", s.p99));
  };
  std::string mode;
  if (traffic == "agentic")
    mode = fmt::format("agentic: {} sessions x {} turns, {} prefix + {}-{} per turn, {} out", o.num_sessions, o.turns,
                       o.shared_prefix_len, o.suffix_len_min, o.suffix_len_max, o.output_len);
  else if (traffic == "long")
    mode = fmt::format("long: one prompt of {} tokens, {} out", o.prompt_tokens, o.output_len);
  else if (traffic == "shared-prefix")
    mode = fmt::format("shared prefix: {} groups x {} prefix + {} suffix tokens", o.num_groups, o.shared_prefix_len,
                       o.suffix_len);
  else
    mode = fmt::format("random: {} in / {} out", o.input_len, o.output_len);
  std::printf("%s\n", fmt::format("{:=^50}", " Serving Benchmark Result ").c_str());
  line("Backend:", "m3serve bench-serve (openai-completions, streaming)");
  line("Model:", model);
  line("Mode:", mode + (text ? " (text prompts)" : " (token-id prompts)"));
  line("Maximum request concurrency:", std::to_string(o.max_concurrency));
  line("Successful requests:", std::to_string(ok));
  line("Failed requests:", std::to_string(attempted - ok));
  if (not_sent) line("Requests not sent (deadline/failure):", std::to_string(not_sent));
  line("Benchmark duration (s):", fmt::format("{:.2f}", duration));
  line("Total input tokens:", std::to_string(in_tokens));
  line("Total generated tokens:", std::to_string(out_tokens));
  line("Request throughput (req/s):", fmt::format("{:.2f}", ok / duration));
  line("Input token throughput (tok/s):", fmt::format("{:.2f}", double(in_tokens) / duration));
  line("Output token throughput (tok/s):", fmt::format("{:.2f}", double(out_tokens) / duration));
  line("Total token throughput (tok/s):", fmt::format("{:.2f}", double(in_tokens + out_tokens) / duration));
  line("Prefix cache hit rate (cached/input):", fmt::format("{:.2f} %", 100.0 * client_hit));
  if (have_metrics && hit_q > 0) line("Prefix cache hit rate (server):", fmt::format("{:.2f} %", 100.0 * server_hit));
  if (have_metrics && pick(after, "m3serve:kv_cache_bytes") > 0)
    line("KV cache (GiB, peak used / total):", fmt::format("{:.3f} / {:.3f}", peak_kv_used_bytes / 1073741824.0,
                                                           pick(after, "m3serve:kv_cache_bytes") / 1073741824.0));
  block(" Time to First Token ", "TTFT", ttft);
  block(" Time per Output Token (excl. 1st token) ", "TPOT", tpot);
  block(" Inter-token Latency ", "ITL", itl);
  block(" End-to-end Latency ", "E2EL", e2e);
  std::printf("%s\n", std::string(50, '=').c_str());
  std::fflush(stdout);
  if (!first_error.empty()) std::fprintf(stderr, "first error: %s\n", first_error.c_str());

  if (!o.output_file.empty()) {
    std::ofstream f(o.output_file);
    M3_CHECK(f.good(), "cannot write --output-file '{}'", o.output_file);
    for (const Result* r : flat) {
      json j = {{"index", r->index},
                {"group", r->group},
                {"session", r->session},
                {"turn", r->turn},
                {"ok", r->ok},
                {"prompt_tokens", r->prompt_tokens},
                {"output_tokens", r->output_tokens},
                {"cached_tokens", r->cached_tokens},
                {"ttft_s", r->ttft},
                {"e2e_s", r->e2e},
                {"itl_s", r->itl}};
      if (!r->error.empty()) j["error"] = r->error;
      f << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
  }
  if (!o.json_file.empty()) {
    auto sj = [](const std::vector<double>& v) {
      Summary s = summarize(v);
      return json{{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p95", s.p95},
                  {"p99", s.p99},   {"min", s.min}, {"max", s.max}, {"n", s.n}};
    };
    json cfg = {{"output_len", o.output_len}, {"temperature", o.temperature}, {"ignore_eos", o.ignore_eos},
                {"seed", o.seed}};
    if (traffic == "agentic")
      cfg.update({{"shared_prefix_len", o.shared_prefix_len}, {"suffix_len_min", o.suffix_len_min},
                  {"suffix_len_max", o.suffix_len_max}, {"turns", o.turns}, {"sessions", o.num_sessions}});
    else if (traffic == "long")
      cfg["prompt_tokens"] = o.prompt_tokens;
    else if (traffic == "shared-prefix")
      cfg.update({{"shared_prefix_len", o.shared_prefix_len}, {"suffix_len", o.suffix_len},
                  {"num_groups", o.num_groups}, {"num_prompts", o.num_prompts}});
    else
      cfg.update({{"input_len", o.input_len}, {"num_prompts", o.num_prompts}});
    json server = nullptr;
    if (have_metrics) {
      const double pages_total = pick(after, "m3serve:kv_pages_total");
      const double kv_bytes = pick(after, "m3serve:kv_cache_bytes");
      server = {{"kv_cache_bytes", kv_bytes},
                {"kv_pages_total", pages_total},
                {"kv_page_bytes", pages_total > 0 ? kv_bytes / pages_total : 0.0},
                {"kv_pages_used_peak", peak_pages_used},
                {"kv_cache_used_bytes_peak", peak_kv_used_bytes},
                {"num_requests_running_peak", peak_running},
                {"prefix_cache_queries", hit_q},
                {"prefix_cache_hits", hit_h},
                {"prompt_tokens", delta("m3serve:prompt_tokens_total")},
                {"generation_tokens", delta("m3serve:generation_tokens_total")},
                {"preemptions", delta("m3serve:num_preemptions_total")},
                {"preprocess_s_mean", hist_mean("request_preprocess_seconds")},
                {"preprocess_count", delta("m3serve:request_preprocess_seconds_count")},
                {"detokenize_s_mean", hist_mean("request_detokenize_seconds")},
                {"detokenize_count", delta("m3serve:request_detokenize_seconds_count")},
                {"ttft_s_mean", hist_mean("time_to_first_token_seconds")}};
    }
    json j = {{"schema", "m3serve-bench-serve/1"},
              {"traffic", traffic},
              {"prompt_format", o.prompt_format},
              {"model", model},
              {"base_url", o.base_url},
              {"concurrency", o.max_concurrency},
              {"config", cfg},
              {"tags", tags},
              {"requests", {{"total", num_requests}, {"ok", ok}, {"failed", attempted - ok}, {"not_sent", not_sent}}},
              {"first_error", first_error},
              {"duration_s", duration},
              {"input_tokens", in_tokens},
              {"output_tokens", out_tokens},
              {"cached_tokens", cached},
              {"request_throughput", ok / duration},
              {"input_tok_s", double(in_tokens) / duration},
              {"output_tok_s", double(out_tokens) / duration},
              {"total_tok_s", double(in_tokens + out_tokens) / duration},
              {"prefix_hit_rate", hit_q > 0 ? server_hit : client_hit},
              {"prefix_hit_rate_client", client_hit},
              {"prefix_hit_rate_server", hit_q > 0 ? json(server_hit) : json(nullptr)},
              {"ttft_ms", sj(ttft)},
              {"tpot_ms", sj(tpot)},
              {"itl_ms", sj(itl)},
              {"e2e_ms", sj(e2e)},
              {"warmup", warm},
              {"server", server}};
    std::ofstream f(o.json_file);
    M3_CHECK(f.good(), "cannot write --json '{}'", o.json_file);
    f << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  }
  return ok == num_requests ? 0 : 1;
}

}  // namespace m3::app::bench
