// Per-choice output processing on the HTTP side: engine token ids → detokenised text → stop-string matching →
// (chat) the M3 reasoning / tool-call parser → OpenAI deltas.
//
// Order matters (docs/SERVING_FORMAT.md §3.4): stop strings are matched on the raw detokenised text BEFORE parsing, so a
// marker prefix held back by the parser can never hide a stop string; the stop matcher holds back any suffix
// that could still become a stop string, and the stop string itself is excluded (unless
// include_stop_str_in_output).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "text/tokenizer/detokenizer.h"
#include "text/parsers/m3_output_parser.h"
#include "text/tokenizer/tokenizer.h"

namespace m3::server {

// Streaming multi-pattern stop-string matcher with hold-back.
class StopMatcher {
 public:
  StopMatcher(std::vector<std::string> stops, bool include_stop);
  // Appends `text`; returns the text that can be emitted now. After a match, matched() is true, the text up to
  // the stop string (plus the stop string when include_stop) is returned and everything after is dropped.
  std::string push(std::string_view text);
  // End of stream: releases held-back text.
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

// What one engine event produced for one choice.
struct ChoiceDelta {
  std::string text;                  // completions: new text
  ParsedDelta parsed;                // chat: reasoning / content / tool-call deltas
  std::vector<TokenLogprob> logprobs;  // for the tokens consumed by this event
  bool finished = false;
  std::string finish_reason;         // "stop", "length", "tool_calls", "abort", "error" when finished
  std::string error;                 // finish_reason == "error"
  bool needs_abort = false;          // a stop string ended the choice; the engine request must be aborted
  bool empty() const { return text.empty() && parsed.empty() && logprobs.empty() && !finished; }
};

struct ChoiceOptions {
  bool chat = true;
  bool skip_special_tokens = true;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool starts_in_reasoning = false;        // the prompt ended inside <mm:think>
  nlohmann::json tools;                    // the request's tools (null = none)
  bool parse_tools = false;
  bool parallel_tool_calls = true;
};

class ChoiceStream {
 public:
  ChoiceStream(const Tokenizer& tok, const ChoiceOptions& opt);

  // Consumes one engine event; returns what to send. After `finished`, further events are ignored.
  ChoiceDelta on_output(const EngineOutput& out);

  bool finished() const { return finished_; }
  int prompt_tokens() const { return prompt_tokens_; }
  int cached_tokens() const { return cached_tokens_; }
  int completion_tokens() const { return completion_tokens_; }
  int reasoning_tokens() const { return reasoning_tokens_; }
  int tool_calls() const { return tool_calls_; }
  // The stop string that ended the choice ("" when none did; Anthropic's stop_sequence).
  const std::string& matched_stop() const { return stop_.matched_stop(); }

 private:
  void emit_raw(ChoiceDelta& d, const std::string& raw);
  void finish_text(ChoiceDelta& d);

  ChoiceOptions opt_;
  IncrementalDetokenizer detok_;
  StopMatcher stop_;
  std::optional<M3OutputParser> parser_;
  bool finished_ = false;
  int prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, reasoning_tokens_ = 0, tool_calls_ = 0;
};

}  // namespace m3::server
