// One POST /v1/messages request in flight: the Anthropic Messages API's response shapes over the chat path's
// output pipeline (ChoiceStream: detokeniser → stop strings → M3 reasoning / tool-call parser).
//
// Streaming events (Anthropic's order):
//   message_start                      (at the first engine event, so usage carries the real prompt/cache counts)
//   ping
//   content_block_start / content_block_delta* / content_block_stop   per block, blocks never interleave:
//       thinking  ← reasoning            (thinking_delta)
//       text      ← content              (text_delta; leading whitespace of a block is dropped, and a block is
//                                         opened only at its first non-whitespace character)
//       tool_use  ← each tool call       (input_json_delta with the argument fragments as the parser emits them)
//   message_delta {stop_reason, stop_sequence, usage}
//   message_stop
// An engine error or an abort mid-stream ends the stream with an `error` event instead of message_delta/stop.
// The non-streaming body is the fold of the same events, so both forms always agree.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/choice_stream.h"
#include "server/generation_job.h"
#include "server/openai_service.h"

namespace m3::server {

// Validates, translates (anthropic_request.h), templates and tokenises a Messages body. Throws ApiError.
std::unique_ptr<GenerationJob> make_anthropic_job(const OpenAIService& svc, std::string_view body);

// POST /v1/messages/count_tokens: {"input_tokens": N}, N = the token count of the prompt /v1/messages would run.
std::string anthropic_count_tokens_body(const OpenAIService& svc, std::string_view body);

class AnthropicJob : public GenerationJob {
 public:
  AnthropicJob(const OpenAIService& svc, PreparedJob prep, bool stream);

  const std::string& id() const override { return id_; }
  const std::vector<EngineRequest>& engine_requests() const override { return prep_.engine_requests; }
  bool streaming() const override { return stream_; }
  bool done() const override { return done_; }
  std::string stream_prologue() override { return {}; }
  Update on_output(int i, const EngineOutput& out) override;
  std::pair<int, std::string> final_response() const override;
  std::vector<std::string> unfinished_ids() const override;
  std::pair<int, int> token_usage() const override;

 private:
  enum class Block { None, Text, Thinking, ToolUse };
  void event(const std::string& name, nlohmann::ordered_json data);
  void open_block(Block kind, nlohmann::ordered_json start);
  void close_block();
  void feed(const ParsedDelta& d);
  nlohmann::ordered_json message_json(bool start) const;
  nlohmann::ordered_json usage_json(bool start) const;

  const OpenAIService& svc_;
  PreparedJob prep_;
  bool stream_;
  std::string id_;
  std::unique_ptr<ChoiceStream> choice_;
  bool started_ = false, done_ = false;
  std::string error_, error_type_;
  std::string stop_reason_, stop_sequence_;
  Block open_ = Block::None;
  int next_index_ = 0;
  std::string pending_;                     // streaming: events rendered since the last on_output
  nlohmann::ordered_json content_ = nlohmann::ordered_json::array();  // the folded blocks (non-streaming)
  std::string partial_json_;                // the open tool_use block's input so far
};

}  // namespace m3::server
