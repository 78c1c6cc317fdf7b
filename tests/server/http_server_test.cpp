// The HTTP layer over loopback with a scripted engine: routing, error statuses, limits, SSE framing, and
// client-disconnect → abort. The server must keep serving after every bad request.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/http_server.h"
#include "server_test_util.h"

namespace m3::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct Reply {
  int status = 0;
  std::string body;
  http::fields headers;
};

Reply request(uint16_t port, http::verb verb, const std::string& target, const std::string& body = "") {
  net::io_context ioc;
  beast::tcp_stream s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  s.expires_after(std::chrono::seconds(20));
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.set("X-Request-Id", "test-req-1");
  req.body() = body;
  req.prepare_payload();
  http::write(s, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(64 << 20);
  beast::error_code ec;
  http::read(s, buf, p, ec);
  EXPECT_FALSE(ec) << ec.message();
  Reply r;
  r.status = p.get().result_int();
  r.body = p.get().body();
  for (const auto& f : p.get()) r.headers.set(f.name_string(), f.value());
  return r;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    M3_REQUIRE_TOKENIZER();
    service_ = std::make_unique<OpenAIService>(test::service_config());
    backend_ = std::make_unique<test::FakeBackend>(test::qwen_tokenizer()->encode(" one two three four", false),
                                                    std::chrono::microseconds(2000));
    HttpServerConfig hc;
    hc.port = 0;
    hc.max_body_bytes = 4096;
    hc.max_connections = 8;
    server_ = std::make_unique<HttpServer>(hc, *service_, *backend_);
    server_->start();
    port_ = server_->port();
  }
  void TearDown() override {
    // Stop the io threads, then the engine (its sinks hold sessions, which must die while the io_context
    // still exists), then the server.
    if (server_) server_->stop();
    backend_.reset();
    server_.reset();
  }
  void expect_healthy() { EXPECT_EQ(request(port_, http::verb::get, "/health").status, 200); }

  std::unique_ptr<OpenAIService> service_;
  std::unique_ptr<test::FakeBackend> backend_;
  std::unique_ptr<HttpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(HttpServerTest, HealthModelsMetricsAndRequestIdEcho) {
  Reply h = request(port_, http::verb::get, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(std::string(h.headers["X-Request-Id"]), "test-req-1");
  Reply m = request(port_, http::verb::get, "/v1/models");
  EXPECT_EQ(nlohmann::json::parse(m.body)["data"][0]["id"], "m3-test");
  Reply x = request(port_, http::verb::get, "/metrics");
  EXPECT_EQ(x.status, 200);
  EXPECT_NE(x.body.find("m3serve:kv_pages_used{model_name=\"m3-test\"}"), std::string::npos);
  EXPECT_NE(x.body.find("m3serve:http_requests_total"), std::string::npos);
}

TEST_F(HttpServerTest, BadRequestsGetOpenAIErrorsAndTheServerKeepsServing) {
  struct Case {
    http::verb verb;
    std::string target, body;
    int status;
  };
  std::vector<Case> cases = {
      {http::verb::post, "/v1/chat/completions", "{not json", 400},
      {http::verb::post, "/v1/chat/completions", R"({"messages":[]})", 400},
      {http::verb::post, "/v1/chat/completions", R"({"model":"other","messages":[{"role":"user","content":"x"}]})",
       404},
      {http::verb::post, "/v1/chat/completions",
       std::string(R"({"messages":[{"role":"user","content":")") + "\xc3\x28" + R"("}]})", 400},
      {http::verb::post, "/v1/completions", R"({"prompt":"x","temperature":9})", 400},
      {http::verb::post, "/v1/completions", R"({"prompt":"x","max_tokens":"lots"})", 400},
      {http::verb::get, "/v1/completions", "", 405},
      {http::verb::get, "/nope", "", 404},
  };
  for (const auto& c : cases) {
    Reply r = request(port_, c.verb, c.target, c.body);
    EXPECT_EQ(r.status, c.status) << c.target << " " << c.body << " → " << r.body;
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r.body;
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") && j["error"].contains("code"));
    expect_healthy();
  }
}

TEST_F(HttpServerTest, OversizedBodyIs413) {
  std::string big = R"({"prompt":")" + std::string(10000, 'a') + R"("})";
  Reply r = request(port_, http::verb::post, "/v1/completions", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("4096"), std::string::npos);
  expect_healthy();
}

TEST_F(HttpServerTest, TooManyConnectionsGet429WithRetryAfterButHealthStillAnswers) {
  net::io_context ioc;
  std::vector<std::unique_ptr<tcp::socket>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<tcp::socket>(ioc));
    held.back()->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  }
  // The server counts a connection when it accepts it; give it a moment to accept all eight.
  for (int i = 0; i < 100 && server_->counters().connections_active.load() < 8; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  Reply r = request(port_, http::verb::get, "/v1/models");
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(std::string(r.headers["Retry-After"]), "1");
  EXPECT_NE(r.body.find("Too many concurrent connections"), std::string::npos);
  // The reserve over the cap still answers health checks and metrics.
  EXPECT_EQ(request(port_, http::verb::get, "/health").status, 200);
  EXPECT_EQ(request(port_, http::verb::get, "/metrics").status, 200);
  held.clear();
  for (int i = 0; i < 200 && server_->counters().connections_active.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect_healthy();
}

TEST_F(HttpServerTest, NonStreamingCompletion) {
  Reply r = request(port_, http::verb::post, "/v1/completions", R"({"prompt":"hi","max_tokens":5})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["text"], " one two three four one");
}

TEST_F(HttpServerTest, MetricsCountPreprocessAndDetokenizeTimePerRequest) {
  auto count = [&](const std::string& body, const std::string& name) {
    std::string key = "m3serve:" + name + "_count{model_name=\"m3-test\"} ";
    size_t at = body.find(key);
    EXPECT_NE(at, std::string::npos) << name;
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + key.size()));
  };
  Reply before = request(port_, http::verb::get, "/metrics");
  EXPECT_EQ(count(before.body, "request_preprocess_seconds"), 0);
  EXPECT_EQ(count(before.body, "request_detokenize_seconds"), 0);
  ASSERT_EQ(request(port_, http::verb::post, "/v1/completions", R"({"prompt":"hi","max_tokens":3})").status, 200);
  ASSERT_EQ(request(port_, http::verb::post, "/v1/completions", R"({"prompt":"hi","max_tokens":3,"stream":true})").status,
            200);
  // A request refused by validation is not a preprocess observation.
  EXPECT_EQ(request(port_, http::verb::post, "/v1/completions", R"({"prompt":"hi","max_tokens":-1})").status, 400);
  Reply after = request(port_, http::verb::get, "/metrics");
  EXPECT_EQ(count(after.body, "request_preprocess_seconds"), 2);
  EXPECT_EQ(count(after.body, "request_detokenize_seconds"), 2);
  EXPECT_NE(after.body.find("m3serve:kv_cache_bytes{model_name=\"m3-test\"}"), std::string::npos);
}

TEST_F(HttpServerTest, StreamingChatIsChunkedSseEndingWithDone) {
  Reply r = request(port_, http::verb::post, "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"stream":true,
                        "stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(std::string(r.headers["Content-Type"]), "text/event-stream");
  ASSERT_GE(r.body.size(), 14u);
  EXPECT_EQ(r.body.substr(r.body.size() - 14), "data: [DONE]\n\n");
  std::string content;
  int usage_events = 0;
  size_t pos = 0;
  while ((pos = r.body.find("data: {", pos)) != std::string::npos) {
    size_t end = r.body.find("\n\n", pos);
    auto j = nlohmann::json::parse(r.body.substr(pos + 6, end - pos - 6));
    if (j.contains("usage")) {
      ++usage_events;
      EXPECT_EQ(j["usage"]["completion_tokens"], 6);
    }
    for (const auto& c : j["choices"])
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    pos = end;
  }
  EXPECT_EQ(usage_events, 1);
  EXPECT_EQ(content, " one two three four one two");
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamAbortsTheEngineRequest) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  std::string body = R"({"prompt":"hi","max_tokens":2000,"stream":true})";
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  net::write(s, net::buffer(req));
  char buf[1024];
  size_t n = s.read_some(net::buffer(buf));  // headers / first chunk arrived: the stream is running
  EXPECT_GT(n, 0u);
  s.close();
  for (int i = 0; i < 300 && backend_->aborted().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend_->aborted().size(), 1u);
  EXPECT_EQ(backend_->running(), 0);
  expect_healthy();
}

TEST_F(HttpServerTest, ClientDisconnectDuringNonStreamingRequestAbortsToo) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  std::string body = R"({"prompt":"hi","max_tokens":2000})";
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  net::write(s, net::buffer(req));
  for (int i = 0; i < 300 && backend_->submitted() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.close();
  for (int i = 0; i < 300 && backend_->aborted().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend_->aborted().size(), 1u);
  expect_healthy();
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  net::io_context ioc;
  beast::tcp_stream s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  beast::flat_buffer buf;
  for (int i = 0; i < 3; ++i) {
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, "x");
    req.body() = R"({"prompt":"hi","max_tokens":2,"stream":)" + std::string(i % 2 ? "true" : "false") + "}";
    req.prepare_payload();
    http::write(s, req);
    http::response<http::string_body> res;
    http::read(s, buf, res);
    EXPECT_EQ(res.result_int(), 200);
    EXPECT_TRUE(res.keep_alive());
  }
}


TEST_F(HttpServerTest, ExpectContinueIsAnsweredBeforeTheBodyIsSent) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  std::string body = R"({"prompt":"hi","max_tokens":2})";
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n";
  net::write(s, net::buffer(head));
  std::string got(64, '\0');
  size_t n = s.read_some(net::buffer(got));  // without the body sent, only the interim response can arrive
  got.resize(n);
  EXPECT_EQ(got.rfind("HTTP/1.1 100 Continue", 0), 0u) << got;
  net::write(s, net::buffer(body));
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  beast::tcp_stream ts(std::move(s));
  http::read(ts, buf, res);
  EXPECT_EQ(res.result_int(), 200) << res.body();
}

TEST_F(HttpServerTest, OversizedContentLengthIs413WithoutReadingTheBody) {
  net::io_context ioc;
  beast::tcp_stream s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100000000\r\n\r\n";
  net::write(s, net::buffer(head));
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(s, buf, res);
  EXPECT_EQ(res.result_int(), 413);
  expect_healthy();
}


TEST(HttpServerKeepAlive, SilentStreamsGetSseCommentLines) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService service(test::service_config());
  // 150 ms between tokens, keep-alive every 30 ms: comments must appear between the data events.
  auto backend = std::make_unique<test::FakeBackend>(test::qwen_tokenizer()->encode(" a b", false),
                                                     std::chrono::milliseconds(150));
  HttpServerConfig hc;
  hc.port = 0;
  hc.sse_keepalive = std::chrono::milliseconds(30);
  HttpServer server(hc, service, *backend);
  server.start();
  Reply r = request(server.port(), http::verb::post, "/v1/completions",
                    R"({"prompt":"hi","max_tokens":3,"stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find(": keep-alive\n\n"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.substr(r.body.size() - 14), "data: [DONE]\n\n");
  server.stop();
  backend.reset();  // before the server: its sinks hold sessions
}

TEST(HttpServerNesting, A60kLevelBodyIs400OnEveryJsonRouteAndTheServerSurvives) {
  // The reported remote crash: ~120 KB of nested JSON killed the process (SIGSEGV). Each route that parses a body
  // must answer 400 and the process must keep serving.
  M3_REQUIRE_TOKENIZER();
  OpenAIService service(test::service_config());
  auto backend = std::make_unique<test::FakeBackend>(test::qwen_tokenizer()->encode(" a", false),
                                                     std::chrono::microseconds(100));
  HttpServerConfig hc;
  hc.port = 0;
  hc.max_body_bytes = 1 << 20;
  HttpServer server(hc, service, *backend);
  server.start();
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":)" + deep + "}]}"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"k":)" + deep + "}}"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",)"
                               R"("function":{"name":"f","parameters":{"p":)" + deep + "}}}]}"},
      {"/v1/completions", R"({"prompt":"x","stop":)" + deep + "}"},
      {"/tokenize", R"({"messages":[{"role":"user","content":"hi","x":)" + deep + "}]}"},
      {"/detokenize", R"({"tokens":)" + deep + "}"},
  };
  for (const auto& [target, body] : cases) {
    Reply r = request(server.port(), http::verb::post, target, body);
    EXPECT_EQ(r.status, 400) << target << " → " << r.body.substr(0, 200);
    EXPECT_NE(r.body.find("nested deeper than 256 levels"), std::string::npos) << r.body.substr(0, 200);
    EXPECT_EQ(request(server.port(), http::verb::get, "/health").status, 200);
  }
  server.stop();
  backend.reset();
}

}  // namespace
}  // namespace m3::server
