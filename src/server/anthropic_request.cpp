#include "server/anthropic_request.h"

#include <cmath>

namespace m3::server {

namespace {

const OJson* field(const OJson& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void unsupported(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "unsupported_parameter");
}

std::string block_type(const OJson& block, const std::string& where) {
  if (!block.is_object()) bad_field("messages", "{} must be an object", where);
  const OJson* t = field(block, "type");
  if (!t || !t->is_string()) bad_field("messages", "{}.type must be a string", where);
  return t->get<std::string>();
}

std::string text_of(const OJson& block, const std::string& where) {
  const OJson* t = field(block, "text");
  if (!t || !t->is_string()) bad_field("messages", "{}.text must be a string", where);
  return t->get<std::string>();
}

[[noreturn]] void media_refused(const std::string& where, const std::string& type) {
  unsupported("messages", fmt::format("{} has type '{}': only text, tool_use, tool_result and thinking blocks are "
                                      "supported by this server (text only)",
                                      where, type));
}

// A string, or an array of text blocks (joined with "\n", like the OpenAI path joins text parts).
std::string text_content(const OJson& c, const std::string& where, const char* param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_field(param, "{} must be a string or an array of content blocks", where);
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const std::string type = block_type(c[i], w);
    if (type == "image" || type == "document" || type == "search_result") media_refused(w, type);
    if (type != "text") bad_field(param, "{}.type '{}' is not allowed here (expected 'text')", w, type);
    if (i) text += "\n";
    text += text_of(c[i], w);
  }
  return text;
}

void translate_user(const OJson& content, const std::string& where, OJson& out) {
  if (content.is_string()) {
    out.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  if (!content.is_array()) bad_field("messages", "{}.content must be a string or an array of content blocks", where);
  std::string text;
  bool have_text = false;
  auto flush_text = [&] {
    if (!have_text) return;
    out.push_back({{"role", "user"}, {"content", text}});
    text.clear();
    have_text = false;
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = fmt::format("{}.content[{}]", where, i);
    const std::string type = block_type(content[i], w);
    if (type == "text") {
      if (have_text) text += "\n";
      text += text_of(content[i], w);
      have_text = true;
    } else if (type == "tool_result") {
      const OJson* id = field(content[i], "tool_use_id");
      if (!id || !id->is_string() || id->get_ref<const std::string&>().empty())
        bad_field("messages", "{}.tool_use_id must be a non-empty string", w);
      std::string result;
      if (const OJson* c = field(content[i], "content")) result = text_content(*c, w + ".content", "messages");
      if (const OJson* e = field(content[i], "is_error"); e && !e->is_boolean())
        bad_field("messages", "{}.is_error must be a boolean", w);
      // Tool results answer the previous assistant turn's calls: they come before this turn's own text.
      flush_text();
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else if (type == "image" || type == "document" || type == "search_result") {
      media_refused(w, type);
    } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
      bad_field("messages", "{}.type '{}' is only allowed in assistant messages", w, type);
    } else {
      bad_field("messages", "{}.type '{}' is unknown", w, type);
    }
  }
  flush_text();
  if (content.empty()) out.push_back({{"role", "user"}, {"content", ""}});
}

void translate_assistant(const OJson& content, const std::string& where, OJson& out) {
  OJson msg = {{"role", "assistant"}};
  if (content.is_string()) {
    msg["content"] = content;
    out.push_back(std::move(msg));
    return;
  }
  if (!content.is_array()) bad_field("messages", "{}.content must be a string or an array of content blocks", where);
  std::string text, reasoning;
  OJson calls = OJson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = fmt::format("{}.content[{}]", where, i);
    const std::string type = block_type(content[i], w);
    if (type == "text") {
      text += text_of(content[i], w);
    } else if (type == "thinking") {
      const OJson* t = field(content[i], "thinking");
      if (!t || !t->is_string()) bad_field("messages", "{}.thinking must be a string", w);
      reasoning += t->get<std::string>();
    } else if (type == "redacted_thinking") {
      // Opaque data another model produced; M3 cannot read it.
    } else if (type == "tool_use") {
      const OJson* id = field(content[i], "id");
      const OJson* name = field(content[i], "name");
      const OJson* input = field(content[i], "input");
      if (!id || !id->is_string()) bad_field("messages", "{}.id must be a string", w);
      if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
        bad_field("messages", "{}.name must be a non-empty string", w);
      if (input && !input->is_object()) bad_field("messages", "{}.input must be an object", w);
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", input ? *input : OJson::object()}}}});
    } else if (type == "image" || type == "document" || type == "search_result") {
      media_refused(w, type);
    } else if (type == "tool_result") {
      bad_field("messages", "{}.type 'tool_result' is only allowed in user messages", w);
    } else if (type == "server_tool_use" || type == "web_search_tool_result") {
      unsupported("messages", fmt::format("{}.type '{}': server tools are not supported by this server", w, type));
    } else {
      bad_field("messages", "{}.type '{}' is unknown", w, type);
    }
  }
  msg["content"] = text;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(std::move(msg));
}

OJson translate_tools(const OJson& tools) {
  if (!tools.is_array()) bad_field("tools", "'tools' must be an array");
  OJson out = OJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const OJson& t = tools[i];
    if (!t.is_object()) bad_field("tools", "tools[{}] must be an object", i);
    if (const OJson* type = field(t, "type"); type && *type != "custom")
      unsupported("tools", fmt::format("tools[{}].type {} is a server tool; only client tools (name, description, "
                                       "input_schema) are supported",
                                       i, type->dump()));
    const OJson* name = field(t, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
      bad_field("tools", "tools[{}].name must be a non-empty string", i);
    const OJson* schema = field(t, "input_schema");
    if (!schema || !schema->is_object()) bad_field("tools", "tools[{}].input_schema must be a JSON schema object", i);
    OJson fn = {{"name", *name}};
    if (const OJson* d = field(t, "description")) {
      if (!d->is_string()) bad_field("tools", "tools[{}].description must be a string", i);
      fn["description"] = *d;
    }
    fn["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

}  // namespace

AnthropicRequest translate_anthropic_request(std::string_view body, const ApiLimits& lim, bool count_tokens) {
  const OJson b = parse_json_object(body);
  AnthropicRequest r;
  OJson& o = r.openai_body;
  o = OJson::object();
  if (const OJson* m = field(b, "model")) o["model"] = *m;

  OJson messages = OJson::array();
  if (const OJson* sys = field(b, "system")) messages.push_back({{"role", "system"}, {"content", text_content(*sys, "system", "system")}});
  const OJson* ms = field(b, "messages");
  if (!ms) bad_field("messages", "'messages' is required");
  if (!ms->is_array()) bad_field("messages", "'messages' must be an array");
  if (ms->empty()) bad_field("messages", "'messages' must contain at least one message");
  for (size_t i = 0; i < ms->size(); ++i) {
    const OJson& m = (*ms)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_field("messages", "{} must be an object", where);
    const OJson* role = field(m, "role");
    if (!role || !role->is_string()) bad_field("messages", "{}.role must be a string", where);
    const OJson* content = field(m, "content");
    if (!content) bad_field("messages", "{}.content is required", where);
    if (*role == "user") {
      translate_user(*content, where, messages);
    } else if (*role == "assistant") {
      // A final assistant turn is a prefill the model should continue; the chat path cannot continue a turn.
      if (i + 1 == ms->size() && !count_tokens)
        unsupported("messages", "a final assistant message (prefilling the response) is not supported by this "
                                "server; end with a user message");
      translate_assistant(*content, where, messages);
    } else {
      bad_field("messages", "{}.role must be 'user' or 'assistant', got {} (use the top-level 'system' field for "
                            "system prompts)",
                where, role->dump());
    }
  }
  o["messages"] = std::move(messages);

  if (const OJson* t = field(b, "tools")) {
    OJson tools = translate_tools(*t);
    if (!tools.empty()) o["tools"] = std::move(tools);
  }
  if (const OJson* tc = field(b, "tool_choice")) {
    if (!tc->is_object()) bad_field("tool_choice", "'tool_choice' must be an object with a 'type'");
    const OJson* type = field(*tc, "type");
    if (!type || !type->is_string()) bad_field("tool_choice", "'tool_choice.type' must be a string");
    const std::string t = type->get<std::string>();
    if (t == "auto" || t == "none") {
      o["tool_choice"] = t;
    } else if (t == "any") {
      o["tool_choice"] = "required";  // constrained to M3's tool-call block (grammar/json_schema.h)
    } else if (t == "tool") {
      const OJson* n = field(*tc, "name");
      if (!n || !n->is_string()) bad_field("tool_choice", "'tool_choice.name' is required for type 'tool'");
      o["tool_choice"] = OJson{{"type", "function"}, {"function", {{"name", *n}}}};
    } else {
      bad_field("tool_choice", "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'");
    }
    if (const OJson* d = field(*tc, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) bad_field("tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean");
      o["parallel_tool_calls"] = !d->get<bool>();
    }
  }

  if (const OJson* th = field(b, "thinking")) {
    if (!th->is_object()) bad_field("thinking", "'thinking' must be an object");
    const OJson* type = field(*th, "type");
    if (!type || !type->is_string() || (*type != "enabled" && *type != "disabled" && *type != "adaptive"))
      bad_field("thinking", "'thinking.type' must be 'enabled', 'disabled' or 'adaptive'");
    if (const OJson* bt = field(*th, "budget_tokens")) {
      if (!bt->is_number_integer() || bt->get<int64_t>() < 1)
        bad_field("thinking", "'thinking.budget_tokens' must be a positive integer");
    }
    o["chat_template_kwargs"] = {{"thinking_mode", *type}};
  }

  if (count_tokens) return r;

  const OJson* mt = field(b, "max_tokens");
  if (!mt) bad_field("max_tokens", "'max_tokens' is required");
  o["max_tokens"] = *mt;  // type and range: the chat validation
  if (const OJson* ss = field(b, "stop_sequences")) {
    if (!ss->is_array()) bad_field("stop_sequences", "'stop_sequences' must be an array of strings");
    if (ss->size() > lim.max_stop_strings)
      bad_field("stop_sequences", "'stop_sequences' has {} entries; at most {} are allowed", ss->size(),
                lim.max_stop_strings);
    for (const auto& s : *ss)
      if (!s.is_string() || s.get_ref<const std::string&>().empty())
        bad_field("stop_sequences", "'stop_sequences' must contain non-empty strings");
    if (!ss->empty()) o["stop"] = *ss;
  }
  if (const OJson* t = field(b, "temperature")) {
    // Anthropic's range is [0, 1] (OpenAI's is [0, 2]).
    if (!t->is_number() || !std::isfinite(t->get<double>()) || t->get<double>() < 0 || t->get<double>() > 1)
      bad_field("temperature", "'temperature' must be a number in [0, 1]");
    o["temperature"] = *t;
  }
  for (const char* k : {"top_p", "top_k", "stream"})
    if (const OJson* v = field(b, k)) o[k] = *v;
  if (const OJson* md = field(b, "metadata")) {
    if (!md->is_object()) bad_field("metadata", "'metadata' must be an object");
    if (const OJson* u = field(*md, "user_id"); u && !u->is_string())
      bad_field("metadata", "'metadata.user_id' must be a string");
  }
  if (const OJson* s = field(b, "stream")) {
    if (!s->is_boolean()) bad_field("stream", "'stream' must be a boolean");
    r.stream = s->get<bool>();
  }
  return r;
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string anthropic_error_body(const ApiError& e) {
  OJson err = {{"type", anthropic_error_type(e.status)}, {"message", e.what()}};
  return OJson{{"type", "error"}, {"error", err}}.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

}  // namespace m3::server
