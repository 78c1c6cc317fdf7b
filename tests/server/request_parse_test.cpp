// The validation layer: request JSON → ParsedRequest, or a 4xx ApiError that names the field.
#include <gtest/gtest.h>

#include "server/request_parse.h"

namespace m3::server {
namespace {

ApiLimits limits() {
  ApiLimits l;
  l.model_name = "m3-test";
  l.max_model_len = 1000;
  l.vocab_size = 5000;
  return l;
}

// Runs `f`, expects an ApiError with `status` whose param is `param`; returns the message.
template <typename F>
std::string expect_error(F&& f, int status, const std::string& param) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << e.what();
    EXPECT_EQ(e.param, param) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no ApiError thrown";
  return {};
}

std::string chat_err(const std::string& body, int status, const std::string& param) {
  return expect_error([&] { parse_chat_request(body, limits()); }, status, param);
}

const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::string chat(const std::string& extra) {
  return std::string("{\"model\":\"m3-test\",") + kMsgs + (extra.empty() ? "" : "," + extra) + "}";
}

TEST(RequestParse, ValidChatRequestFillsEveryField) {
  auto r = parse_chat_request(
      chat(R"("stream":true,"stream_options":{"include_usage":true},"n":2,"max_completion_tokens":50,
              "temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.1,"seed":7,"presence_penalty":0.5,
              "frequency_penalty":-0.5,"repetition_penalty":1.1,"stop":["END","###"],"stop_token_ids":[3,4],
              "logit_bias":{"17":-100,"18":5.5},"ignore_eos":true,"min_tokens":2,"logprobs":true,"top_logprobs":3,
              "priority":-1,"chat_template_kwargs":{"thinking_mode":"enabled"})"),
      limits());
  EXPECT_EQ(r.kind, ApiKind::Chat);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.max_tokens, 50);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.gen.sampling.min_p, 0.1f);
  EXPECT_EQ(r.gen.sampling.seed, 7u);
  EXPECT_FLOAT_EQ(r.gen.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.gen.repetition_penalty, 1.1f);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END", "###"}));
  EXPECT_EQ(r.gen.stop_token_ids, (std::vector<int32_t>{3, 4}));
  ASSERT_EQ(r.gen.logit_bias.size(), 2u);
  EXPECT_TRUE(r.gen.ignore_eos);
  EXPECT_EQ(r.gen.min_tokens, 2);
  EXPECT_EQ(r.gen.top_logprobs, 3);
  EXPECT_EQ(r.priority, -1);
  EXPECT_EQ(r.chat_template_kwargs["thinking_mode"], "enabled");
  EXPECT_EQ(r.messages.size(), 1u);
}

TEST(RequestParse, UnknownFieldsAreIgnoredAndNullMeansDefault) {
  auto r = parse_chat_request(chat(R"("some_future_field":{"x":1},"temperature":null,"user":"bob")"), limits());
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 1.0f);
  EXPECT_EQ(r.gen.top_logprobs, -1);  // no logprobs unless asked
}

TEST(RequestParse, WrongTypesNameTheField) {
  EXPECT_NE(chat_err(chat(R"("temperature":"hot")"), 400, "temperature").find("number"), std::string::npos);
  chat_err(chat(R"("stream":"yes")"), 400, "stream");
  chat_err(chat(R"("max_tokens":1.5)"), 400, "max_tokens");
  chat_err(chat(R"("n":"2")"), 400, "n");
  chat_err(chat(R"("stop":5)"), 400, "stop");
  chat_err(chat(R"("stop":[""])"), 400, "stop");
  chat_err(chat(R"("logit_bias":[1,2])"), 400, "logit_bias");
  chat_err(chat(R"("logit_bias":{"abc":1})"), 400, "logit_bias");
  chat_err(chat(R"("seed":"x")"), 400, "seed");
  chat_err(chat(R"("tools":{})"), 400, "tools");
  chat_err(chat(R"("chat_template_kwargs":[])"), 400, "chat_template_kwargs");
  chat_err(R"({"model":"m3-test","messages":"hello"})", 400, "messages");
}

TEST(RequestParse, OutOfRangeSamplingValuesAreRejected) {
  EXPECT_NE(chat_err(chat(R"("temperature":2.5)"), 400, "temperature").find("2.5"), std::string::npos);
  chat_err(chat(R"("temperature":-0.1)"), 400, "temperature");
  chat_err(chat(R"("top_p":0)"), 400, "top_p");
  chat_err(chat(R"("top_p":1.01)"), 400, "top_p");
  chat_err(chat(R"("top_k":-2)"), 400, "top_k");
  chat_err(chat(R"("min_p":1.5)"), 400, "min_p");
  chat_err(chat(R"("presence_penalty":3)"), 400, "presence_penalty");
  chat_err(chat(R"("frequency_penalty":-2.1)"), 400, "frequency_penalty");
  chat_err(chat(R"("repetition_penalty":0)"), 400, "repetition_penalty");
  chat_err(chat(R"("n":0)"), 400, "n");
  chat_err(chat(R"("n":1000)"), 400, "n");
  chat_err(chat(R"("max_tokens":0)"), 400, "max_tokens");
  chat_err(chat(R"("max_tokens":5000)"), 400, "max_tokens");
  chat_err(chat(R"("max_tokens":5,"min_tokens":6)"), 400, "min_tokens");
  chat_err(chat(R"("stop_token_ids":[5000])"), 400, "stop_token_ids");
  chat_err(chat(R"("logit_bias":{"1":101})"), 400, "logit_bias");
  chat_err(chat(R"("logprobs":true,"top_logprobs":21)"), 400, "top_logprobs");
  chat_err(chat(R"("top_logprobs":2)"), 400, "top_logprobs");  // needs logprobs: true
  chat_err(chat(R"("max_tokens":3,"max_completion_tokens":4)"), 400, "max_completion_tokens");
  chat_err(chat(R"("stream_options":{"include_usage":true})"), 400, "stream_options");  // without stream
  chat_err(chat(R"("chat_template_kwargs":{"thinking_mode":"sometimes"})"), 400, "chat_template_kwargs");
}

TEST(RequestParse, MalformedJsonAndInvalidUtf8Are400) {
  EXPECT_NE(chat_err("{\"model\": ", 400, "").find("not valid JSON"), std::string::npos);
  chat_err("[1,2,3]", 400, "");
  chat_err(R"({"messages":[{"role":"user","content":"x"}],"temperature":1e99999})", 400, "");  // found by fuzzing
  chat_err("", 400, "");
  std::string bad = std::string(R"({"model":"m3-test","messages":[{"role":"user","content":")") + "\xff\xfe" +
                    R"("}]})";
  EXPECT_NE(chat_err(bad, 400, "").find("UTF-8"), std::string::npos);
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));        // overlong
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));    // surrogate
  EXPECT_TRUE(valid_utf8("h\xc3\xa9llo \xf0\x9f\x99\x82"));
}

TEST(RequestParse, UnknownModelIs404) {
  std::string msg = chat_err(std::string(R"({"model":"gpt-4",)") + kMsgs + "}", 404, "model");
  EXPECT_NE(msg.find("gpt-4"), std::string::npos);
  // An absent model means the served one.
  EXPECT_EQ(parse_chat_request(std::string("{") + kMsgs + "}", limits()).model, "m3-test");
}

TEST(RequestParse, MessagesAreValidated) {
  chat_err(R"({"messages":[]})", 400, "messages");
  chat_err(R"({})", 400, "messages");
  chat_err(R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages");
  chat_err(R"({"messages":[{"content":"x"}]})", 400, "messages");
  chat_err(R"({"messages":[{"role":"user"}]})", 400, "messages");
  chat_err(R"({"messages":[{"role":"user","content":null}]})", 400, "messages");
  // Media parts are validated here (the 400 for generation with media comes later, in OpenAIService::prepare);
  // audio and files are refused outright.
  chat_err(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", 400, "messages");
  chat_err(R"({"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]})", 400, "messages");
  chat_err(R"({"messages":[{"role":"user","content":[{"type":"hologram"}]}]})", 400, "messages");
  EXPECT_NO_THROW(parse_chat_request(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"video"}]}]})",
      limits()));
  // Content part arrays are kept for the template layer (server/chat_prompt.h); assistant content may be null
  // when it carries tool calls.
  auto r = parse_chat_request(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
            "function":{"name":"f","arguments":"{\"x\":1}"}}]},
          {"role":"tool","tool_call_id":"c1","content":"42"}]})",
      limits());
  EXPECT_EQ(r.messages[0]["content"].dump(), R"([{"type":"text","text":"a"},{"type":"text","text":"b"}])");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"]["x"], 1);  // parsed for the template
}

TEST(RequestParse, UnsupportedFeaturesAreRefusedNotIgnored) {
  const char* tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  chat_err(chat(R"("response_format":{"type":"structural_tag"})"), 400, "response_format");
  auto msg = chat_err(chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":
      {"type":"object","properties":{"d":{"type":"string","format":"date"}}}}})"), 400, "response_format");
  EXPECT_NE(msg.find("'format'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/properties/d"), std::string::npos) << msg;
  chat_err(chat(R"("guided_json":{})"), 400, "guided_json");
  EXPECT_NO_THROW(parse_chat_request(chat(R"("response_format":{"type":"text"})"), limits()));

  auto with_tools = parse_chat_request(chat(tools), limits());
  EXPECT_TRUE(with_tools.parse_tools);
  auto none = parse_chat_request(chat(std::string(tools) + R"(,"tool_choice":"none")"), limits());
  EXPECT_FALSE(none.parse_tools);
  EXPECT_FALSE(none.tools.is_null());  // still rendered into the prompt
}

// Structured outputs and forced tool calls compile to a grammar at parse time (constrained decoding).
TEST(RequestParse, ResponseFormatAndForcedToolChoiceCompileToGrammars) {
  const char* tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"n":{"type":"integer"}},"required":["n"]}}},{"type":"function","function":{"name":"g"}}])";
  auto text = parse_chat_request(chat(R"("response_format":{"type":"text"})"), limits());
  EXPECT_EQ(text.grammar, nullptr);
  auto obj = parse_chat_request(chat(R"("response_format":{"type":"json_object"})"), limits());
  ASSERT_NE(obj.grammar, nullptr);
  EXPECT_EQ(obj.grammar_key, "json_object");
  auto sch = parse_chat_request(chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"x",
      "strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}})"),
                                limits());
  ASSERT_NE(sch.grammar, nullptr);
  EXPECT_NE(sch.grammar_key.find("\"a\""), std::string::npos);
  auto req = parse_chat_request(chat(std::string(tools) + R"(,"tool_choice":"required")"), limits());
  ASSERT_NE(req.grammar, nullptr);
  EXPECT_TRUE(req.parse_tools);
  auto named = parse_chat_request(
      chat(std::string(tools) + R"(,"tool_choice":{"type":"function","function":{"name":"g"}})"), limits());
  ASSERT_NE(named.grammar, nullptr);
  EXPECT_NE(named.grammar_key, req.grammar_key);
  chat_err(chat(std::string(tools) + R"(,"tool_choice":{"type":"function","function":{"name":"h"}})"), 400,
           "tool_choice");  // not among the tools
  chat_err(chat(R"("tool_choice":"required")"), 400, "tool_choice");  // no tools
  chat_err(chat(std::string(tools) + R"(,"tool_choice":"required","response_format":{"type":"json_object"})"), 400,
           "tool_choice");
  chat_err(chat(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string",
      "pattern":"^a"}}})"), 400, "response_format");
}

TEST(RequestParse, DefaultThinkingModeAppliesOnlyWhenTheRequestHasNone) {
  ApiLimits l = limits();
  l.default_thinking_mode = "disabled";
  EXPECT_EQ(parse_chat_request(chat(""), l).chat_template_kwargs["thinking_mode"], "disabled");
  EXPECT_EQ(parse_chat_request(chat(R"("chat_template_kwargs":{"thinking_mode":"enabled"})"), l)
                .chat_template_kwargs["thinking_mode"],
            "enabled");
}

TEST(RequestParse, CompletionPromptForms) {
  auto l = limits();
  auto r = parse_completion_request(R"({"prompt":"hello","logprobs":2,"echo":true})", l);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(r.prompts[0]), "hello");
  EXPECT_EQ(r.gen.top_logprobs, 2);
  EXPECT_TRUE(r.echo);
  r = parse_completion_request(R"({"prompt":[1,2,3]})", l);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]), (std::vector<int32_t>{1, 2, 3}));
  r = parse_completion_request(R"({"prompt":["a","b"],"n":3})", l);
  EXPECT_EQ(r.num_choices(), 6);
  expect_error([&] { parse_completion_request(R"({"prompt":[1,99999]})", l); }, 400, "prompt");
  expect_error([&] { parse_completion_request(R"({"prompt":[]})", l); }, 400, "prompt");
  expect_error([&] { parse_completion_request(R"({"prompt":7})", l); }, 400, "prompt");
  expect_error([&] { parse_completion_request(R"({})", l); }, 400, "prompt");
  expect_error([&] { parse_completion_request(R"({"prompt":"x","logprobs":true})", l); }, 400, "logprobs");
  expect_error([&] { parse_completion_request(R"({"prompt":"x","logprobs":30})", l); }, 400, "logprobs");
}

TEST(RequestParse, ContextLengthCheckGivesTheNumbers) {
  ParsedRequest r = parse_chat_request(chat(R"("max_tokens":300)"), limits());
  EXPECT_EQ(resolve_max_tokens(r, 700, 1000), 300);
  std::string msg = expect_error([&] { resolve_max_tokens(r, 701, 1000); }, 400, "messages");
  EXPECT_NE(msg.find("1000"), std::string::npos);
  EXPECT_NE(msg.find("1001"), std::string::npos);
  EXPECT_NE(msg.find("701"), std::string::npos);
  expect_error([&] { resolve_max_tokens(r, 1000, 1000); }, 400, "messages");
  ParsedRequest d = parse_chat_request(chat(""), limits());
  EXPECT_EQ(resolve_max_tokens(d, 100, 1000), 900);  // chat default: the rest of the context
  ParsedRequest c = parse_completion_request(R"({"prompt":"x"})", limits());
  EXPECT_EQ(resolve_max_tokens(c, 100, 1000), 16);  // completions default, like OpenAI
}

TEST(RequestParse, ErrorBodyHasOpenAIShape) {
  ApiError e(400, "bad \xff value", "temperature");
  auto j = nlohmann::json::parse(error_body(e));
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"].contains("code"));
  auto k = nlohmann::json::parse(error_body(ApiError(404, "nope", "model", "model_not_found")));
  EXPECT_EQ(k["error"]["type"], "not_found_error");
  EXPECT_EQ(k["error"]["code"], "model_not_found");
}

// `depth` levels of arrays around a number: "[[[...1...]]]".
std::string nested(int depth) { return std::string(size_t(depth), '[') + "1" + std::string(size_t(depth), ']'); }

TEST(RequestParse, DeeplyNestedJsonIsRefusedBeforeItIsParsedAnywhere) {
  // 60k levels crashed the server (stack overflow in the recursive copy of the value); every place that copies a
  // client value must be behind the depth check, so try each of them.
  const std::string deep = nested(60000);
  const std::vector<std::string> bodies = {
      chat(R"("chat_template_kwargs":{"x":)" + deep + "}"),
      R"({"messages":[{"role":"user","content":"hi","extra":)" + deep + "}]}",
      R"({"messages":[{"role":"user","content":)" + deep + "}]}",
      chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"p":)" + deep + "}}}]"),
  };
  for (const auto& b : bodies) {
    std::string msg = expect_error([&] { parse_chat_request(b, limits()); }, 400, "");
    EXPECT_NE(msg.find("nested deeper than 256 levels"), std::string::npos) << msg;
  }
  expect_error([&] { parse_completion_request(R"({"prompt":"x","logit_bias":)" + deep + "}", limits()); }, 400, "");
  expect_error([&] { parse_json_object(R"({"text":)" + deep + "}"); }, 400, "");
  // The limit is exact: 256 levels in all (the body object is level 1) parse, 257 do not.
  EXPECT_NO_THROW(parse_json_object(R"({"x":)" + nested(255) + "}"));
  expect_error([&] { parse_json_object(R"({"x":)" + nested(256) + "}"); }, 400, "");
  // Brackets inside strings are text, not nesting.
  EXPECT_NO_THROW(parse_chat_request(chat(R"("user":")" + std::string(1000, '[') + "\""), limits()));
}

TEST(RequestParse, DeeplyNestedToolCallArgumentsStringIsRefused) {
  // OpenAI sends tool-call arguments as a JSON string, which the parser decodes for the template: the same limit.
  std::string args = nested(5000);
  std::string body = R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c",)"
                     R"("type":"function","function":{"name":"f","arguments":")" + args + R"("}}]}]})";
  std::string msg = expect_error([&] { parse_chat_request(body, limits()); }, 400, "messages");
  EXPECT_NE(msg.find("tool_calls[0].function.arguments is nested deeper"), std::string::npos) << msg;
}

}  // namespace
}  // namespace m3::server
