// Output side: stop strings across token boundaries, reasoning split, SSE chunk shapes and usage.
#include <gtest/gtest.h>

#include "server/choice_stream.h"
#include "server/openai_service.h"
#include "server_test_util.h"

namespace m3::server {
namespace {

using test::qwen_tokenizer;

TEST(StopMatcher, MatchesAcrossPiecesAndExcludesTheStopString) {
  StopMatcher m({"STOP"}, false);
  std::string out = m.push("Hel");
  out += m.push("lo ST");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(out, "Hello ");  // "ST" held back: it could start "STOP"
  out += m.push("OP and more");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(out, "Hello ");
  EXPECT_EQ(m.push("ignored"), "");
}

TEST(StopMatcher, ReleasesHeldTextWhenItCannotBecomeAStop) {
  StopMatcher m({"STOP"}, false);
  EXPECT_EQ(m.push("a S"), "a ");
  EXPECT_EQ(m.push("x"), "Sx");
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.flush(), "ST");  // end of stream: held text is output
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, EarliestStopWinsAndIncludeStopKeepsIt) {
  StopMatcher m({"world", "lo w"}, true);
  EXPECT_EQ(m.push("hello world"), "hello w");
  EXPECT_EQ(m.matched_stop(), "lo w");
  StopMatcher none({}, false);
  EXPECT_EQ(none.push("anything"), "anything");
}

std::vector<int32_t> ids_of(const std::string& s) { return qwen_tokenizer()->encode(s, false); }

// Feeds `ids` one token per event; returns the concatenated deltas.
struct Collected {
  std::string text, reasoning, content;
  std::string finish;
  bool needs_abort = false;
};
Collected run(ChoiceStream& cs, const std::vector<int32_t>& ids, FinishReason last) {
  Collected c;
  for (size_t i = 0; i < ids.size() && !cs.finished(); ++i) {
    EngineOutput o;
    o.tokens = {ids[i]};
    o.prompt_tokens = 5;
    if (i + 1 == ids.size()) o.finish = last;
    ChoiceDelta d = cs.on_output(o);
    c.text += d.text;
    c.reasoning += d.parsed.reasoning;
    c.content += d.parsed.content;
    c.needs_abort |= d.needs_abort;
    if (d.finished) c.finish = d.finish_reason;
  }
  return c;
}

TEST(ChoiceStream, StopStringSplitOverTokensEndsTheChoice) {
  M3_REQUIRE_TOKENIZER();
  ChoiceOptions o;
  o.chat = false;
  o.stop = {"brown fox"};
  ChoiceStream cs(*qwen_tokenizer(), o);
  auto ids = ids_of("The quick brown fox jumps over the lazy dog");
  Collected c = run(cs, ids, FinishReason::Length);
  EXPECT_EQ(c.text, "The quick ");
  EXPECT_EQ(c.finish, "stop");
  EXPECT_TRUE(c.needs_abort);  // the engine request must be aborted
  EXPECT_LT(cs.completion_tokens(), int(ids.size()));
}

TEST(ChoiceStream, StopStringInTheLastFlushIsStillFound) {
  M3_REQUIRE_TOKENIZER();
  ChoiceOptions o;
  o.chat = false;
  o.stop = {"dog"};
  ChoiceStream cs(*qwen_tokenizer(), o);
  Collected c = run(cs, ids_of("lazy dog"), FinishReason::Length);
  EXPECT_EQ(c.text, "lazy ");
  EXPECT_EQ(c.finish, "stop");
}

TEST(ChoiceStream, ReasoningIsSplitFromContentWhenThePromptOpenedThink) {
  M3_REQUIRE_TOKENIZER();
  ChoiceOptions o;
  o.starts_in_reasoning = true;
  ChoiceStream cs(*qwen_tokenizer(), o);
  Collected c = run(cs, ids_of("Let me think.</mm:think>The answer is 4."), FinishReason::Stop);
  EXPECT_EQ(c.reasoning, "Let me think.");
  EXPECT_EQ(c.content, "The answer is 4.");
  EXPECT_EQ(c.finish, "stop");
  EXPECT_GT(cs.reasoning_tokens(), 0);
  EXPECT_LT(cs.reasoning_tokens(), cs.completion_tokens());
}

TEST(ChoiceStream, LengthAndAbortMapToFinishReasons) {
  M3_REQUIRE_TOKENIZER();
  ChoiceOptions o;
  o.chat = false;
  ChoiceStream a(*qwen_tokenizer(), o);
  EXPECT_EQ(run(a, ids_of("abc def"), FinishReason::Length).finish, "length");
  ChoiceStream b(*qwen_tokenizer(), o);
  EXPECT_EQ(run(b, ids_of("abc def"), FinishReason::Abort).finish, "abort");
}

// ---- Job: a whole request through prepare() + outputs ----------------------------------------------------------

struct Parsed {
  std::vector<nlohmann::json> events;
  bool done = false;
};
Parsed parse_sse(const std::string& bytes) {
  Parsed p;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    std::string ev = bytes.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    std::string data = ev.substr(6);
    if (data == "[DONE]") {
      p.done = true;
      continue;
    }
    EXPECT_FALSE(p.done) << "event after [DONE]";
    p.events.push_back(nlohmann::json::parse(data));
  }
  return p;
}

// Feeds the ids of `text` to every choice of `job`, one token per event, the last with `last`.
std::string feed(Job& job, const std::string& text, FinishReason last, std::vector<std::string>* aborts = nullptr) {
  std::string bytes;
  auto ids = ids_of(text);
  for (int c = 0; c < job.num_choices(); ++c)
    for (size_t i = 0; i < ids.size(); ++i) {
      EngineOutput o;
      o.tokens = {ids[i]};
      o.logprobs = {TokenLogprob{ids[i], -0.25f, {{ids[i], -0.25f}, {ids[i] + 1, -2.f}}}};
      o.prompt_tokens = 10;
      o.cached_tokens = 4;
      if (i + 1 == ids.size()) o.finish = last;
      auto up = job.on_output(c, o);
      bytes += up.bytes;
      if (aborts) aborts->insert(aborts->end(), up.abort_ids.begin(), up.abort_ids.end());
    }
  return bytes;
}

TEST(Job, StreamingChatHasRoleChunkDeltasFinishUsageAndDone) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto prep = svc.prepare(ApiKind::Chat, R"({"model":"m3-test","messages":[{"role":"user","content":"hi"}],
      "stream":true,"stream_options":{"include_usage":true},"n":2,"max_tokens":50,
      "chat_template_kwargs":{"thinking_mode":"enabled"}})");
  ASSERT_EQ(prep.engine_requests.size(), 2u);
  EXPECT_NE(prep.engine_requests[0].id, prep.engine_requests[1].id);
  EXPECT_EQ(prep.engine_requests[1].params.choice_index, 1u);
  EXPECT_EQ(prep.engine_requests[0].params.max_tokens, 50);
  EXPECT_TRUE(prep.choice_options[0].starts_in_reasoning);
  Job job(svc, std::move(prep));
  std::string bytes = job.stream_prologue() + feed(job, "hmm</mm:think>Hello there", FinishReason::Stop);
  EXPECT_TRUE(job.done());
  Parsed p = parse_sse(bytes);
  ASSERT_TRUE(p.done);
  ASSERT_GE(p.events.size(), 4u);
  EXPECT_EQ(p.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(p.events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string reasoning[2], content[2], finish[2];
  for (const auto& e : p.events) {
    EXPECT_EQ(e["id"], p.events[0]["id"]);
    for (const auto& ch : e["choices"]) {
      int i = ch["index"];
      if (ch["delta"].contains("reasoning_content")) {
        reasoning[i] += ch["delta"]["reasoning_content"].get<std::string>();
        EXPECT_EQ(ch["delta"]["reasoning"], ch["delta"]["reasoning_content"]);
      }
      if (ch["delta"].contains("content")) content[i] += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish[i] = ch["finish_reason"];
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(reasoning[i], "hmm");
    EXPECT_EQ(content[i], "Hello there");
    EXPECT_EQ(finish[i], "stop");
  }
  const auto& last = p.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["prompt_tokens"], 10);  // counted once for n = 2
  EXPECT_EQ(last["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  int per_choice = int(ids_of("hmm</mm:think>Hello there").size());
  EXPECT_EQ(last["usage"]["completion_tokens"], 2 * per_choice);
  EXPECT_GT(last["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 0);
}

TEST(Job, NonStreamingCompletionWithStopAndLogprobs) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto prep = svc.prepare(ApiKind::Completion,
                          R"({"prompt":"Once upon","max_tokens":40,"stop":["time"],"logprobs":1})");
  EXPECT_EQ(prep.engine_requests[0].params.top_logprobs, 1);
  const std::string id = prep.engine_requests[0].id;
  Job job(svc, std::move(prep));
  std::vector<std::string> aborts;
  EXPECT_EQ(feed(job, " a time there was", FinishReason::Length, &aborts), "");
  ASSERT_TRUE(job.done());
  EXPECT_EQ(aborts, std::vector<std::string>{id});
  auto [status, body] = job.final_response();
  EXPECT_EQ(status, 200);
  auto j = nlohmann::json::parse(body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], " a ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  EXPECT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
}

TEST(Job, NonStreamingChatMessageHasReasoningAndLogprobs) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto prep = svc.prepare(ApiKind::Chat, R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,
      "top_logprobs":1,"chat_template_kwargs":{"thinking_mode":"enabled"}})");
  Job job(svc, std::move(prep));
  feed(job, "plan</mm:think>done", FinishReason::Stop);
  auto j = nlohmann::json::parse(job.final_response().second);
  auto msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "done");
  EXPECT_EQ(msg["reasoning_content"], "plan");
  EXPECT_EQ(msg["reasoning"], "plan");
  auto content = j["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_TRUE(content[0]["token"].is_string());
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(content[0]["bytes"].is_array());
}

// Adaptive mode: M3's history writes a bare </mm:think> before every answer without reasoning, so the model may
// open its answer with one (../shared/docs/SERVING.md §3.1). It means "no reasoning": the tag must not reach
// content, streaming or not.
TEST(Job, AdaptiveAnswerOpeningWithABareThinkCloserHasEmptyReasoning) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  const std::string answer = "</mm:think>Hello there";
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "non-streaming");
    auto prep = svc.prepare(ApiKind::Chat, std::string(R"({"messages":[{"role":"user","content":"hi"}],"stream":)") +
                                               (stream ? "true" : "false") +
                                               R"(,"chat_template_kwargs":{"thinking_mode":"adaptive"}})");
    EXPECT_FALSE(prep.choice_options[0].starts_in_reasoning);
    Job job(svc, std::move(prep));
    std::string bytes = job.stream_prologue() + feed(job, answer, FinishReason::Stop);
    std::string content, reasoning;
    if (stream) {
      for (const auto& ev : parse_sse(bytes).events) {
        const auto& d = ev["choices"][0]["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      }
    } else {
      auto msg = nlohmann::json::parse(job.final_response().second)["choices"][0]["message"];
      content = msg["content"];
      EXPECT_FALSE(msg.contains("reasoning_content")) << msg;
    }
    EXPECT_EQ(content, "Hello there");
    EXPECT_EQ(reasoning, "");
  }
  // The same one token at a time through the ChoiceStream alone.
  ChoiceOptions o;
  ChoiceStream cs(*qwen_tokenizer(), o);
  Collected c = run(cs, ids_of(answer), FinishReason::Stop);
  EXPECT_EQ(c.reasoning, "");
  EXPECT_EQ(c.content, "Hello there");
}

TEST(Job, ToolsRenderIntoThePromptAndToolChoiceNoneDisablesParsing) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  auto prep = svc.prepare(ApiKind::Chat, R"({"messages":[{"role":"user","content":"hi"}],)" + tools + "}");
  EXPECT_TRUE(prep.choice_options[0].parse_tools);
  auto text = svc.config().tokenizer->decode(prep.engine_requests[0].prompt);
  EXPECT_NE(text.find("tools: 1"), std::string::npos) << text;
  auto none = svc.prepare(ApiKind::Chat,
                          R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"none",)" + tools + "}");
  EXPECT_FALSE(none.choice_options[0].parse_tools);
}

TEST(Job, PromptLongerThanTheContextIsA400WithTheNumbers) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config(64));
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "word ";
  try {
    svc.prepare(ApiKind::Completion, R"({"prompt":")" + long_text + R"(","max_tokens":4})");
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos);
  }
}

TEST(Service, TokenizeDetokenizeAndModels) {
  M3_REQUIRE_TOKENIZER();
  OpenAIService svc(test::service_config());
  auto t = nlohmann::json::parse(svc.tokenize_body(R"({"prompt":"Hello world"})"));
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], 4096);
  auto d = nlohmann::json::parse(svc.detokenize_body(nlohmann::json{{"tokens", t["tokens"]}}.dump()));
  EXPECT_EQ(d["prompt"], "Hello world");
  auto m = nlohmann::json::parse(svc.models_body());
  EXPECT_EQ(m["data"][0]["id"], "m3-test");
  EXPECT_THROW(svc.detokenize_body(R"({"tokens":[-1]})"), ApiError);
  auto chat = nlohmann::json::parse(svc.tokenize_body(R"({"messages":[{"role":"user","content":"hi"}]})"));
  EXPECT_GT(chat["count"].get<int>(), 2);
}

}  // namespace
}  // namespace m3::server
