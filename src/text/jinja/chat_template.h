// Chat templates: turns an OpenAI-style conversation into the exact prompt text the model was trained
// on, by rendering the model's Jinja chat template the way HuggingFace's apply_chat_template does
// (see jinja.h for the renderer and docs/TEXT_TEMPLATES.md for the supported subset).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja/jinja.h"

namespace m3 {

// JSON here is nlohmann::ordered_json: templates print tool schemas with `tojson`, and Python keeps
// the client's key order, so sorted keys would change the prompt. A nlohmann::json converts
// implicitly (its keys are then already sorted), but parse requests with ordered_json to stay exact.
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // content: string or parts array
  nlohmann::ordered_json tools;                                       // array or null
  bool add_generation_prompt = true;
  // chat_template_kwargs, e.g. {"thinking_mode":"enabled"}; may also carry bos_token/eos_token, which
  // otherwise default to the ones load_chat_template found in tokenizer_config.json.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Throws m3::Error "name:line:col: ..." for syntax errors and unsupported constructs.
  static ChatTemplate parse(std::string source, std::string name = "chat_template");

  // Generic render with `context` as the template globals.
  std::string render(const nlohmann::ordered_json& context) const;

  // Builds transformers' context: messages, tools, documents (null), add_generation_prompt,
  // bos_token/eos_token (when known), then every extra_context key (overriding), and renders.
  std::string apply(const ChatTemplateInputs& in) const;

  const std::string& name() const { return tmpl_.name(); }
  const std::string& source() const { return source_; }

  // Special tokens passed to the template unless extra_context sets them ("" = not set).
  std::string bos_token;
  std::string eos_token;

 private:
  jinja::Template tmpl_;
  std::string source_;
};

// The context apply() renders with (exposed for tests and debugging).
nlohmann::ordered_json chat_template_context(const ChatTemplateInputs& in, const std::string& bos_token,
                                             const std::string& eos_token);

// Returns a copy of `messages` where every assistant tool_calls[].function.arguments that is a string
// holding a JSON object is replaced by that object (strings that are not JSON objects stay as they
// are). OpenAI clients send arguments as strings; templates that walk arguments as a mapping (the
// M3 template's XML rendering, MiniMax-M2's) need objects. transformers does not do this by itself,
// so apply() never does it implicitly: call it before apply() for such templates.
nlohmann::ordered_json decode_tool_call_arguments(const nlohmann::ordered_json& messages);

// Loads a model directory's chat template: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of {name, template} where "default" or the first wins), else
// chat_template.json's "chat_template". bos/eos tokens come from tokenizer_config.json (string or
// AddedToken object). Returns nullopt when the directory has no template; throws m3::Error when a
// template exists but does not parse.
std::optional<ChatTemplate> load_chat_template(const std::string& model_dir);

}  // namespace m3
