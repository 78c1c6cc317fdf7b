// Validation layer: an HTTP body (JSON text) → a checked request, before anything reaches the engine.
// Pure functions of (body, limits): no model, no tokenizer, so they are unit-tested and fuzzed directly.
//
// Rules (like OpenAI's server): unknown fields are ignored; a known field with the wrong type or an out-of-range
// value is a 400 that names the field; features we do not implement (response_format structural_tag, JSON-schema
// keywords the grammar compiler refuses, audio parts, ...) are a 400 "not supported" — never accepted and silently
// ignored. JSON null means "use the default" for every optional field. response_format json_* and tool_choice
// required / named compile to a grammar here (grammar/json_schema.h), so a refused schema is a 400 before any work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "grammar/grammar.h"
#include "server/api_error.h"

namespace m3::server {

using OJson = nlohmann::ordered_json;

// Variables the chat template context takes from the validated request or the model (chat_template_context in
// src/text/chat_template.cpp); chat_template_kwargs naming one of them is refused with 400, so a client cannot
// swap validated messages or tools for unchecked ones, or forge the special tokens.
inline constexpr const char* kReservedTemplateVariables[] = {"messages",  "tools",     "documents",
                                                              "add_generation_prompt", "bos_token", "eos_token"};

struct ApiLimits {
  std::string model_name = "m3";        // served model name; requests naming another model get 404
  int64_t max_model_len = 4096;         // prompt + generated tokens
  int vocab_size = 0;                   // bounds token ids (prompts, stop_token_ids, logit_bias); 0 = unchecked
  int max_n = 16;                       // choices per request
  int max_top_logprobs = 20;
  size_t max_stop_strings = 64;
  std::string default_thinking_mode;    // chat_template_kwargs.thinking_mode when the request has none ("" = none)
};

enum class ApiKind { Chat, Completion };

// A completions prompt: text or token ids.
using PromptInput = std::variant<std::string, std::vector<int32_t>>;

struct ParsedRequest {
  ApiKind kind = ApiKind::Chat;
  std::string model;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  int n = 1;
  std::optional<int> max_tokens;         // max_tokens / max_completion_tokens; nullopt = endpoint default
  GenerationParams gen;                  // everything but max_tokens / choice_index (filled per choice)
  std::vector<std::string> stop;         // stop strings, matched on detokenised text
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  int priority = 0;

  // Chat.
  OJson messages = OJson::array();       // validated; content part arrays kept (server/chat_prompt.h maps them)
  OJson tools;                           // null or a validated array
  bool parse_tools = false;              // tools given and tool_choice != "none"
  bool parallel_tool_calls = true;       // false: only the first tool call is returned
  // Constrained decoding: response_format json_object / json_schema, or tool_choice required / named (the M3
  // tool-call block of those tools). null: unconstrained. grammar_key identifies the grammar (for the service's
  // cache of compiled grammars).
  std::shared_ptr<const grammar::Grammar> grammar;
  std::string grammar_key;
  bool add_generation_prompt = true;
  OJson chat_template_kwargs = OJson::object();
  bool logprobs = false;                 // chat: bool; completions: logprobs given
  int top_logprobs = 0;                  // chat top_logprobs, or the completions logprobs int

  // Completions.
  std::vector<PromptInput> prompts;      // ≥ 1
  bool echo = false;

  int num_choices() const { return n * int(kind == ApiKind::Completion ? prompts.size() : 1); }
};

// Parses and validates a request body. Throws ApiError (400 / 404) naming the field.
ParsedRequest parse_chat_request(std::string_view body, const ApiLimits& limits);
ParsedRequest parse_completion_request(std::string_view body, const ApiLimits& limits);

// Parses JSON text into an object; 400 for malformed JSON (invalid UTF-8 included) or a non-object.
OJson parse_json_object(std::string_view body);

// Checks prompt length + max_tokens against max_model_len and resolves the default max_tokens
// (completions: 16, chat: the rest of the context). Throws a 400 that gives the numbers.
int resolve_max_tokens(const ParsedRequest& r, int64_t prompt_tokens, int64_t max_model_len);

// True when `s` is valid UTF-8 (no overlongs, no surrogates, ≤ U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace m3::server
