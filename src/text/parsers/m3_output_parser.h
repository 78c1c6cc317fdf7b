// MiniMax-M3 output parser: splits generated TEXT into reasoning, content and OpenAI tool calls,
// streaming or all at once (docs/SERVING_FORMAT.md §3.2–3.4, chunk shapes §2.3). Markers are matched as text,
// never as token ids, so it works whether the model emitted them as special tokens or as pieces.
//
//   <mm:think>reasoning</mm:think>answer  NS<tool_call>NS<invoke name="f">…NS</invoke>NS</tool_call>
//
// Streaming contract: push() returns only text that can no longer change meaning; a suffix that could
// be the start of a marker is held back until disambiguated (or until finish()). Whatever the chunking,
// the concatenation of all deltas equals parse_full() of the whole text (tests check every split).
//
// Tool calls are committed at their opening tag `NS<invoke name="f">` (f a known tool): the delta carries the
// call's header (index, id, name, arguments ""); the arguments then stream one parameter at a time as the
// model closes them (`{"city":"Paris"`, `,"days":3`, `}`), valid JSON once concatenated.
// Committed calls are never retracted: a call whose later markup is malformed or cut off is closed with the
// parameters that parsed. Markup that turns out malformed or names an unknown tool is returned verbatim as
// content (as reasoning when it started inside reasoning and nothing in it was committed), and the tool_call
// block goes on, so the next well-formed invoke is still parsed. Never throws on model output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/parsers/tool_parser.h"

namespace m3 {

inline constexpr std::string_view kThinkOpen = "<mm:think>";
inline constexpr std::string_view kThinkClose = "</mm:think>";

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments_json;
};

// One streamed piece of a tool call (OpenAI delta.tool_calls[i]). The first delta of a call has
// index + id + name and empty arguments; later ones have only index + an arguments fragment.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// What one streaming step produced.
struct ParsedDelta {
  std::string reasoning;                  // → delta.reasoning_content
  std::string content;                    // → delta.content
  std::vector<ToolCallDelta> tool_calls;  // → delta.tool_calls
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// A whole message (non-streaming response), or the fold of all deltas of a stream.
struct ParsedMessage {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  void append(const ParsedDelta& d);
};

class M3OutputParser {
 public:
  // starts_in_reasoning: the prompt already opened <mm:think> (thinking_mode=enabled).
  // tools: the request's OpenAI `tools` array (or null). parse_tools: false when tool_choice=none
  // or no tools were sent; tool markup is then ordinary text. call_id_seed: fixes the generated
  // call ids (tests); by default each parser draws a random seed.
  M3OutputParser(bool starts_in_reasoning, const nlohmann::json& tools, bool parse_tools = true,
                 std::optional<uint64_t> call_id_seed = std::nullopt);

  ParsedDelta push(std::string_view text);
  // End of stream: held text is flushed (as reasoning if still inside reasoning, else as content);
  // unfinished tool markup becomes content. Further push() calls after finish() are treated as a
  // continuation of the same stream.
  ParsedDelta finish();

  static ParsedMessage parse_full(std::string_view text, bool starts_in_reasoning, const nlohmann::json& tools,
                                  bool parse_tools = true, std::optional<uint64_t> call_id_seed = std::nullopt);

  bool in_reasoning() const { return phase_ == Phase::kReasoning && mode_ == Mode::kText; }
  int num_tool_calls() const { return num_calls_; }
  // Bytes currently held back (not yet emitted); for diagnostics and stop-string bookkeeping.
  size_t held_bytes() const { return buf_.size() + pending_raw_.size(); }
  // Bytes the search for an invoke's end has examined so far, rescans included: streaming must keep this linear
  // in the text length however small the chunks (tests bound it).
  uint64_t invoke_bytes_scanned() const { return invoke_scanned_; }

 private:
  // Where we are with respect to the think block: before any (content; <mm:think> may still open
  // one), inside it, or after it (think tags are then ordinary text).
  enum class Phase { kBeforeThink, kReasoning, kAfterThink };
  // What the buffer holds: plain text, the inside of a tool_call block between invokes, an invoke, or the rest
  // of an invoke that failed (its text goes out as text up to its NS</invoke>, then the block goes on).
  enum class Mode { kText, kBlock, kInvoke, kFailedInvoke };

  void run(ParsedDelta& out, bool at_end);
  bool step_text(ParsedDelta& out, bool at_end);
  bool step_block(ParsedDelta& out, bool at_end);
  bool step_invoke(ParsedDelta& out, bool at_end);
  bool step_invoke_header(ParsedDelta& out, bool at_end);
  bool step_failed(ParsedDelta& out, bool at_end);
  void fail_invoke(ParsedDelta& out, size_t resume_scan);
  void emit_failed(ParsedDelta& out, size_t upto);
  void flush_group(ParsedDelta& out);
  void close_call(ParsedDelta& out);
  void emit_text(ParsedDelta& out, std::string_view s);
  void abandon_block(ParsedDelta& out, size_t upto);
  std::string make_call_id(int index) const;

  ToolSchemas tools_;
  bool parse_tools_;
  uint64_t id_seed_;

  Phase phase_;
  Mode mode_ = Mode::kText;
  std::string buf_;          // unconsumed text
  bool reasoning_has_text_ = false;  // non-whitespace reasoning emitted (a later <mm:think> is text)
  // Tool-call block bookkeeping.
  std::string pending_raw_;  // block text consumed since the last commit; returned if the block fails
  bool block_from_reasoning_ = false;
  int block_commits_ = 0;
  size_t invoke_scan_ = 0;   // in kInvoke / kFailedInvoke: buf_ offset from which the marker search resumes
  // The call being streamed (kInvoke after its opening tag): buf_ starts after the opening tag.
  bool call_open_ = false;
  int call_index_ = 0;
  std::string invoke_open_;  // its opening tag text, NS<invoke name="f">, to parse elements on their own
  bool args_started_ = false;  // "{" went out
  int depth_ = 0;            // element nesting at invoke_scan_ (0 = between parameters)
  size_t elem_start_ = 0;    // buf_ offset of the open parameter element (depth_ > 0)
  size_t group_end_ = 0;     // buf_[0, group_end_) = closed parameters with one tag, not yet emitted (0 = none)
  std::string group_tag_;
  int num_calls_ = 0;
  uint64_t invoke_scanned_ = 0;
};

}  // namespace m3
