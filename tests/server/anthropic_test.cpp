// The Anthropic Messages API front end: request translation into the chat path's message structure, malformed
// bodies as 400s in Anthropic's error shape, the streaming event sequence, the non-streaming body as the fold of
// the same events, stop reasons, and count_tokens against the prompt /v1/messages runs.
#include <gtest/gtest.h>

#include "server/anthropic_job.h"
#include "server/anthropic_request.h"
#include "server/http_policy.h"
#include "server/openai_service.h"
#include "server_test_util.h"

namespace m3::server {
namespace {

using test::qwen_tokenizer;
using J = nlohmann::json;

const std::string NS = "]<]minimax[>[";

const char* kTools = R"([{"name":"get_weather","description":"Weather","input_schema":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}])";

std::vector<int32_t> ids_of(const std::string& s) { return qwen_tokenizer()->encode(s, false); }

struct Event {
  std::string name;
  J data;
};

// Splits SSE bytes into (event name, JSON data); every event must have both lines and name == data.type.
std::vector<Event> parse_events(const std::string& bytes) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    std::string ev = bytes.substr(pos, end - pos);
    pos = end + 2;
    size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_NE(nl, std::string::npos) << ev;
    if (nl == std::string::npos) continue;
    Event e{ev.substr(7, nl - 7), J::parse(ev.substr(nl + 1 + 6))};
    EXPECT_EQ(ev.substr(nl + 1, 6), "data: ");
    EXPECT_EQ(e.data["type"], e.name);
    out.push_back(std::move(e));
  }
  return out;
}

// Feeds the ids of `text` one token per event, the last with `last`; returns the bytes and the abort ids.
std::string feed(GenerationJob& job, const std::string& text, FinishReason last,
                 std::vector<std::string>* aborts = nullptr) {
  std::string bytes;
  auto ids = ids_of(text);
  for (size_t i = 0; i < ids.size() && !job.done(); ++i) {
    EngineOutput o;
    o.tokens = {ids[i]};
    o.prompt_tokens = 12;
    o.cached_tokens = 5;
    if (i + 1 == ids.size()) o.finish = last;
    auto up = job.on_output(0, o);
    bytes += up.bytes;
    if (aborts) aborts->insert(aborts->end(), up.abort_ids.begin(), up.abort_ids.end());
  }
  return bytes;
}

std::unique_ptr<GenerationJob> job_for(const OpenAIService& svc, const std::string& body) {
  return make_anthropic_job(svc, body);
}

TEST(AnthropicRequest, TranslatesToTheSameChatMessagesAsTheEquivalentOpenAIRequest) {
  const std::string anthropic = std::string(R"({"model":"m3-test","max_tokens":100,
    "system":[{"type":"text","text":"Be brief."},{"type":"text","text":"Use tools."}],
    "messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"need the tool","signature":"x"},
                                     {"type":"text","text":"Checking."},
                                     {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},
                                {"type":"text","text":"And tomorrow?"}]}],
    "tools":)") + kTools + R"(,"tool_choice":{"type":"auto","disable_parallel_tool_use":true},
    "stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"top_k":40,"thinking":{"type":"enabled","budget_tokens":2000},
    "metadata":{"user_id":"u1"},"stream":true})";
  const std::string openai = R"({"model":"m3-test","max_tokens":100,"messages":[
      {"role":"system","content":"Be brief.\nUse tools."},
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":"Checking.","reasoning_content":"need the tool",
       "tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
      {"role":"user","content":"And tomorrow?"}],
    "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}],
    "tool_choice":"auto","parallel_tool_calls":false,"stop":["END"],"temperature":0.5,"top_p":0.9,"top_k":40,
    "chat_template_kwargs":{"thinking_mode":"enabled"},"stream":true})";
  ApiLimits lim;
  lim.model_name = "m3-test";
  AnthropicRequest a = translate_anthropic_request(anthropic, lim, false);
  EXPECT_TRUE(a.stream);
  ParsedRequest from_a = parse_chat_request(a.openai_body.dump(), lim);
  ParsedRequest from_o = parse_chat_request(openai, lim);
  EXPECT_EQ(from_a.messages, from_o.messages) << from_a.messages.dump(1) << "\nvs\n" << from_o.messages.dump(1);
  EXPECT_EQ(from_a.tools, from_o.tools);
  EXPECT_EQ(from_a.stop, from_o.stop);
  EXPECT_EQ(from_a.max_tokens, from_o.max_tokens);
  EXPECT_EQ(from_a.parse_tools, true);
  EXPECT_EQ(from_a.parallel_tool_calls, false);
  EXPECT_EQ(from_a.chat_template_kwargs, from_o.chat_template_kwargs);
  EXPECT_FLOAT_EQ(from_a.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(from_a.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(from_a.gen.sampling.top_k, 40);
  EXPECT_TRUE(from_a.stream);
}

// tool_choice any / tool become OpenAI's required / named function: the same constrained-decoding grammar.
TEST(AnthropicRequest, ToolChoiceAnyAndToolAreForcedToolCalls) {
  ApiLimits lim;
  lim.model_name = "m3-test";
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto parsed = [&](const std::string& choice) {
    const std::string body = std::string(R"({"max_tokens":5,"tools":)") + kTools + R"(,"tool_choice":)" + choice + "," +
                             msgs + "}";
    return parse_chat_request(translate_anthropic_request(body, lim, false).openai_body.dump(), lim);
  };
  const ParsedRequest any = parsed(R"({"type":"any"})");
  const ParsedRequest tool = parsed(R"({"type":"tool","name":"get_weather","disable_parallel_tool_use":true})");
  ASSERT_NE(any.grammar, nullptr);
  ASSERT_NE(tool.grammar, nullptr);
  EXPECT_NE(any.grammar_key, tool.grammar_key);  // parallel calls allowed vs one named call
  EXPECT_FALSE(tool.parallel_tool_calls);
  EXPECT_EQ(parsed(R"({"type":"auto"})").grammar, nullptr);
  try {
    parsed(R"({"type":"tool","name":"nope"})");
    ADD_FAILURE() << "an unknown tool name was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
  }
}

TEST(AnthropicRequest, MalformedBodiesAre400sNeverCrashes) {
  ApiLimits lim;
  lim.model_name = "m3-test";
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  struct Case {
    std::string body;
    std::string code;  // "" = any 400
  };
  const std::vector<Case> cases = {
      {"not json", ""},
      {"[1,2]", ""},
      {"{}", ""},
      {std::string(300, '[') + std::string(300, ']'), ""},
      {R"({"max_tokens":5,"messages":"hi"})", ""},
      {R"({"max_tokens":5,"messages":[]})", ""},
      {R"({"max_tokens":5,"messages":[1]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"system","content":"x"}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user"}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":5}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"text":"no type"}]}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":3}]}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
       "unsupported_parameter"},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":"{}"}]},{"role":"user","content":"b"}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]},{"role":"user","content":"b"}]})", ""},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"prefill"}]})",
       "unsupported_parameter"},
      {"{" + msgs + "}", ""},                                  // max_tokens missing
      {R"({"max_tokens":"5",)" + msgs + "}", ""},
      {R"({"max_tokens":5,"temperature":1.5,)" + msgs + "}", ""},
      {R"({"max_tokens":5,"stop_sequences":"END",)" + msgs + "}", ""},
      {R"({"max_tokens":5,"stop_sequences":[""],)" + msgs + "}", ""},
      {R"({"max_tokens":5,"system":7,)" + msgs + "}", ""},
      {R"({"max_tokens":5,"tools":{},)" + msgs + "}", ""},
      {R"({"max_tokens":5,"tools":[{"name":"f"}],)" + msgs + "}", ""},
      {R"({"max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],)" + msgs + "}",
       "unsupported_parameter"},
      {R"({"max_tokens":5,"tool_choice":"auto",)" + msgs + "}", ""},
      {R"({"max_tokens":5,"tool_choice":{"type":"sometimes"},)" + msgs + "}", ""},
      {R"({"max_tokens":5,"tool_choice":{"type":"any"},)" + msgs + "}", ""},          // needs tools
      {R"({"max_tokens":5,"tool_choice":{"type":"tool","name":"f"},)" + msgs + "}", ""},  // needs tools
      {R"({"max_tokens":5,"thinking":{"type":"maybe"},)" + msgs + "}", ""},
      {R"({"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":-1},)" + msgs + "}", ""},
      {R"({"max_tokens":5,"metadata":"x",)" + msgs + "}", ""},
      {R"({"max_tokens":5,"stream":"yes",)" + msgs + "}", ""},
  };
  for (const auto& c : cases) {
    try {
      AnthropicRequest a = translate_anthropic_request(c.body, lim, false);
      // What the translation lets through, the chat validation must refuse.
      parse_chat_request(a.openai_body.dump(), lim);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << c.body;
      if (!c.code.empty()) EXPECT_EQ(e.code, c.code) << c.body << ": " << e.what();
      J body = J::parse(anthropic_error_body(e));
      EXPECT_EQ(body["type"], "error");
      EXPECT_EQ(body["error"]["type"], "invalid_request_error");
      EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-API exception for " << c.body << ": " << e.what();
    }
  }
  // An unknown model is a 404 not_found_error.
  try {
    translate_anthropic_request(R"({"model":"other","max_tokens":5,)" + msgs + "}", lim, false);
    AnthropicRequest a = translate_anthropic_request(R"({"model":"other","max_tokens":5,)" + msgs + "}", lim, false);
    parse_chat_request(a.openai_body.dump(), lim);
    ADD_FAILURE() << "unknown model accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(J::parse(anthropic_error_body(e))["error"]["type"], "not_found_error");
  }
}

TEST(AnthropicRequest, ErrorTypesFollowTheStatus) {
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(413), "request_too_large");
  EXPECT_EQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_EQ(anthropic_error_type(500), "api_error");
  EXPECT_EQ(anthropic_error_type(503), "overloaded_error");
}

TEST(AnthropicRequest, XApiKeyIsAcceptedAlongsideBearer) {
  EXPECT_TRUE(api_key_accepted("", "sekrit", "sekrit"));
  EXPECT_TRUE(api_key_accepted("Bearer sekrit", "", "sekrit"));
  EXPECT_TRUE(api_key_accepted("Bearer wrong", "sekrit", "sekrit"));
  EXPECT_FALSE(api_key_accepted("", "", "sekrit"));
  EXPECT_FALSE(api_key_accepted("", "sekri", "sekrit"));
  EXPECT_FALSE(api_key_accepted("", "Bearer sekrit", "sekrit"));
  EXPECT_TRUE(api_key_accepted("", "", ""));  // no key configured
}

TEST(AnthropicJob, StreamingEventsComeInAnthropicsOrderWithThinkingTextAndToolUse) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto job = job_for(svc, std::string(R"({"model":"m3-test","max_tokens":200,"stream":true,
      "thinking":{"type":"enabled","budget_tokens":1024},"tools":)") + kTools +
                              R"(,"messages":[{"role":"user","content":"Weather?"}]})");
  ASSERT_TRUE(job->streaming());
  EXPECT_EQ(job->stream_prologue(), "");
  const std::string text = "Let me check.</mm:think>\n\nLooking it up." + NS + "<tool_call>\n" + NS +
                           "<invoke name=\"get_weather\">" + NS + "<city>Paris" + NS + "</city>" + NS + "<days>3" +
                           NS + "</days>" + NS + "</invoke>\n" + NS + "</tool_call>";
  auto events = parse_events(feed(*job, text, FinishReason::Stop));
  ASSERT_TRUE(job->done());
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.name);
  ASSERT_GE(events.size(), 10u);
  EXPECT_EQ(names[0], "message_start");
  EXPECT_EQ(names[1], "ping");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  const J& start = events[0].data["message"];
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["type"], "message");
  EXPECT_EQ(start["model"], "m3-test");
  EXPECT_TRUE(start["content"].empty());
  EXPECT_TRUE(start["stop_reason"].is_null());
  EXPECT_EQ(start["usage"]["input_tokens"], 7);  // 12 prompt tokens, 5 read from the cache
  EXPECT_EQ(start["usage"]["cache_read_input_tokens"], 5);
  EXPECT_EQ(start["id"].get<std::string>().rfind("msg_", 0), 0u);

  // Blocks: start → deltas → stop, indices 0, 1, 2, never interleaved.
  std::vector<J> blocks;
  std::vector<std::string> acc;
  int open = -1;
  for (size_t k = 2; k + 2 < events.size(); ++k) {
    const J& d = events[k].data;
    if (events[k].name == "content_block_start") {
      EXPECT_EQ(open, -1) << "block opened while another is open";
      open = d["index"];
      EXPECT_EQ(open, int(blocks.size()));
      blocks.push_back(d["content_block"]);
      acc.emplace_back();
    } else if (events[k].name == "content_block_delta") {
      EXPECT_EQ(d["index"], open);
      const J& delta = d["delta"];
      if (delta["type"] == "thinking_delta") acc.back() += delta["thinking"].get<std::string>();
      else if (delta["type"] == "text_delta") acc.back() += delta["text"].get<std::string>();
      else if (delta["type"] == "input_json_delta") acc.back() += delta["partial_json"].get<std::string>();
      else ADD_FAILURE() << delta.dump();
    } else if (events[k].name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      open = -1;
    } else {
      ADD_FAILURE() << "unexpected event " << events[k].name;
    }
  }
  EXPECT_EQ(open, -1);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0]["type"], "thinking");
  EXPECT_EQ(acc[0], "Let me check.");
  EXPECT_EQ(blocks[1]["type"], "text");
  EXPECT_EQ(acc[1], "Looking it up.");
  EXPECT_EQ(blocks[2]["type"], "tool_use");
  EXPECT_EQ(blocks[2]["name"], "get_weather");
  EXPECT_EQ(blocks[2]["input"], J::object());
  EXPECT_EQ(J::parse(acc[2]), J::parse(R"({"city":"Paris","days":3})"));
  // The arguments streamed as the parameters closed: `{"city":"Paris"`, `,"days":3`, `}`.
  int json_deltas = 0;
  for (const auto& e : events)
    if (e.name == "content_block_delta" && e.data["delta"]["type"] == "input_json_delta") ++json_deltas;
  EXPECT_EQ(json_deltas, 3);
  const J& md = events[events.size() - 2].data;
  EXPECT_EQ(md["delta"]["stop_reason"], "tool_use");
  EXPECT_TRUE(md["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(md["usage"]["output_tokens"], int(ids_of(text).size()));
}

TEST(AnthropicJob, NonStreamingBodyIsTheFoldOfTheSameBlocks) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto job = job_for(svc, std::string(R"({"model":"m3-test","max_tokens":200,
      "thinking":{"type":"enabled"},"tools":)") + kTools + R"(,"messages":[{"role":"user","content":"Weather?"}]})");
  ASSERT_FALSE(job->streaming());
  const std::string text = "hmm</mm:think>Sure." + NS + "<tool_call>" + NS + "<invoke name=\"get_weather\">" + NS +
                           "<city>Oslo" + NS + "</city>" + NS + "</invoke>" + NS + "</tool_call>";
  EXPECT_EQ(feed(*job, text, FinishReason::Stop), "");
  ASSERT_TRUE(job->done());
  auto [status, body] = job->final_response();
  EXPECT_EQ(status, 200);
  J m = J::parse(body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  ASSERT_EQ(m["content"].size(), 3u) << m.dump(1);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "hmm");
  EXPECT_EQ(m["content"][1], J::parse(R"({"type":"text","text":"Sure."})"));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["name"], "get_weather");
  EXPECT_EQ(m["content"][2]["input"], J::parse(R"({"city":"Oslo"})"));
  EXPECT_EQ(m["content"][2]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(m["usage"]["input_tokens"].get<int>() + m["usage"]["cache_read_input_tokens"].get<int>(), 12);
  EXPECT_EQ(m["usage"]["output_tokens"], int(ids_of(text).size()));
}

TEST(AnthropicJob, StopSequenceMaxTokensAndEndTurnAreReported) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  {
    auto job = job_for(svc, R"({"max_tokens":50,"stop_sequences":["END","zzz"],)" + msgs + "}");
    std::vector<std::string> aborts;
    feed(*job, "abc END more text", FinishReason::Length, &aborts);
    ASSERT_TRUE(job->done());
    EXPECT_EQ(aborts, std::vector<std::string>{job->engine_requests()[0].id});
    J m = J::parse(job->final_response().second);
    EXPECT_EQ(m["stop_reason"], "stop_sequence");
    EXPECT_EQ(m["stop_sequence"], "END");
    EXPECT_EQ(m["content"], J::parse(R"([{"type":"text","text":"abc "}])"));
  }
  {
    auto job = job_for(svc, R"({"max_tokens":50,)" + msgs + "}");
    feed(*job, "cut off", FinishReason::Length);
    J m = J::parse(job->final_response().second);
    EXPECT_EQ(m["stop_reason"], "max_tokens");
    EXPECT_TRUE(m["stop_sequence"].is_null());
  }
  {
    auto job = job_for(svc, R"({"max_tokens":50,)" + msgs + "}");
    feed(*job, "done.", FinishReason::Stop);
    J m = J::parse(job->final_response().second);
    EXPECT_EQ(m["stop_reason"], "end_turn");
    EXPECT_EQ(m["content"][0]["text"], "done.");
  }
  {  // No output at all: an empty content array, not a missing one.
    auto job = job_for(svc, R"({"max_tokens":50,)" + msgs + "}");
    EngineOutput o;
    o.finish = FinishReason::Stop;
    o.prompt_tokens = 3;
    job->on_output(0, o);
    J m = J::parse(job->final_response().second);
    EXPECT_TRUE(m["content"].is_array());
    EXPECT_TRUE(m["content"].empty());
  }
}

TEST(AnthropicJob, EngineErrorEndsTheStreamWithAnErrorEventAndIsA500Otherwise) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  auto stream = job_for(svc, R"({"max_tokens":50,"stream":true,)" + msgs + "}");
  feed(*stream, "partial", FinishReason::None);
  EngineOutput err;
  err.finish = FinishReason::Error;
  err.error = "device lost";
  auto events = parse_events(stream->on_output(0, err).bytes);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().name, "error");
  EXPECT_EQ(events.back().data["error"]["type"], "api_error");
  for (const auto& e : events) EXPECT_NE(e.name, "message_stop");
  EXPECT_TRUE(stream->done());
  EXPECT_TRUE(stream->unfinished_ids().empty());

  auto plain = job_for(svc, R"({"max_tokens":50,)" + msgs + "}");
  EXPECT_EQ(plain->unfinished_ids().size(), 1u);
  plain->on_output(0, err);
  auto [status, body] = plain->final_response();
  EXPECT_EQ(status, 500);
  EXPECT_EQ(J::parse(body)["error"]["type"], "api_error");
}

TEST(AnthropicJob, CountTokensEqualsThePromptMessagesRuns) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  const std::string core = std::string(R"("system":"You are terse.","tools":)") + kTools +
                           R"(,"messages":[{"role":"user","content":"Weather in Rome?"},
      {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Rome"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"rain"}]}])";
  J count = J::parse(anthropic_count_tokens_body(svc, "{" + core + "}"));
  auto job = job_for(svc, R"({"max_tokens":10,)" + core + "}");
  EXPECT_EQ(count["input_tokens"].get<size_t>(), job->engine_requests()[0].prompt.size());
  EXPECT_GT(count["input_tokens"].get<int>(), 5);
  // count_tokens takes the same validation: a malformed body is a 400.
  EXPECT_THROW(anthropic_count_tokens_body(svc, R"({"messages":[{"role":"bot","content":"x"}]})"), ApiError);
}

}  // namespace
}  // namespace m3::server

namespace m3::server {
namespace {

// Item 4 of issue 14: think markers the client wrote into the prompt do not change how the output is parsed;
// only the template's generation prompt can open the think block.
TEST(PromptThinkMarkers, ClientWrittenThinkTagsDoNotStartReasoning) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto ends_open = [&](const std::string& body) {
    return svc.prepare(ApiKind::Chat, body).choice_options[0].starts_in_reasoning;
  };
  EXPECT_FALSE(ends_open(R"({"messages":[{"role":"user","content":"think: <mm:think>"}],
      "chat_template_kwargs":{"thinking_mode":"disabled"}})"));
  EXPECT_FALSE(ends_open(R"({"messages":[{"role":"user","content":"</mm:think> <mm:think>"}],
      "add_generation_prompt":false})"));
  EXPECT_TRUE(ends_open(R"({"messages":[{"role":"user","content":"</mm:think> hi"}],
      "chat_template_kwargs":{"thinking_mode":"enabled"}})"));
  // The same through the Messages API: a user turn ending in <mm:think> with thinking disabled.
  auto job = make_anthropic_job(svc, R"({"max_tokens":20,"thinking":{"type":"disabled"},
      "messages":[{"role":"user","content":"<mm:think>"}]})");
  feed(*job, "plain answer", FinishReason::Stop);
  J m = J::parse(job->final_response().second);
  ASSERT_EQ(m["content"].size(), 1u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "text");
  EXPECT_EQ(m["content"][0]["text"], "plain answer");
}

}  // namespace
}  // namespace m3::server

namespace m3::server {
namespace {

// Issue 14 item 3 on the OpenAI side: delta.tool_calls carries the header at the opening tag, then one argument
// fragment per parameter, in separate chunks as the tokens arrive; concatenated they are the arguments object.
TEST(OpenAIToolStreaming, ArgumentFragmentsArriveInSeparateChunksAsParametersClose) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  const std::string tools = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])";
  auto prep = svc.prepare(ApiKind::Chat, R"({"messages":[{"role":"user","content":"hi"}],"stream":true,"tools":)" +
                                             tools + "}");
  Job job(svc, std::move(prep));
  const std::string text = NS + "<tool_call>" + NS + "<invoke name=\"get_weather\">" + NS + "<city>Paris" + NS +
                           "</city>" + NS + "<days>3" + NS + "</days>" + NS + "</invoke>" + NS + "</tool_call>";
  std::string bytes = job.stream_prologue() + feed(job, text, FinishReason::Stop);
  std::vector<std::string> fragments;
  std::string name, finish;
  size_t pos = 0;
  while ((pos = bytes.find("data: ", pos)) != std::string::npos) {
    size_t end = bytes.find("\n\n", pos);
    std::string data = bytes.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    J c = J::parse(data);
    for (const auto& ch : c["choices"]) {
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      if (!ch["delta"].contains("tool_calls")) continue;
      for (const auto& tc : ch["delta"]["tool_calls"]) {
        if (tc.contains("id")) name = tc["function"]["name"];
        const std::string a = tc["function"]["arguments"];
        if (!a.empty()) fragments.push_back(a);
      }
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(fragments.size(), 3u);
  std::string all;
  for (const auto& f : fragments) all += f;
  EXPECT_EQ(J::parse(all), J::parse(R"({"city":"Paris","days":3})"));
}

}  // namespace
}  // namespace m3::server
