// Constrained decoding over HTTP: response_format json_schema and tool_choice required / named reach the engine as
// a grammar constraint over the real (Qwen3) vocabulary, and what comes back — content, or tool_calls after M3's
// output parser — satisfies the schema. The engine is a stand-in that samples uniformly among the tokens the
// request's constraint allows (what any model's logits become after the mask), so only the constraint shapes it.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <random>

#include "../grammar/reference_validator.h"
#include "grammar/constraint.h"
#include "server/http_server.h"
#include "server_test_util.h"

namespace m3::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using J = nlohmann::ordered_json;

// Each request on its own thread: mask → a random allowed token (short tokens half of the time, so documents end
// soon) → advance, until EOS or max_tokens. Requests without a constraint get EOS at once.
class MaskSamplingBackend : public GenerationBackend {
 public:
  ~MaskSamplingBackend() override {
    for (auto& t : threads_) t.join();
  }
  void submit(EngineRequest req, OutputSink sink) override {
    std::lock_guard<std::mutex> l(mu_);
    ++submitted_;
    last_constraint_ = req.constraint;
    threads_.emplace_back([req = std::move(req), sink = std::move(sink)] {
      const int32_t eos = req.constraint ? req.constraint->grammar->vocab().eos() : 0;
      EngineOutput o;
      o.prompt_tokens = int(req.prompt.size());
      if (!req.constraint) {
        o.finish = FinishReason::Stop;
        sink(o);
        return;
      }
      grammar::Constraint c(req.constraint);
      const grammar::TokenVocab& v = req.constraint->grammar->vocab();
      std::vector<uint32_t> mask(size_t(v.words()));
      std::mt19937_64 rng(*req.params.sampling.seed);
      for (int step = 0; step < req.params.max_tokens; ++step) {
        EXPECT_TRUE(c.active());
        c.fill_mask(mask.data());
        std::vector<int32_t> all, shorter;
        for (int32_t w = 0; w < v.words(); ++w)
          for (uint32_t x = mask[size_t(w)]; x; x &= x - 1) {
            const int32_t id = w * 32 + __builtin_ctz(x);
            all.push_back(id);
            if (id != eos && v.usable(id) && v.bytes(id).size() <= 2) shorter.push_back(id);
          }
        EXPECT_FALSE(all.empty());
        if (all.empty()) break;
        const bool eos_ok = std::find(all.begin(), all.end(), eos) != all.end();
        const auto& pick = !shorter.empty() && rng() % 2 ? shorter : all;
        const int32_t id = eos_ok ? eos : pick[rng() % pick.size()];
        EXPECT_TRUE(c.accept(id));
        o.completion_tokens = step + 1;
        o.tokens = {id};
        if (id == eos) {
          o.finish = FinishReason::Stop;
          sink(o);
          return;
        }
        sink(o);
      }
      o.tokens.clear();
      o.finish = FinishReason::Length;
      sink(o);
    });
  }
  void abort(const std::string&) override {}
  EngineMetrics metrics() const override { return {}; }
  std::shared_ptr<const grammar::ConstraintSpec> last_constraint() {
    std::lock_guard<std::mutex> l(mu_);
    return last_constraint_;
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
  int submitted_ = 0;
  std::shared_ptr<const grammar::ConstraintSpec> last_constraint_;
};

std::pair<int, J> post(uint16_t port, const J& body) {
  net::io_context ioc;
  beast::tcp_stream s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  s.expires_after(std::chrono::seconds(30));
  http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.body() = body.dump();
  req.prepare_payload();
  http::write(s, req);
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(s, buf, res);
  return {res.result_int(), J::parse(res.body(), nullptr, false)};
}

class HttpGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    M3_REQUIRE_TOKENIZER();
    ServiceConfig sc = test::service_config();
    sc.eos_token_id = test::qwen_tokenizer()->token_to_id("<|im_end|>").value_or(0);
    service_ = std::make_unique<OpenAIService>(sc);
    backend_ = std::make_unique<MaskSamplingBackend>();
    HttpServerConfig hc;
    hc.port = 0;
    hc.max_body_bytes = 1 << 20;
    server_ = std::make_unique<HttpServer>(hc, *service_, *backend_);
    server_->start();
  }
  void TearDown() override {
    if (server_) server_->stop();
    backend_.reset();
    server_.reset();
  }
  std::unique_ptr<OpenAIService> service_;
  std::unique_ptr<MaskSamplingBackend> backend_;
  std::unique_ptr<HttpServer> server_;
};

const J kSchema = J::parse(R"({"type": "object", "properties": {
    "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1},
    "hourly": {"type": "boolean"}, "levels": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    "where": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pos"}]}},
  "required": ["unit", "days", "where"], "additionalProperties": false,
  "$defs": {"pos": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat", "lon"]}}})");

TEST_F(HttpGrammarTest, JsonSchemaResponseFormatReturnsSchemaValidContent) {
  for (int seed = 0; seed < 6; ++seed) {
    auto [status, body] =
        post(server_->port(),
             {{"model", "m3-test"},
              {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
              {"max_tokens", 3000},
              {"seed", seed},
              {"response_format",
               {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"strict", true}, {"schema", kSchema}}}}}});
    ASSERT_EQ(status, 200) << body.dump();
    ASSERT_EQ(body["choices"][0]["finish_reason"], "stop") << body.dump();
    const std::string content = body["choices"][0]["message"]["content"];
    const J doc = J::parse(content, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << content;
    EXPECT_TRUE(m3::test::schema_valid(doc, kSchema, kSchema)) << content;
  }
  // A refused schema feature is a 400 naming it.
  auto [status, body] = post(
      server_->port(), {{"model", "m3-test"},
                        {"messages", {{{"role", "user"}, {"content", "x"}}}},
                        {"response_format",
                         {{"type", "json_schema"},
                          {"json_schema", {{"name", "w"}, {"schema", {{"type", "string"}, {"pattern", "^a+$"}}}}}}}});
  EXPECT_EQ(status, 400);
  EXPECT_NE(body.dump().find("pattern"), std::string::npos) << body.dump();
}

TEST_F(HttpGrammarTest, ToolChoiceRequiredAndNamedReturnToolCallsWithValidArguments) {
  const J params = J::parse(R"({"type": "object", "properties": {"days": {"type": "integer", "minimum": 0},
      "unit": {"enum": ["c", "f"]}, "hourly": {"type": "boolean"}}, "required": ["days", "unit"]})");
  const J tools = {
      {{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", params}}}},
      {{"type", "function"},
       {"function",
        {{"name", "get_time"},
         {"parameters",
          {{"type", "object"}, {"properties", {{"utc", {{"type", "boolean"}}}}}, {"required", {"utc"}}}}}}}};
  const J choices[] = {"required", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}};
  for (const J& choice : choices) {
    for (int seed = 0; seed < 4; ++seed) {
      auto [status, body] = post(server_->port(), {{"model", "m3-test"},
                                                   {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
                                                   {"max_tokens", 3000},
                                                   {"seed", seed},
                                                   {"tools", tools},
                                                   {"parallel_tool_calls", false},
                                                   {"tool_choice", choice}});
      ASSERT_EQ(status, 200) << body.dump();
      const J& msg = body["choices"][0]["message"];
      ASSERT_EQ(body["choices"][0]["finish_reason"], "tool_calls") << body.dump();
      ASSERT_EQ(msg["tool_calls"].size(), 1u) << body.dump();
      const J& fn = msg["tool_calls"][0]["function"];
      if (choice.is_object()) EXPECT_EQ(fn["name"], "get_weather");
      const J args = J::parse(fn["arguments"].get<std::string>(), nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << body.dump();
      const J& schema = fn["name"] == "get_weather" ? params : tools[1]["function"]["parameters"];
      EXPECT_TRUE(m3::test::schema_valid(args, schema, schema)) << fn.dump();
    }
  }
}

}  // namespace
}  // namespace m3::server
