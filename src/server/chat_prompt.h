// From a validated chat request to the exact prompt text the model sees: which chat template serves (the model's
// own, or --chat-template), how the request's messages are normalised before the template renders them, and how
// template errors become a 400. Used by OpenAIService (every chat request and /tokenize with messages) and by
// `m3serve chat-template` (prints the prompt), so both render the same text. docs/TEXT_TEMPLATES.md describes it.
//
// Normalisation (../shared/docs/SERVING.md §3.1 says what the MiniMax-M3 template expects):
//   - tool_calls[].function.arguments given as a JSON string are decoded into the object (request_parse.cpp does
//     this while validating; the M3 template raises on a string);
//   - OpenAI media parts are mapped, in order, to the parts templates render as anchors:
//     {"type":"image_url",...} → {"type":"image"}, {"type":"video_url",...} → {"type":"video"} (map_media_parts);
//   - content part arrays reach the template as arrays when the template walks content parts itself (M3 does, and
//     joins text parts with nothing between them), and are flattened to one string (text parts joined with "\n",
//     like vLLM) for templates that only print string content (Qwen3, Llama 3, DeepSeek-V3).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request_parse.h"
#include "text/jinja/chat_template.h"

namespace m3::server {

// One image or video of a request, in the order its anchor appears in the prompt: the client's part as sent is
// messages[message].content[index] of the messages that were normalised (its image_url / video_url object holds the
// URL or data: URI; the media gateway resolves it from the request). A position, not a copy: a request with 8 images
// carries ≈ 16 MB of base64 in those parts.
struct MediaRef {
  std::string kind;  // "image" or "video"
  size_t message = 0, index = 0;
};

// Maps one message content (a string, or an array of parts) to what the template is given: every image_url /
// video_url part becomes {"type":"image"} / {"type":"video"} in place (parts already of type image / video stay);
// other parts are copied unchanged. Appends one MediaRef per media part (message index `message`), in order, to
// *media when it is non-null.
OJson map_media_parts(const OJson& content, std::vector<MediaRef>* media, size_t message = 0);

// How content part arrays reach the template.
enum class ContentFormat {
  kString,  // text parts joined with "\n" into one string; arrays stay only where they hold media
  kParts,   // arrays passed through (media parts mapped)
};

// kParts when the template iterates a message's content (a `for x in ... content` loop, as the M3 template's
// visible_text does), else kString.
ContentFormat detect_content_format(const ChatTemplate& tmpl);

// The messages as the template gets them (see the file comment). `messages` comes from parse_chat_request. Media
// parts are never copied (their anchors replace them).
OJson normalize_messages(const OJson& messages, ContentFormat format, std::vector<MediaRef>* media);

struct ChatPrompt {
  std::string text;
  std::vector<MediaRef> media;  // images / videos in prompt order (empty for text-only requests)
};

// Normalises and renders. Template errors (raise_exception, a type error on odd input) become ApiError 400 whose
// message carries the template's own message; the template's file path is replaced by its file name, so no
// server path reaches the client.
ChatPrompt render_chat_prompt(const ChatTemplate& tmpl, ContentFormat format, const ParsedRequest& r);

// The template a server uses for `model_dir`: `override_file` (--chat-template) when given, else the model
// directory's own (chat_template.jinja, tokenizer_config.json's chat_template, chat_template.json; see
// load_chat_template). bos/eos tokens always come from the model's tokenizer_config.json. Throws m3::Error when
// there is none (the message names --chat-template), when the file cannot be read, or when it does not parse.
ChatTemplate load_serving_chat_template(const std::string& model_dir, const std::string& override_file);

}  // namespace m3::server
