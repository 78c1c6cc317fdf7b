#include "server/chat_prompt.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "base/error.h"

namespace m3::server {

namespace fs = std::filesystem;

OJson map_media_parts(const OJson& content, std::vector<MediaRef>* media, size_t message) {
  if (!content.is_array()) return content;
  OJson out = OJson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const OJson& part = content[i];
    const std::string type = part.is_object() && part.contains("type") && part["type"].is_string()
                                 ? part["type"].get<std::string>()
                                 : std::string();
    std::string kind;
    if (type == "image_url" || type == "image") kind = "image";
    if (type == "video_url" || type == "video") kind = "video";
    if (kind.empty()) {
      out.push_back(part);
      continue;
    }
    if (media) media->push_back(MediaRef{kind, message, i});
    // The template only needs the anchor's kind; the pixels travel in `media`, in the same order.
    out.push_back(OJson{{"type", kind}});
  }
  return out;
}

ContentFormat detect_content_format(const ChatTemplate& tmpl) {
  // `{% for item in content %}`, `{% for p in message.content %}`, `{% for p in message['content'] %}`.
  static const std::regex loop(R"(for\s+\w+\s+in\s+(\w+\s*(\.\s*|\[\s*['"]))?content\b)");
  return std::regex_search(tmpl.source(), loop) ? ContentFormat::kParts : ContentFormat::kString;
}

namespace {

bool has_media(const OJson& parts) {
  for (const OJson& p : parts)
    if (p.is_object() && p.contains("type") && (p["type"] == "image" || p["type"] == "video")) return true;
  return false;
}

// Text parts joined with "\n" (vLLM's "string" content format). Only called for arrays without media.
std::string flatten_text(const OJson& parts) {
  std::string text;
  bool first = true;
  for (const OJson& p : parts) {
    if (!p.is_object() || !p.contains("text") || !p["text"].is_string()) continue;
    if (!first) text += "\n";
    text += p["text"].get<std::string>();
    first = false;
  }
  return text;
}

}  // namespace

OJson normalize_messages(const OJson& messages, ContentFormat format, std::vector<MediaRef>* media) {
  if (!messages.is_array()) return messages;
  // Message by message, so that a content array is mapped from the request's own parts (a copy of the whole
  // messages first would copy every data: URL, only for the anchors to replace them).
  OJson out = OJson::array();
  for (size_t mi = 0; mi < messages.size(); ++mi) {
    const OJson& m = messages[mi];
    const auto it = m.is_object() ? m.find("content") : m.end();
    if (!m.is_object() || it == m.end() || !it->is_array()) {
      out.push_back(m);
      continue;
    }
    OJson nm = OJson::object();
    for (auto kv = m.begin(); kv != m.end(); ++kv)  // keys in their order; content filled below
      nm[kv.key()] = kv == it ? OJson() : kv.value();
    OJson mapped = map_media_parts(*it, media, mi);
    if (format == ContentFormat::kString && !has_media(mapped))
      nm["content"] = flatten_text(mapped);
    else
      nm["content"] = std::move(mapped);
    out.push_back(std::move(nm));
  }
  return out;
}

ChatPrompt render_chat_prompt(const ChatTemplate& tmpl, ContentFormat format, const ParsedRequest& r) {
  ChatPrompt p;
  ChatTemplateInputs in;
  in.messages = normalize_messages(r.messages, format, &p.media);
  in.tools = r.tools;
  in.add_generation_prompt = r.add_generation_prompt;
  in.extra_context = r.chat_template_kwargs;
  try {
    p.text = tmpl.apply(in);
  } catch (const m3::Error& e) {
    // Errors may start with the template's name, which is its path on the server: show only the file name.
    std::string msg = e.what();
    const std::string& name = tmpl.name();
    const std::string shown = fs::path(name).filename().string();
    if (!name.empty() && name != shown)
      for (size_t pos = 0; (pos = msg.find(name, pos)) != std::string::npos; pos += shown.size())
        msg.replace(pos, name.size(), shown);
    throw ApiError(400, "The chat template could not render these messages: " + msg, "messages");
  }
  return p;
}

ChatTemplate load_serving_chat_template(const std::string& model_dir, const std::string& override_file) {
  if (!override_file.empty()) {
    std::ifstream f(override_file, std::ios::binary);
    M3_CHECK(f.good(), "cannot read --chat-template '{}'", override_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    ChatTemplate t = ChatTemplate::parse(ss.str(), override_file);
    // bos/eos from the model's tokenizer_config.json (string or AddedToken object), whether or not it has a
    // template of its own; a broken model template must not stop an override from serving.
    const fs::path cfg_path = fs::path(model_dir) / "tokenizer_config.json";
    if (fs::exists(cfg_path)) {
      std::ifstream cf(cfg_path, std::ios::binary);
      OJson cfg = OJson::parse(cf, nullptr, /*allow_exceptions=*/false);
      M3_CHECK(!cfg.is_discarded(), "{}: invalid JSON", cfg_path.string());
      auto token = [&](const char* key) -> std::string {
        if (!cfg.is_object() || !cfg.contains(key)) return {};
        const OJson& v = cfg[key];
        if (v.is_string()) return v.get<std::string>();
        if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
        return {};
      };
      t.bos_token = token("bos_token");
      t.eos_token = token("eos_token");
    }
    return t;
  }
  std::optional<ChatTemplate> t = load_chat_template(model_dir);
  if (!t)
    fail("the model directory '{}' has no chat template (no chat_template.jinja, no \"chat_template\" in "
         "tokenizer_config.json, no chat_template.json). A released MiniMax-M3 checkpoint ships chat_template.jinja: "
         "copy it into the model directory, or pass the template file with --chat-template FILE",
         model_dir);
  return std::move(*t);
}

}  // namespace m3::server
