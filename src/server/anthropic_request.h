// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) as a front end of the chat path:
// a Messages body is validated and translated into an OpenAI chat-completions body, which then goes through the
// same validation, chat template and tokeniser as /v1/chat/completions (openai_service.h). So both APIs render
// the model's prompt from one internal message structure:
//
//   system (string | text blocks)        → {"role":"system","content":text}
//   user text blocks                     → {"role":"user","content":text}            (blocks joined with "\n")
//   user tool_result blocks              → {"role":"tool","tool_call_id":id,"content":text}   (in block order)
//   assistant text / thinking / tool_use → {"role":"assistant","content","reasoning_content",
//                                           "tool_calls":[{"id","type":"function","function":{"name","arguments"}}]}
//   tools [{name, description, input_schema}] → [{"type":"function","function":{name, description, parameters}}]
//   tool_choice auto / none / any / tool → "auto" / "none" / "required" / {named function} (constrained decoding)
//   max_tokens, stop_sequences, temperature, top_p, top_k, stream → max_tokens, stop, temperature, top_p, top_k
//   thinking {type: enabled|disabled|adaptive} → chat_template_kwargs.thinking_mode
//
// Errors are ApiErrors like the OpenAI side; anthropic_error_body() renders them in Anthropic's shape.
#pragma once

#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/request_parse.h"

namespace m3::server {

struct AnthropicRequest {
  OJson openai_body;                  // the equivalent /v1/chat/completions body
  bool stream = false;
};

// Validates a Messages body and translates it. count_tokens: the /v1/messages/count_tokens form (no max_tokens,
// no sampling fields). Throws ApiError (400 / 404).
AnthropicRequest translate_anthropic_request(std::string_view body, const ApiLimits& limits, bool count_tokens);

// Anthropic's error type for an HTTP status: invalid_request_error (400), authentication_error (401),
// permission_error (403), not_found_error (404), request_too_large (413), rate_limit_error (429),
// api_error (500), overloaded_error (503).
std::string anthropic_error_type(int status);

// {"type":"error","error":{"type":..., "message":...}} as text. Never throws.
std::string anthropic_error_body(const ApiError& e);

}  // namespace m3::server
