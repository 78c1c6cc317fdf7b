// Who may call and what gets written down: --api-key on /v1 routes, CORS for --allowed-origins, the access log,
// the crash handler, and template safety (reserved chat_template_kwargs, no server paths in errors).
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>

#include "http_test_harness.h"
#include "server/crash_handler.h"
#include "server/http_policy.h"

namespace m3::server {
namespace {

using namespace std::chrono_literals;
using test::Harness;
using test::post;
using test::RawClient;

std::string get(uint16_t port, const std::string& target, const std::string& headers = "") {
  RawClient c(port);
  c.send("GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + "\r\n");
  c.read_to_close(2s);
  return c.received();
}

TEST(HttpApiKey, EveryV1RouteNeedsTheKeyHealthDoesNot) {
  M3_REQUIRE_TOKENIZER();
  Harness h([](HttpServerConfig& c) { c.api_key = "sk-secret"; });
  for (const std::string& headers : {std::string(""), std::string("Authorization: Bearer sk-wrong\r\n"),
                                     std::string("Authorization: sk-secret\r\n"),
                                     std::string("Authorization: Bearer sk-secretX\r\n")}) {
    const std::string got = get(h.port(), "/v1/models", headers);
    ASSERT_EQ(got.rfind("HTTP/1.1 401", 0), 0u) << headers << " → " << got;
    auto j = nlohmann::json::parse(got.substr(got.find("\r\n\r\n") + 4));
    EXPECT_EQ(j["error"]["code"], "invalid_api_key");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  RawClient c(h.port());
  c.send(post("/v1/completions", R"({"prompt":"hi","max_tokens":2})"));
  EXPECT_EQ(c.read_until("\r\n\r\n").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(h.backend().submitted(), 0);
  EXPECT_EQ(get(h.port(), "/v1/models", "Authorization: Bearer sk-secret\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(get(h.port(), "/health").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(get(h.port(), "/metrics").rfind("HTTP/1.1 200", 0), 0u);
}

TEST(HttpApiKey, KeyComparisonIsExact) {
  EXPECT_TRUE(api_key_matches("Bearer k1", "k1"));
  EXPECT_FALSE(api_key_matches("Bearer k", "k1"));
  EXPECT_FALSE(api_key_matches("Bearer k12", "k1"));
  EXPECT_FALSE(api_key_matches("bearer k1", "k1"));
  EXPECT_FALSE(api_key_matches("", "k1"));
  EXPECT_TRUE(api_key_matches("", ""));  // no key configured
}

TEST(HttpCors, OnlyAllowedOriginsGetCorsHeadersAndPreflightAnswers) {
  M3_REQUIRE_TOKENIZER();
  {
    Harness none;  // default: no origin is allowed
    EXPECT_EQ(get(none.port(), "/v1/models", "Origin: https://app.example\r\n").find("Access-Control"),
              std::string::npos);
  }
  Harness h([](HttpServerConfig& c) { c.allowed_origins = {"https://app.example"}; });
  const std::string ok = get(h.port(), "/v1/models", "Origin: https://app.example\r\n");
  EXPECT_NE(ok.find("Access-Control-Allow-Origin: https://app.example\r\n"), std::string::npos) << ok;
  EXPECT_EQ(get(h.port(), "/v1/models", "Origin: https://evil.example\r\n").find("Access-Control"), std::string::npos);
  RawClient pre(h.port());
  pre.send("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n"
           "Access-Control-Request-Method: POST\r\n\r\n");
  const std::string p = pre.read_until("\r\n\r\n");
  EXPECT_EQ(p.rfind("HTTP/1.1 204", 0), 0u) << p;
  EXPECT_NE(p.find("Access-Control-Allow-Methods: GET, POST, OPTIONS"), std::string::npos);
  EXPECT_NE(p.find("Access-Control-Allow-Headers: Authorization"), std::string::npos);
  RawClient bad(h.port());
  bad.send("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\n\r\n");
  EXPECT_EQ(bad.read_until("\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u) << bad.received();
  EXPECT_EQ(bad.received().find("Access-Control"), std::string::npos);
}

TEST(HttpAccessLog, OneLinePerRequestWithStatusLatencyIdAndTokens) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient c(h.port());
  c.send(post("/v1/completions", R"({"prompt":"hi","max_tokens":5})", "X-Request-Id: abc-1\r\n") +
         post("/v1/completions", R"({"prompt":"hi","max_tokens":3,"stream":true})") +
         "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  c.read_until("No route");
  ASSERT_TRUE(test::eventually([&] { return h.log_lines().size() == 3; })) << h.log_lines().size();
  const auto lines = h.log_lines();
  EXPECT_NE(lines[0].find("\"POST /v1/completions HTTP/1.1\" 200 "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("ms id=abc-1 in=1 out=5"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[0].rfind("127.0.0.1:", 0), 0u) << lines[0];
  EXPECT_NE(lines[1].find(" 200 "), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("id=cmpl-"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("out=3"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("\"GET /nope HTTP/1.1\" 404 "), std::string::npos) << lines[2];
}

TEST(HttpAccessLog, DisconnectsAreLoggedAndQuietMeansNoLines) {
  M3_REQUIRE_TOKENIZER();
  {
    Harness h;
    RawClient c(h.port());
    c.send(post("/v1/completions", R"({"prompt":"hi","max_tokens":4000})"));
    ASSERT_TRUE(test::eventually([&] { return h.backend().submitted() == 1; }));
    c.close();
    ASSERT_TRUE(test::eventually([&] { return h.log_lines().size() == 1; }));
    EXPECT_NE(h.log_lines()[0].find(" 499 "), std::string::npos) << h.log_lines()[0];
    EXPECT_NE(h.log_lines()[0].find("client_disconnect"), std::string::npos) << h.log_lines()[0];
  }
  Harness q([](HttpServerConfig& c) { c.log_requests = false; });
  EXPECT_EQ(get(q.port(), "/health").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_TRUE(q.log_lines().empty());
}

TEST(HttpAccessLog, ControlCharactersCannotForgeLogLines) {
  AccessRecord r;
  r.peer = "127.0.0.1:1";
  r.method = "GET";
  r.target = "/x\nfake line";
  r.request_id = "a\"b";
  const std::string line = access_log_line(r);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_NE(line.find("\\x0a"), std::string::npos) << line;
}

TEST(CrashHandlerDeathTest, LogsTheSignalAndABacktraceThenDiesOfIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_crash_handler();
        std::raise(SIGSEGV);
      },
      ::testing::KilledBySignal(SIGSEGV), "fatal signal 11 \\(SEGV\\), backtrace:");
}

TEST(TemplateSafety, KwargsCannotReplaceValidatedTemplateVariables) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  for (const char* key : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "documents"}) {
    RawClient c(h.port());
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{")") +
                             key + R"(":[null]}})";
    c.send(post("/v1/chat/completions", body));
    const std::string got = c.read_until("}}");
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << key << " → " << got;
    EXPECT_NE(got.find("\"param\":\"chat_template_kwargs\""), std::string::npos) << got;
  }
  EXPECT_EQ(h.backend().submitted(), 0);
}

TEST(TemplateSafety, RenderErrorsDoNotRevealTheServersFilePaths) {
  M3_REQUIRE_TOKENIZER();
  ServiceConfig sc = test::service_config();
  const std::string path = "/srv/secret/models/m3/chat_template.jinja";
  sc.chat_template = std::make_shared<const ChatTemplate>(
      ChatTemplate::parse("{% for c in messages | length %}{{ c }}{% endfor %}", path));
  OpenAIService svc(sc);
  try {
    svc.prepare(ApiKind::Chat, R"({"messages":[{"role":"user","content":"hi"}]})");
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("/srv/secret"), std::string::npos) << msg;
    EXPECT_NE(msg.find("chat_template.jinja"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not iterable"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace m3::server
