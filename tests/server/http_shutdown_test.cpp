// Graceful shutdown (HttpServer::shutdown, what SIGTERM/SIGINT run in m3serve serve) and disconnect detection,
// over raw loopback sockets: every client gets a complete HTTP answer, and no generation runs for nobody.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "http_test_harness.h"

namespace m3::server {
namespace {

using namespace std::chrono_literals;
using test::count_of;
using test::Harness;
using test::post;
using test::RawClient;

const std::string kLongStream = R"({"prompt":"hi","max_tokens":4000,"stream":true})";
const std::string kLongPlain = R"({"prompt":"hi","max_tokens":4000})";

using test::eventually;

TEST(HttpShutdown, RequestsThatFinishWithinTheGracePeriodCompleteNormally) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient stream(h.port()), plain(h.port());
  stream.send(post("/v1/completions", R"({"prompt":"hi","max_tokens":30,"stream":true})"));
  plain.send(post("/v1/completions", R"({"prompt":"hi","max_tokens":30})"));
  ASSERT_TRUE(eventually([&] { return h.backend().submitted() == 2; }));
  EXPECT_TRUE(h.server().shutdown(5s));  // nothing had to be aborted
  ASSERT_TRUE(stream.read_to_close());
  ASSERT_TRUE(plain.read_to_close());
  EXPECT_NE(stream.received().find(R"("finish_reason":"length")"), std::string::npos) << stream.received();
  EXPECT_NE(stream.received().find("data: [DONE]\n\n\r\n0\r\n\r\n"), std::string::npos);
  EXPECT_NE(plain.received().find("HTTP/1.1 200"), std::string::npos) << plain.received();
  EXPECT_NE(plain.received().find("Connection: close"), std::string::npos);
  EXPECT_NE(plain.received().find(R"("finish_reason":"length")"), std::string::npos);
  EXPECT_TRUE(h.backend().aborted().empty());
}

TEST(HttpShutdown, AfterTheGracePeriodStreamsEndWithAbortDoneAndTheLastChunk) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient a(h.port()), b(h.port());
  a.send(post("/v1/chat/completions",
              R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4000,"stream":true,"n":2})"));
  b.send(post("/v1/completions", kLongStream));
  ASSERT_NE(a.read_until("\"content\":\" ", 2s).find("\"content\":\" "), std::string::npos);
  ASSERT_NE(b.read_until("\"text\"", 2s).find("\"text\""), std::string::npos);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(h.server().shutdown(100ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  for (RawClient* c : {&a, &b}) {
    ASSERT_TRUE(c->read_to_close());
    const std::string& got = c->received();
    EXPECT_GE(count_of(got, R"("finish_reason":"abort")"), 1) << got.substr(got.size() > 600 ? got.size() - 600 : 0);
    // [DONE] is the last event and the chunked body ends properly.
    ASSERT_GT(got.size(), 21u);
    EXPECT_EQ(got.substr(got.size() - 21), "data: [DONE]\n\n\r\n0\r\n\r\n") << got.substr(got.size() - 200);
  }
  EXPECT_EQ(count_of(a.received(), R"("finish_reason":"abort")"), 2);  // both choices
  EXPECT_EQ(h.server().counters().shutdown_aborts.load(), 2u);
  // The engine was told to stop all three choices.
  EXPECT_TRUE(eventually([&] { return h.backend().aborted().size() == 3; })) << h.backend().aborted().size();
}

TEST(HttpShutdown, AfterTheGracePeriodNonStreamingRequestsGetA503JsonError) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient c(h.port());
  c.send(post("/v1/completions", kLongPlain));
  ASSERT_TRUE(eventually([&] { return h.backend().submitted() == 1; }));
  EXPECT_FALSE(h.server().shutdown(50ms));
  ASSERT_TRUE(c.read_to_close());
  const std::string& got = c.received();
  ASSERT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("Connection: close"), std::string::npos);
  auto body = nlohmann::json::parse(got.substr(got.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["error"]["code"], "shutting_down");
  EXPECT_EQ(count_of(got, "HTTP/1.1"), 1);
}

TEST(HttpShutdown, NewConnectionsAreRefusedAndIdleOnesClosedWhileDraining) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient idle(h.port());  // kept alive after one request
  idle.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_NE(idle.read_until("\r\n\r\n").find("200"), std::string::npos);
  RawClient busy(h.port());
  busy.send(post("/v1/completions", kLongStream));
  busy.read_until("\"text\"");
  auto done = std::async(std::launch::async, [&] { return h.server().shutdown(400ms); });
  ASSERT_TRUE(eventually([&] { return h.server().draining(); }));
  EXPECT_TRUE(idle.read_to_close(1s));
  // A connection arriving now is refused by the kernel (the listening socket is closed) or, if it raced the
  // close, answered 503 / closed — never served.
  std::this_thread::sleep_for(20ms);
  try {
    RawClient late(h.port());
    late.send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    late.read_to_close(2s);
    EXPECT_EQ(late.received().find("HTTP/1.1 200"), std::string::npos) << late.received();
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), boost::asio::error::connection_refused) << e.what();
  }
  EXPECT_FALSE(done.get());
  EXPECT_TRUE(busy.read_to_close());
  EXPECT_NE(busy.received().find("data: [DONE]"), std::string::npos);
}

TEST(HttpShutdown, ARequestOnAnOpenConnectionDuringDrainGets503) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient busy(h.port()), other(h.port());
  busy.send(post("/v1/completions", kLongStream));
  busy.read_until("\"text\"");
  other.send("GET /v1/mod");  // half a request when shutdown begins
  ASSERT_TRUE(eventually([&] { return h.server().counters().connections_active.load() == 2; }));
  auto done = std::async(std::launch::async, [&] { return h.server().shutdown(300ms); });
  ASSERT_TRUE(eventually([&] { return h.server().draining(); }));
  other.send("els HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(other.read_to_close(2s));
  EXPECT_EQ(other.received().rfind("HTTP/1.1 503", 0), 0u) << other.received() << ::testing::PrintToString(h.log_lines());
  EXPECT_NE(other.received().find("Retry-After: 1"), std::string::npos);
  done.get();
}

TEST(HttpDisconnect, PipelinedBytesDoNotHideAClientThatWentAway) {
  // A non-streaming request followed by a pipelined one, then the client leaves: the generation must stop.
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient c(h.port());
  c.send(post("/v1/completions", kLongPlain) + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(eventually([&] { return h.backend().submitted() == 1; }));
  c.close();
  EXPECT_TRUE(eventually([&] { return h.backend().aborted().size() == 1; }, 2s));
  EXPECT_EQ(h.server().counters().client_disconnects.load(), 1u);
}

TEST(HttpDisconnect, MorePipelinedBytesThanTheBufferHoldsStillDetectsTheClientLeaving) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient c(h.port());
  std::string pipelined;
  while (pipelined.size() < 100000) pipelined += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  c.send(post("/v1/completions", kLongPlain) + pipelined);
  ASSERT_TRUE(eventually([&] { return h.backend().submitted() == 1; }));
  c.close();
  EXPECT_TRUE(eventually([&] { return h.backend().aborted().size() == 1; }, 3s));
}

TEST(HttpDisconnect, PipelinedRequestsAreStillAnsweredInOrder) {
  M3_REQUIRE_TOKENIZER();
  Harness h;
  RawClient c(h.port());
  c.send(post("/v1/completions", R"({"prompt":"hi","max_tokens":20})") + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
         post("/v1/completions", R"({"prompt":"hi","max_tokens":3,"stream":true})"));
  const std::string got = c.read_until("data: [DONE]");
  const size_t first = got.find("\"text_completion\""), health = got.find("Content-Length: 0"),
               stream = got.find("text/event-stream");
  ASSERT_NE(first, std::string::npos) << got;
  ASSERT_NE(health, std::string::npos) << got;
  ASSERT_NE(stream, std::string::npos) << got;
  EXPECT_LT(first, health);
  EXPECT_LT(health, stream);
  EXPECT_TRUE(h.backend().aborted().empty());
}

}  // namespace
}  // namespace m3::server
