// Chat requests with image / video parts are prepared off the io thread (OpenAIService::prepare_may_block →
// HttpServer::run_off_io), so a slow media fetch never stalls other connections; their result — a job or a 400
// invalid_media — comes back to the connection; shutdown answers a request still being prepared with 503.
#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../chat_template/reference.h"
#include "base/error.h"
#include "http_test_harness.h"

namespace m3::server {
namespace {

using test::Harness;
using test::RawClient;

std::string chat_with_image(const std::string& url) {
  return R"({"model":"m3-test","max_tokens":3,"messages":[{"role":"user","content":[{"type":"text","text":"what"},)"
         R"({"type":"image_url","image_url":{"url":")" + url + R"("}}]}]})";
}

// A media hook that takes `delay` (a slow remote fetch) and refuses the URL "bad".
std::function<void(ServiceConfig&)> slow_media(std::chrono::milliseconds delay, std::atomic<int>* calls) {
  return [delay, calls](ServiceConfig& c) {
    c.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::parse(
        testref::slurp(testref::synthetic_m3_template_path()), "m3_format_synthetic.jinja"));
    c.content_format.reset();
    c.serve_media = true;
    c.prepare_media = [delay, calls](const OJson& messages, std::string prompt) {
      ++*calls;
      std::this_thread::sleep_for(delay);
      if (messages[0]["content"][1]["image_url"]["url"] == "bad") throw m3::Error("image 0: PNG data is truncated");
      return prompt;
    };
  };
}

TEST(HttpMedia, SlowMediaPreparationDoesNotBlockTheIoThread) {
  M3_REQUIRE_TOKENIZER();
  std::atomic<int> calls{0};
  Harness h([](HttpServerConfig& c) { c.io_threads = 1; c.max_body_bytes = 1 << 20; },
            std::chrono::microseconds(2000), slow_media(std::chrono::milliseconds(700), &calls));
  RawClient slow(h.port());
  const auto t0 = std::chrono::steady_clock::now();
  slow.send(test::post("/v1/chat/completions", chat_with_image("good")));
  ASSERT_TRUE(test::eventually([&] { return calls.load() == 1; }));
  // The only io thread is free: another connection is served while the first request is still being prepared.
  RawClient other(h.port());
  other.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(other.read_until("\r\n\r\n", std::chrono::milliseconds(400)).find("200 OK"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(650));
  const std::string r = slow.read_until("\"finish_reason\"", std::chrono::seconds(5));
  EXPECT_NE(r.find("200 OK"), std::string::npos) << r;
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(700));

  // Bad media: the hook's error comes back as a 400 invalid_media on the same connection, which stays usable.
  RawClient bad(h.port());
  bad.send(test::post("/v1/chat/completions", chat_with_image("bad")));
  const std::string b = bad.read_until("}}", std::chrono::seconds(5));
  EXPECT_NE(b.find("400 Bad Request"), std::string::npos) << b;
  EXPECT_NE(b.find("invalid_media"), std::string::npos) << b;
  EXPECT_NE(b.find("PNG data is truncated"), std::string::npos) << b;
  bad.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(bad.read_until("200 OK", std::chrono::seconds(2)).find("200 OK"), std::string::npos);
  // Text-only requests stay on the io thread (no hook call).
  RawClient text(h.port());
  text.send(test::post("/v1/chat/completions",
                       R"({"model":"m3-test","max_tokens":2,"messages":[{"role":"user","content":"hi"}]})"));
  EXPECT_NE(text.read_until("\"finish_reason\"", std::chrono::seconds(5)).find("200 OK"), std::string::npos);
  EXPECT_EQ(calls.load(), 2);
}

TEST(HttpMedia, ShutdownAnswersARequestStillBeingPrepared) {
  M3_REQUIRE_TOKENIZER();
  std::atomic<int> calls{0};
  Harness h([](HttpServerConfig& c) { c.max_body_bytes = 1 << 20; }, std::chrono::microseconds(2000),
            slow_media(std::chrono::milliseconds(1500), &calls));
  RawClient c(h.port());
  c.send(test::post("/v1/chat/completions", chat_with_image("good")));
  ASSERT_TRUE(test::eventually([&] { return calls.load() == 1; }));
  std::thread stopper([&] { h.server().shutdown(std::chrono::milliseconds(100)); });
  const std::string r = c.read_until("}}", std::chrono::seconds(3));
  stopper.join();
  EXPECT_NE(r.find("503"), std::string::npos) << r;
}

// A media hook that accepts exactly `want` as the image URL and reports fixed gateway / encoder / stage times.
std::function<void(ServiceConfig&)> checking_media(std::string want, std::atomic<int>* calls) {
  return [want = std::move(want), calls](ServiceConfig& c) {
    c.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::parse(
        testref::slurp(testref::synthetic_m3_template_path()), "m3_format_synthetic.jinja"));
    c.content_format.reset();
    c.serve_media = true;
    c.prepare_media = [want, calls](const OJson& messages, std::string prompt) {
      ++*calls;
      const std::string& url = messages[0]["content"][1]["image_url"]["url"].get_ref<const std::string&>();
      if (url != want)
        throw m3::Error(fmt::format("image 0: got {} bytes of URL, not the {} sent", url.size(), want.size()));
      MediaPrepared m(std::move(prompt));
      m.gateway_seconds = 0.5, m.encode_seconds = 0.25;
      m.stages = {0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008};
      return m;
    };
  };
}

double metric(const std::string& text, const std::string& series) {
  const size_t at = text.find(series + " ");
  EXPECT_NE(at, std::string::npos) << series;
  return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 1));
}

TEST(HttpMedia, MetricsTakeAMediaRequestApartStageByStage) {
  M3_REQUIRE_TOKENIZER();
  std::atomic<int> calls{0};
  Harness h([](HttpServerConfig& c) { c.max_body_bytes = 1 << 20; }, std::chrono::microseconds(2000),
            checking_media("data:x", &calls));
  RawClient c(h.port());
  c.send(test::post("/v1/chat/completions", chat_with_image("data:x")));
  ASSERT_NE(c.read_until("\"finish_reason\"").find("200 OK"), std::string::npos) << c.received();
  RawClient m(h.port());
  m.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string text = m.read_until("media_items_encoded_total");
  EXPECT_EQ(test::count_of(text, "# TYPE m3serve:request_stage_seconds histogram"), 1);
  auto stage = [&](const char* name, const char* what) {
    return metric(text, fmt::format("m3serve:request_stage_seconds_{}{{model_name=\"m3-test\",stage=\"{}\"}}", what,
                                    name));
  };
  // Every stage of the path was observed once for the one request; the hook's stage times arrive as reported.
  for (const char* s : {"body_receive", "dispatch", "parse", "template", "media_collect", "media_queue", "media_load",
                        "media_hash", "media_process", "media_process_user", "media_process_sys", "media_expand",
                        "tokenize", "submit"})
    EXPECT_EQ(stage(s, "count"), 1) << s;
  const std::pair<const char*, double> reported[] = {
      {"media_collect", 0.001}, {"media_queue", 0.002}, {"media_load", 0.003}, {"media_hash", 0.004},
      {"media_process", 0.005}, {"media_process_user", 0.006}, {"media_process_sys", 0.007}, {"media_expand", 0.008}};
  for (const auto& [s, v] : reported) EXPECT_DOUBLE_EQ(stage(s, "sum"), v) << s;
  EXPECT_DOUBLE_EQ(metric(text, "m3serve:request_media_gateway_seconds_sum{model_name=\"m3-test\"}"), 0.5);
  // The request's path before the engine is at least the hook's time (gateway + encoder are inside preprocess).
  EXPECT_GE(metric(text, "m3serve:request_preprocess_seconds_sum{model_name=\"m3-test\"}"), 0.0);
}

TEST(HttpMedia, ALargeBodyArrivesWholeAcrossSlowWritesAndAPipelinedRequestAfterItIsAnswered) {
  M3_REQUIRE_TOKENIZER();
  // Bodies of >= 256 KiB are read in 1 MiB socket reads of their own (http_session.cpp read_large_body); the bytes,
  // the request after them on the same connection and the body deadline must be as with Beast's read.
  std::string url = "data:image/png;base64,";
  for (size_t i = 0; url.size() < (5u << 20) + 12345; ++i) url += "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop"[i % 42];
  std::atomic<int> calls{0};
  Harness h([](HttpServerConfig& c) { c.max_body_bytes = 64 << 20; }, std::chrono::microseconds(2000),
            checking_media(url, &calls));
  const std::string req = test::post("/v1/chat/completions", chat_with_image(url));
  RawClient c(h.port());
  // The head and the first bytes together, the rest in uneven pieces with pauses, then a pipelined GET.
  size_t at = 0;
  for (size_t piece : {size_t(1000), size_t(300 << 10), size_t(7), size_t(2 << 20)}) {
    c.send(req.substr(at, piece));
    at += piece;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c.send(req.substr(at) + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  // Two answers: the chat (its hook saw the URL byte for byte) and the pipelined /health (empty body) after it.
  const std::string r = c.read_until("Content-Length: 0\r\n", std::chrono::seconds(10));
  EXPECT_EQ(test::count_of(r, "HTTP/1.1 200 OK"), 2) << r.substr(0, 300);
  EXPECT_LT(r.find("\"finish_reason\""), r.rfind("HTTP/1.1 200 OK")) << r.substr(0, 300);
  EXPECT_EQ(calls.load(), 1);

  // A large body cut short by the client: 400 (partial message), as Beast's own read answers, and no hook call.
  RawClient cut(h.port());
  cut.send(req.substr(0, req.size() / 2));
  cut.shutdown_send();
  EXPECT_NE(cut.read_until("}}", std::chrono::seconds(5)).find("400 Bad Request"), std::string::npos)
      << cut.received();
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpMedia, ALargeBodyThatStallsIsCutOffAtTheBodyDeadline) {
  M3_REQUIRE_TOKENIZER();
  std::atomic<int> calls{0};
  Harness h([](HttpServerConfig& c) {
              c.max_body_bytes = 64 << 20;
              c.body_timeout = std::chrono::milliseconds(200);
            },
            std::chrono::microseconds(2000), checking_media("data:x", &calls));
  RawClient slow(h.port());
  slow.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n" +
            std::string(600 << 10, ' '));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(slow.read_to_close(std::chrono::seconds(3)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(calls.load(), 0);
  // The session returns its body budget when it is destroyed, which may be just after the client sees the close.
  const auto t1 = std::chrono::steady_clock::now();
  while (h.server().counters().body_bytes_buffered.load() != 0 &&
         std::chrono::steady_clock::now() - t1 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(h.server().counters().body_bytes_buffered.load(), 0);
}

}  // namespace
}  // namespace m3::server
