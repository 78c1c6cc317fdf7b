// m3serve chat-template: prints the exact prompt text `m3serve serve` would render for a chat-completions request
// body — the same validation, normalisation (server/chat_prompt.h) and template — so a user can see what the
// model sees, and tests can check it. Nothing is loaded but the template (and tokenizer_config.json's tokens).
//
//   m3serve chat-template --model DIR [--chat-template FILE] --request BODY.json   (BODY.json "-" = stdin)
//
// Image / video parts are shown as the template's anchors (a generation request with them gets a 400 for now).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <sstream>

#include "app/commands.h"
#include "base/error.h"
#include "server/chat_prompt.h"
#include "server/request_parse.h"

namespace m3::app {

namespace {

struct ChatTemplateOptions {
  std::string model, chat_template, request, default_thinking_mode;
};

std::string read_all(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream f(path, std::ios::binary);
  M3_CHECK(f.good(), "cannot read --request '{}'", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

CommandRun register_chat_template(CLI::App& app) {
  auto o = std::make_shared<ChatTemplateOptions>();
  auto* cmd = app.add_subcommand("chat-template",
                                 "Print the prompt text the server renders for a chat-completions request body");
  cmd->add_option("--model", o->model, "Model directory (chat_template.jinja / tokenizer_config.json)")->required();
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file overriding the model's");
  cmd->add_option("--request", o->request, "Request body (JSON file; '-' reads stdin)")->required();
  cmd->add_option("--default-thinking-mode", o->default_thinking_mode,
                  "chat_template_kwargs.thinking_mode when the request sets none (as serve's flag)")
      ->check(CLI::IsMember({"enabled", "disabled", "adaptive"}));
  return [o]() -> int {
    const ChatTemplate tmpl = server::load_serving_chat_template(o->model, o->chat_template);
    try {
      server::OJson body = server::parse_json_object(read_all(o->request));
      body.erase("model");  // whatever the client named, this is the model being inspected
      server::ApiLimits lim;
      lim.max_model_len = std::numeric_limits<int32_t>::max();
      lim.default_thinking_mode = o->default_thinking_mode;
      const server::ParsedRequest r = server::parse_chat_request(body.dump(), lim);
      const server::ChatPrompt p = server::render_chat_prompt(tmpl, server::detect_content_format(tmpl), r);
      std::fwrite(p.text.data(), 1, p.text.size(), stdout);
      std::fflush(stdout);
      for (size_t i = 0; i < p.media.size(); ++i) {
        const server::OJson& part = r.messages[p.media[i].message]["content"][p.media[i].index];
        std::fprintf(stderr, "media %zu: %s (%s)\n", i, p.media[i].kind.c_str(),
                     part.value("type", std::string("?")).c_str());
      }
    } catch (const server::ApiError& e) {
      std::fprintf(stderr, "error: the server would answer %d: %s\n", e.status, e.what());
      return 1;
    }
    return 0;
  };
}

}  // namespace m3::app
