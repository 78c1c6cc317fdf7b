#include "server/anthropic_job.h"

#include <atomic>
#include <chrono>

#include "server/anthropic_request.h"

namespace m3::server {

namespace {

using OJ = nlohmann::ordered_json;

std::string dump(const OJ& j) { return j.dump(-1, ' ', false, OJ::error_handler_t::replace); }

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string_view ltrim(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_ws(s[i])) ++i;
  return s.substr(i);
}

std::string new_message_id() {
  static std::atomic<uint64_t> serial{1};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return fmt::format("msg_{:x}{:08x}", uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(now).count()),
                     serial.fetch_add(1));
}

}  // namespace

std::unique_ptr<GenerationJob> make_anthropic_job(const OpenAIService& svc, std::string_view body) {
  AnthropicRequest a = translate_anthropic_request(body, svc.config().limits, /*count_tokens=*/false);
  PreparedJob prep = svc.prepare(ApiKind::Chat, dump(a.openai_body));
  return std::make_unique<AnthropicJob>(svc, std::move(prep), a.stream);
}

std::string anthropic_count_tokens_body(const OpenAIService& svc, std::string_view body) {
  AnthropicRequest a = translate_anthropic_request(body, svc.config().limits, /*count_tokens=*/true);
  ParsedRequest r = parse_chat_request(dump(a.openai_body), svc.config().limits);
  // Exactly what OpenAIService::prepare tokenises for the same request.
  const size_t n = svc.encode_chat_prompt(svc.render_chat(r)).size();
  return dump(OJ{{"input_tokens", n}});
}

AnthropicJob::AnthropicJob(const OpenAIService& svc, PreparedJob prep, bool stream)
    : svc_(svc), prep_(std::move(prep)), stream_(stream), id_(new_message_id()) {
  // One choice: the Messages API has no n.
  choice_ = std::make_unique<ChoiceStream>(*svc_.config().tokenizer, prep_.choice_options.at(0));
}

void AnthropicJob::event(const std::string& name, OJ data) {
  if (stream_) pending_ += "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

OJ AnthropicJob::usage_json(bool start) const {
  // Anthropic counts cache reads apart from input_tokens: input_tokens + cache_read_input_tokens is the prompt.
  const int prompt = choice_->prompt_tokens() ? choice_->prompt_tokens() : int(prep_.engine_requests[0].prompt.size());
  const int cached = std::min(choice_->cached_tokens(), prompt);
  return OJ{{"input_tokens", prompt - cached},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", cached},
            {"output_tokens", start ? 0 : choice_->completion_tokens()}};
}

OJ AnthropicJob::message_json(bool start) const {
  OJ m = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", prep_.req.model}};
  m["content"] = start ? OJ::array() : content_;
  m["stop_reason"] = start || stop_reason_.empty() ? OJ(nullptr) : OJ(stop_reason_);
  m["stop_sequence"] = start || stop_sequence_.empty() ? OJ(nullptr) : OJ(stop_sequence_);
  m["usage"] = usage_json(start);
  return m;
}

void AnthropicJob::open_block(Block kind, OJ start) {
  close_block();
  open_ = kind;
  event("content_block_start", OJ{{"type", "content_block_start"}, {"index", next_index_}, {"content_block", start}});
  content_.push_back(std::move(start));
  partial_json_.clear();
}

void AnthropicJob::close_block() {
  if (open_ == Block::None) return;
  if (open_ == Block::ToolUse) {
    // The parser's arguments are one JSON object once concatenated; an empty fragment list means no arguments.
    OJ input = OJ::parse(partial_json_.empty() ? std::string("{}") : partial_json_, nullptr, false);
    content_.back()["input"] = input.is_object() ? input : OJ::object();
  }
  event("content_block_stop", OJ{{"type", "content_block_stop"}, {"index", next_index_}});
  ++next_index_;
  open_ = Block::None;
}

void AnthropicJob::feed(const ParsedDelta& d) {
  // The parser orders reasoning before content within one delta; tool calls come last (docs/TEXT_PARSERS.md).
  if (!d.reasoning.empty()) {
    std::string_view r = d.reasoning;
    if (open_ != Block::Thinking) r = ltrim(r);
    if (!r.empty()) {
      if (open_ != Block::Thinking) open_block(Block::Thinking, OJ{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      event("content_block_delta", OJ{{"type", "content_block_delta"}, {"index", next_index_},
                                      {"delta", {{"type", "thinking_delta"}, {"thinking", r}}}});
      content_.back()["thinking"] = content_.back()["thinking"].get<std::string>() + std::string(r);
    }
  }
  if (!d.content.empty()) {
    std::string_view c = d.content;
    if (open_ != Block::Text) c = ltrim(c);
    if (!c.empty()) {
      if (open_ != Block::Text) open_block(Block::Text, OJ{{"type", "text"}, {"text", ""}});
      event("content_block_delta", OJ{{"type", "content_block_delta"}, {"index", next_index_},
                                      {"delta", {{"type", "text_delta"}, {"text", c}}}});
      content_.back()["text"] = content_.back()["text"].get<std::string>() + std::string(c);
    }
  }
  for (const auto& t : d.tool_calls) {
    if (!t.id.empty()) open_block(Block::ToolUse, OJ{{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", OJ::object()}});
    if (open_ != Block::ToolUse || t.arguments.empty()) continue;
    partial_json_ += t.arguments;
    event("content_block_delta", OJ{{"type", "content_block_delta"}, {"index", next_index_},
                                    {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
  }
}

GenerationJob::Update AnthropicJob::on_output(int i, const EngineOutput& out) {
  Update up;
  if (i != 0 || done_) return up;
  ChoiceDelta d = choice_->on_output(out);
  if (d.needs_abort) up.abort_ids.push_back(prep_.engine_requests[0].id);
  if (!started_) {
    started_ = true;
    event("message_start", OJ{{"type", "message_start"}, {"message", message_json(true)}});
    event("ping", OJ{{"type", "ping"}});
  }
  feed(d.parsed);
  if (d.finished) {
    done_ = true;
    if (d.finish_reason == "error" || d.finish_reason == "abort") {
      error_ = d.finish_reason == "error" ? "Generation failed: " + d.error
                                          : "The request was aborted before it finished (server shutdown)";
      error_type_ = d.finish_reason == "error" ? "api_error" : "overloaded_error";
      event("error", OJ{{"type", "error"}, {"error", {{"type", error_type_}, {"message", error_}}}});
    } else {
      close_block();
      if (d.finish_reason == "tool_calls") {
        stop_reason_ = "tool_use";
      } else if (d.finish_reason == "length") {
        stop_reason_ = "max_tokens";
      } else if (!choice_->matched_stop().empty()) {
        stop_reason_ = "stop_sequence";
        stop_sequence_ = choice_->matched_stop();
      } else {
        stop_reason_ = "end_turn";
      }
      event("message_delta", OJ{{"type", "message_delta"},
                                {"delta", {{"stop_reason", stop_reason_},
                                           {"stop_sequence", stop_sequence_.empty() ? OJ(nullptr) : OJ(stop_sequence_)}}},
                                {"usage", usage_json(false)}});
      event("message_stop", OJ{{"type", "message_stop"}});
    }
  }
  up.bytes.swap(pending_);
  return up;
}

std::pair<int, std::string> AnthropicJob::final_response() const {
  if (!error_.empty()) {
    ApiError e(error_type_ == "api_error" ? 500 : 503, error_);
    return {e.status, anthropic_error_body(e)};
  }
  return {200, dump(message_json(false))};
}

std::vector<std::string> AnthropicJob::unfinished_ids() const {
  if (done_) return {};
  return {prep_.engine_requests[0].id};
}

std::pair<int, int> AnthropicJob::token_usage() const {
  const int prompt = choice_->prompt_tokens() ? choice_->prompt_tokens() : int(prep_.engine_requests[0].prompt.size());
  return {prompt, choice_->completion_tokens()};
}

}  // namespace m3::server
