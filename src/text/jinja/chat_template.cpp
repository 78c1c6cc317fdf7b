#include "text/jinja/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/json_depth.h"

namespace m3 {

using OJson = nlohmann::ordered_json;

ChatTemplate ChatTemplate::parse(std::string source, std::string name) {
  ChatTemplate t;
  // transformers' environment: trim_blocks and lstrip_blocks on, trailing newline dropped.
  jinja::Options opts;
  opts.trim_blocks = true;
  opts.lstrip_blocks = true;
  t.tmpl_ = jinja::Template::parse(source, std::move(name), opts);
  t.source_ = std::move(source);
  return t;
}

std::string ChatTemplate::render(const OJson& context) const { return tmpl_.render(context); }

OJson chat_template_context(const ChatTemplateInputs& in, const std::string& bos_token,
                            const std::string& eos_token) {
  M3_CHECK(in.messages.is_array(), "chat template: messages must be an array");
  M3_CHECK(in.tools.is_null() || in.tools.is_array(), "chat template: tools must be an array or null");
  M3_CHECK(in.extra_context.is_null() || in.extra_context.is_object(),
           "chat template: chat_template_kwargs must be an object");
  OJson ctx = OJson::object();
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  if (!bos_token.empty()) ctx["bos_token"] = bos_token;
  if (!eos_token.empty()) ctx["eos_token"] = eos_token;
  if (in.extra_context.is_object())
    for (auto it = in.extra_context.begin(); it != in.extra_context.end(); ++it) ctx[it.key()] = it.value();
  return ctx;
}

std::string ChatTemplate::apply(const ChatTemplateInputs& in) const {
  return tmpl_.render(chat_template_context(in, bos_token, eos_token));
}

OJson decode_tool_call_arguments(const OJson& messages) {
  OJson out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& tc : m["tool_calls"]) {
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
      auto& fn = tc["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      if (json_too_deep(fn["arguments"].get_ref<const std::string&>())) continue;  // stays a string
      OJson parsed = OJson::parse(fn["arguments"].get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) fn["arguments"] = std::move(parsed);
    }
  }
  return out;
}

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  M3_CHECK(f.good(), "cannot open {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string token_text(const OJson& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}

std::optional<std::string> template_from(const OJson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::optional<std::string> first;
    for (const auto& e : v) {
      M3_CHECK(e.is_object() && e.contains("template") && e["template"].is_string(),
               "{}: chat_template list entries need a \"template\" string", where);
      if (!first) first = e["template"].get<std::string>();
      if (e.contains("name") && e["name"] == "default") return e["template"].get<std::string>();
    }
    return first;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ChatTemplate> load_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  OJson cfg = OJson::object();
  const fs::path cfg_path = dir / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    try {
      cfg = OJson::parse(read_file(cfg_path));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", cfg_path.string(), e.what());
    }
  }
  std::optional<std::string> src;
  std::string name;
  if (fs::exists(dir / "chat_template.jinja")) {
    src = read_file(dir / "chat_template.jinja");
    name = (dir / "chat_template.jinja").string();
  } else if (cfg.is_object() && cfg.contains("chat_template")) {
    src = template_from(cfg["chat_template"], cfg_path.string());
    name = cfg_path.string() + ":chat_template";
  } else if (fs::exists(dir / "chat_template.json")) {
    OJson j;
    try {
      j = OJson::parse(read_file(dir / "chat_template.json"));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", (dir / "chat_template.json").string(), e.what());
    }
    name = (dir / "chat_template.json").string();
    if (j.is_object() && j.contains("chat_template")) src = template_from(j["chat_template"], name);
  }
  if (!src) return std::nullopt;
  ChatTemplate t = ChatTemplate::parse(*src, name);
  if (cfg.is_object()) {
    t.bos_token = token_text(cfg, "bos_token");
    t.eos_token = token_text(cfg, "eos_token");
  }
  return t;
}

}  // namespace m3
