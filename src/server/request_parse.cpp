#include "server/request_parse.h"

#include "server/json_long_strings.h"

#include "grammar/json_schema.h"

#include "base/json_depth.h"

#include <cmath>
#include <limits>

namespace m3::server {

std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  ApiError e(status, message, param, code, type);
  return error_body(e);
}

std::string error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty())
    err["code"] = e.code;
  else
    err["code"] = e.status;  // vLLM puts the HTTP status here when there is no symbolic code
  // Messages may quote client bytes; never throw while reporting an error.
  return nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + size_t(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(len);
  }
  return true;
}

OJson parse_json_object(std::string_view body) {
  // Refused before parsing: a deeply nested value crashes the copies made of it later (base/json_depth.h).
  if (json_too_deep(body))
    throw ApiError(400, fmt::format("Request body is nested deeper than {} levels", kMaxJsonDepth));
  OJson j;
  try {
    j = parse_json_lifting_long_strings(body);  // data: URLs skip nlohmann's per-character lexer
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos || what.find("utf-8") != std::string::npos)
      throw ApiError(400, "Request body contains invalid UTF-8 in a JSON string; send UTF-8 text (" + what + ")");
    throw ApiError(400, "Request body is not valid JSON: " + what);
  } catch (const nlohmann::json::exception& e) {
    // e.g. out_of_range for a number literal beyond double (1e99999).
    throw ApiError(400, std::string("Request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "Request body must be a JSON object");
  return j;
}

namespace {

// Field access with type checks. A missing field or JSON null → nullopt.
const OJson* field(const OJson& o, const char* name) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const OJson& o, const char* name) {
  const OJson* v = field(o, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_field(name, "'{}' must be a boolean", name);
  return v->get<bool>();
}

std::optional<double> get_number(const OJson& o, const char* name) {
  const OJson* v = field(o, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_field(name, "'{}' must be a number", name);
  double d = v->get<double>();
  if (!std::isfinite(d)) bad_field(name, "'{}' must be finite", name);
  return d;
}

// Integers: JSON integers, or floats with an integral value (some clients send 5.0).
std::optional<int64_t> as_int(const OJson& v, const std::string& name) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad_field(name, "'{}' is too large", name);
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return int64_t(d);
  }
  bad_field(name, "'{}' must be an integer", name);
}

std::optional<int64_t> get_int(const OJson& o, const char* name) {
  const OJson* v = field(o, name);
  if (!v) return std::nullopt;
  return as_int(*v, name);
}

std::optional<std::string> get_string(const OJson& o, const char* name) {
  const OJson* v = field(o, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_field(name, "'{}' must be a string", name);
  return v->get<std::string>();
}

void check_range(const char* name, double v, double lo, double hi, bool lo_open = false) {
  if (v < lo || v > hi || (lo_open && v == lo))
    bad_field(name, "'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, v);
}

int32_t token_id(const OJson& v, const std::string& name, const ApiLimits& lim) {
  int64_t id = *as_int(v, name);
  if (id < 0 || (lim.vocab_size > 0 && id >= lim.vocab_size))
    bad_field(name, "'{}' contains token id {} outside the vocabulary [0, {})", name, id, lim.vocab_size);
  return int32_t(id);
}

void check_model(const OJson& body, const ApiLimits& lim, ParsedRequest& r) {
  auto m = get_string(body, "model");
  // OpenAI requires model; vLLM defaults to the served model. Be lenient: absent → the served model.
  r.model = m.value_or(lim.model_name);
  if (r.model != lim.model_name)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", r.model,
                                    lim.model_name),
                   "model", "model_not_found");
}

// Everything both endpoints share: sampling, penalties, limits, stop, n, stream.
void parse_common(const OJson& b, const ApiLimits& lim, ParsedRequest& r) {
  check_model(b, lim, r);
  r.stream = get_bool(b, "stream").value_or(false);
  if (const OJson* so = field(b, "stream_options")) {
    if (!so->is_object()) bad_field("stream_options", "'stream_options' must be an object");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
    if (so->contains("include_usage") && !r.stream)
      bad_field("stream_options", "'stream_options' is only allowed when 'stream' is true");
  }
  if (auto n = get_int(b, "n")) {
    if (*n < 1 || *n > lim.max_n) bad_field("n", "'n' must be in [1, {}], got {}", lim.max_n, *n);
    r.n = int(*n);
  }
  // max_completion_tokens is the newer name; when both are given they must agree.
  auto mt = get_int(b, "max_tokens");
  auto mct = get_int(b, "max_completion_tokens");
  if (mt && mct && *mt != *mct)
    bad_field("max_completion_tokens", "'max_tokens' ({}) and 'max_completion_tokens' ({}) disagree", *mt, *mct);
  if (auto m = mct ? mct : mt) {
    const char* name = mct ? "max_completion_tokens" : "max_tokens";
    if (*m < 1) bad_field(name, "'{}' must be at least 1, got {}", name, *m);
    if (*m > lim.max_model_len)
      bad_field(name, "'{}' is {} but the maximum context length is {} tokens", name, *m, lim.max_model_len);
    r.max_tokens = int(*m);
  }
  if (auto m = get_int(b, "min_tokens")) {
    if (*m < 0) bad_field("min_tokens", "'min_tokens' must be ≥ 0, got {}", *m);
    if (r.max_tokens && *m > *r.max_tokens)
      bad_field("min_tokens", "'min_tokens' ({}) must not exceed max_tokens ({})", *m, *r.max_tokens);
    if (*m > lim.max_model_len) bad_field("min_tokens", "'min_tokens' is larger than the context length");
    r.gen.min_tokens = int(*m);
  }

  SamplingParams& s = r.gen.sampling;
  if (auto t = get_number(b, "temperature")) {
    check_range("temperature", *t, 0, 2);
    s.temperature = float(*t);
  }
  if (auto p = get_number(b, "top_p")) {
    check_range("top_p", *p, 0, 1, true);
    s.top_p = float(*p);
  }
  if (auto k = get_int(b, "top_k")) {
    if (*k < -1) bad_field("top_k", "'top_k' must be -1 (disabled) or ≥ 0, got {}", *k);
    if (lim.vocab_size > 0 && *k > lim.vocab_size) *k = lim.vocab_size;
    s.top_k = int(*k);
  }
  if (auto p = get_number(b, "min_p")) {
    check_range("min_p", *p, 0, 1);
    s.min_p = float(*p);
  }
  if (auto seed = get_int(b, "seed")) s.seed = uint64_t(*seed);
  if (auto p = get_number(b, "presence_penalty")) {
    check_range("presence_penalty", *p, -2, 2);
    r.gen.presence_penalty = float(*p);
  }
  if (auto p = get_number(b, "frequency_penalty")) {
    check_range("frequency_penalty", *p, -2, 2);
    r.gen.frequency_penalty = float(*p);
  }
  if (auto p = get_number(b, "repetition_penalty")) {
    check_range("repetition_penalty", *p, 0, 2, true);
    r.gen.repetition_penalty = float(*p);
  }
  r.gen.ignore_eos = get_bool(b, "ignore_eos").value_or(false);
  r.include_stop_str_in_output = get_bool(b, "include_stop_str_in_output").value_or(false);
  r.skip_special_tokens = get_bool(b, "skip_special_tokens").value_or(true);
  if (auto p = get_int(b, "priority")) {
    if (*p < std::numeric_limits<int>::min() || *p > std::numeric_limits<int>::max())
      bad_field("priority", "'priority' is out of range");
    r.priority = int(*p);
  }

  if (const OJson* st = field(b, "stop")) {
    auto add = [&](const OJson& v) {
      if (!v.is_string()) bad_field("stop", "'stop' must be a string or an array of strings");
      std::string s = v.get<std::string>();
      if (s.empty()) bad_field("stop", "'stop' strings must not be empty");
      r.stop.push_back(std::move(s));
    };
    if (st->is_array()) {
      if (st->size() > lim.max_stop_strings)
        bad_field("stop", "'stop' has {} strings; at most {} are allowed", st->size(), lim.max_stop_strings);
      for (const auto& v : *st) add(v);
    } else {
      add(*st);
    }
  }
  if (const OJson* ids = field(b, "stop_token_ids")) {
    if (!ids->is_array()) bad_field("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    if (ids->size() > 1024) bad_field("stop_token_ids", "'stop_token_ids' has too many entries");
    for (const auto& v : *ids) r.gen.stop_token_ids.push_back(token_id(v, "stop_token_ids", lim));
  }
  if (const OJson* lb = field(b, "logit_bias")) {
    if (!lb->is_object()) bad_field("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    if (lb->size() > 1024) bad_field("logit_bias", "'logit_bias' has too many entries (at most 1024)");
    for (const auto& [key, val] : lb->items()) {
      int64_t id = 0;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size())
        bad_field("logit_bias", "'logit_bias' keys must be token ids, got '{}'", key);
      if (id < 0 || (lim.vocab_size > 0 && id >= lim.vocab_size))
        bad_field("logit_bias", "'logit_bias' token id {} is outside the vocabulary [0, {})", id, lim.vocab_size);
      if (!val.is_number()) bad_field("logit_bias", "'logit_bias' values must be numbers");
      double bias = val.get<double>();
      if (!(bias >= -100 && bias <= 100)) bad_field("logit_bias", "'logit_bias' values must be in [-100, 100]");
      r.gen.logit_bias.emplace_back(int32_t(id), float(bias));
    }
  }
  if (const OJson* rf = field(b, "response_format")) {
    if (!rf->is_object()) bad_field("response_format", "'response_format' must be an object");
    auto type = get_string(*rf, "type");
    if (!type) bad_field("response_format", "'response_format.type' is required");
    if (*type == "structural_tag")
      throw ApiError(400, "response_format type 'structural_tag' is not supported by this server",
                     "response_format", "unsupported_parameter");
    if (*type == "json_object") {
      r.grammar = std::make_shared<const grammar::Grammar>(grammar::json_object_grammar());
      r.grammar_key = "json_object";
    } else if (*type == "json_schema") {
      const OJson* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) bad_field("response_format", "'response_format.json_schema' must be an object");
      if (const OJson* st = field(*js, "strict"); st && !st->is_boolean())
        bad_field("response_format", "'response_format.json_schema.strict' must be a boolean");
      const OJson* schema = field(*js, "schema");
      if (schema && !schema->is_object() && !schema->is_boolean())
        bad_field("response_format", "'response_format.json_schema.schema' must be a JSON schema object");
      try {
        r.grammar = std::make_shared<const grammar::Grammar>(schema ? grammar::json_schema_grammar(*schema)
                                                                    : grammar::json_object_grammar());
      } catch (const grammar::SchemaError& e) {
        throw ApiError(400, fmt::format("response_format.json_schema: {}", e.what()), "response_format",
                       "unsupported_parameter");
      }
      r.grammar_key = "json_schema:" + (schema ? schema->dump() : std::string("{}"));
    } else if (*type != "text") {
      bad_field("response_format", "'response_format.type' must be 'text', 'json_object' or 'json_schema'");
    }
  }
  for (const char* unsupported : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"})
    if (field(b, unsupported))
      throw ApiError(400, fmt::format("'{}' is not supported by this server (no constrained decoding)", unsupported),
                     unsupported, "unsupported_parameter");
  if (auto bo = get_int(b, "best_of"))
    if (*bo != r.n) throw ApiError(400, "'best_of' is not supported; use 'n'", "best_of", "unsupported_parameter");
}

// Message content: a string, an array of content parts, or null where the role allows it. Arrays are kept as
// sent (the chat template layer, server/chat_prompt.h, maps media parts and flattens text for templates that
// want a string); their parts are validated here. image_url / video_url (and the template-side image / video)
// parts are accepted so that `m3serve chat-template` can show their anchors; generation requests with media
// are refused later with a 400 until the media pipeline serves them. Audio and files are refused here.
// Validates a message's content (null, a string or an array of known content parts); the caller keeps it as is.
void check_content(const OJson& c, const std::string& where, bool null_ok) {
  if (c.is_null()) {
    if (!null_ok) bad_field("messages", "{}.content must not be null", where);
    return;
  }
  if (c.is_string()) return;
  if (!c.is_array()) bad_field("messages", "{}.content must be a string or an array of content parts", where);
  for (size_t i = 0; i < c.size(); ++i) {
    const OJson& part = c[i];
    if (!part.is_object()) bad_field("messages", "{}.content[{}] must be an object", where, i);
    auto type = get_string(part, "type");
    if (!type) bad_field("messages", "{}.content[{}].type is required", where, i);
    if (*type == "text") {
      if (!get_string(part, "text")) bad_field("messages", "{}.content[{}].text must be a string", where, i);
    } else if (*type == "image_url" || *type == "video_url") {
      // {"type":"image_url","image_url":{"url":"..."}}; a bare string URL is accepted like vLLM does.
      const OJson* u = field(part, type->c_str());
      const bool ok = u && (u->is_string() || (u->is_object() && u->contains("url") && (*u)["url"].is_string()));
      if (!ok) bad_field("messages", "{}.content[{}].{}.url must be a string", where, i, *type);
    } else if (*type == "image" || *type == "video") {
      // Already in the template's form (e.g. from a client that speaks HF's message format).
    } else if (*type == "input_audio" || *type == "file") {
      throw ApiError(400,
                     fmt::format("{}.content[{}] has type '{}': audio and file input are not supported by this "
                                 "server",
                                 where, i, *type),
                     "messages", "unsupported_parameter");
    } else {
      bad_field("messages", "{}.content[{}].type '{}' is unknown", where, i, *type);
    }
  }
}

// Validates b.messages and moves each message into r.messages (b's copy is left moved-from): a message with image
// data URLs holds megabytes of base64, and copying it twice (whole message, then its content) cost ≈ 80 ms of page
// faults and memcpy per 8 × 1080p request.
void parse_messages(OJson& b, ParsedRequest& r) {
  const OJson* ms = field(b, "messages");
  if (!ms) bad_field("messages", "'messages' is required");
  if (!ms->is_array()) bad_field("messages", "'messages' must be an array");
  if (ms->empty()) bad_field("messages", "'messages' must contain at least one message");
  if (ms->size() > 100000) bad_field("messages", "'messages' has too many entries");
  OJson& msgs = b["messages"];
  for (size_t i = 0; i < msgs.size(); ++i) {
    OJson& m = msgs[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_field("messages", "{} must be an object", where);
    auto role = get_string(m, "role");
    if (!role) bad_field("messages", "{}.role is required", where);
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    bool known = false;
    for (const char* k : kRoles) known |= (*role == k);
    // "root": MiniMax-M3's highest-priority system prompt (replaces the template's identity text); only a first
    // message may carry it, as the template reads it only there.
    if (*role == "root") {
      if (i != 0) bad_field("messages", "{}.role 'root' is only allowed on the first message", where);
      known = true;
    }
    if (!known)
      bad_field("messages", "{}.role '{}' is not one of root (first message only), system, developer, user, "
                            "assistant, tool",
                where, *role);
    const bool assistant = *role == "assistant";
    auto it = m.find("content");
    if (it == m.end()) {
      if (!assistant) bad_field("messages", "{}.content is required", where);
    } else {
      check_content(*it, where, assistant);
    }
    OJson out = std::move(m);  // keep extra keys (name, tool_call_id, reasoning_content ...) for the template
    // An assistant turn that only carries tool calls has null/absent content; templates (HF's included) test
    // `'x' in message.content`, which fails on None, so give them "" like vLLM's message parser does.
    if (assistant && (!out.contains("content") || out["content"].is_null())) out["content"] = "";
    if (auto tc = out.find("tool_calls"); tc != out.end() && !tc->is_null()) {
      if (!assistant) bad_field("messages", "{}.tool_calls is only allowed on assistant messages", where);
      if (!tc->is_array()) bad_field("messages", "{}.tool_calls must be an array", where);
      for (size_t k = 0; k < tc->size(); ++k) {
        const OJson& call = (*tc)[k];
        const OJson* fn = call.is_object() ? field(call, "function") : nullptr;
        if (!fn || !fn->is_object() || !get_string(*fn, "name"))
          bad_field("messages", "{}.tool_calls[{}].function.name must be a string", where, k);
        // Templates render arguments as an object; OpenAI sends them as a JSON string.
        if (const OJson* args = field(*fn, "arguments"); args && args->is_string()) {
          if (json_too_deep(args->get_ref<const std::string&>()))
            bad_field("messages", "{}.tool_calls[{}].function.arguments is nested deeper than {} levels", where, k,
                      kMaxJsonDepth);
          OJson parsed = OJson::parse(args->get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) out["tool_calls"][k]["function"]["arguments"] = parsed;
        }
      }
    }
    for (const char* sfield : {"name", "tool_call_id", "reasoning_content"})
      if (const OJson* v = field(out, sfield); v && !v->is_string())
        bad_field("messages", "{}.{} must be a string", where, sfield);
    r.messages.push_back(std::move(out));
  }
}

void parse_tools(const OJson& b, ParsedRequest& r) {
  if (const OJson* tools = field(b, "tools")) {
    if (!tools->is_array()) bad_field("tools", "'tools' must be an array");
    if (tools->size() > 1024) bad_field("tools", "'tools' has too many entries");
    for (size_t i = 0; i < tools->size(); ++i) {
      const OJson& t = (*tools)[i];
      if (!t.is_object()) bad_field("tools", "tools[{}] must be an object", i);
      auto type = get_string(t, "type");
      if (type && *type != "function")
        throw ApiError(400, fmt::format("tools[{}].type '{}' is not supported; only 'function'", i, *type), "tools",
                       "unsupported_parameter");
      const OJson* fn = field(t, "function");
      if (!fn || !fn->is_object()) bad_field("tools", "tools[{}].function must be an object", i);
      auto name = get_string(*fn, "name");
      if (!name || name->empty()) bad_field("tools", "tools[{}].function.name must be a non-empty string", i);
      if (const OJson* p = field(*fn, "parameters"); p && !p->is_object())
        bad_field("tools", "tools[{}].function.parameters must be a JSON schema object", i);
    }
    if (!tools->empty()) r.tools = *tools;
  }
  std::string choice = "auto", named;
  if (const OJson* tc = field(b, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        bad_field("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a named function");
    } else if (tc->is_object()) {
      choice = "named";
      const OJson* fn = field(*tc, "function");
      auto name = fn && fn->is_object() ? get_string(*fn, "name") : std::nullopt;
      if (!name) bad_field("tool_choice", "'tool_choice.function.name' must be a string");
      named = *name;
    } else {
      bad_field("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  r.parse_tools = !r.tools.is_null() && choice != "none";
  r.parallel_tool_calls = get_bool(b, "parallel_tool_calls").value_or(true);
  if (choice != "required" && choice != "named") return;
  // The model must call a tool: its output is constrained to M3's tool-call block (grammar/json_schema.h).
  if (r.tools.is_null()) bad_field("tool_choice", "tool_choice '{}' needs 'tools'", choice);
  if (r.grammar)
    throw ApiError(400, "tool_choice 'required' / a named function cannot be combined with a JSON response_format",
                   "tool_choice", "unsupported_parameter");
  std::vector<grammar::ToolSchema> tools;
  for (const OJson& t : r.tools) {
    const OJson& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (choice == "named" && name != named) continue;
    const OJson* params = field(fn, "parameters");
    tools.push_back({name, params ? *params : OJson()});
  }
  if (tools.empty()) bad_field("tool_choice", "tool_choice names the function '{}', which is not in 'tools'", named);
  const bool parallel = choice == "required" && r.parallel_tool_calls;
  try {
    r.grammar = std::make_shared<const grammar::Grammar>(grammar::m3_tool_call_grammar(tools, parallel));
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, fmt::format("tool_choice: {}", e.what()), "tool_choice", "unsupported_parameter");
  }
  OJson key = OJson::array();
  for (const auto& t : tools) key.push_back(OJson{t.name, t.parameters});
  r.grammar_key = fmt::format("tools:{}:{}", parallel ? 1 : 0, key.dump());
}

}  // namespace

ParsedRequest parse_chat_request(std::string_view body, const ApiLimits& lim) {
  OJson b = parse_json_object(body);
  ParsedRequest r;
  r.kind = ApiKind::Chat;
  parse_common(b, lim, r);
  parse_messages(b, r);
  parse_tools(b, r);
  r.add_generation_prompt = get_bool(b, "add_generation_prompt").value_or(true);
  if (get_bool(b, "continue_final_message").value_or(false))
    throw ApiError(400, "'continue_final_message' is not supported", "continue_final_message",
                   "unsupported_parameter");
  r.logprobs = get_bool(b, "logprobs").value_or(false);
  if (auto k = get_int(b, "top_logprobs")) {
    if (*k < 0 || *k > lim.max_top_logprobs)
      bad_field("top_logprobs", "'top_logprobs' must be in [0, {}], got {}", lim.max_top_logprobs, *k);
    if (!r.logprobs) bad_field("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    r.top_logprobs = int(*k);
  }
  if (r.logprobs) r.gen.top_logprobs = r.top_logprobs;
  if (const OJson* kw = field(b, "chat_template_kwargs")) {
    if (!kw->is_object()) bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    // The template context's own variables are validated (or set by the server); a kwarg must not replace them.
    for (const char* reserved : kReservedTemplateVariables)
      if (kw->contains(reserved))
        bad_field("chat_template_kwargs",
                  "'chat_template_kwargs.{}' is not allowed: it would replace a template variable the server sets",
                  reserved);
    r.chat_template_kwargs = *kw;
  }
  if (!r.chat_template_kwargs.contains("thinking_mode") && !lim.default_thinking_mode.empty())
    r.chat_template_kwargs["thinking_mode"] = lim.default_thinking_mode;
  if (auto it = r.chat_template_kwargs.find("thinking_mode"); it != r.chat_template_kwargs.end()) {
    if (!it->is_string() || (*it != "enabled" && *it != "disabled" && *it != "adaptive"))
      bad_field("chat_template_kwargs", "'chat_template_kwargs.thinking_mode' must be 'enabled', 'disabled' or "
                                        "'adaptive'");
  }
  return r;
}

ParsedRequest parse_completion_request(std::string_view body, const ApiLimits& lim) {
  OJson b = parse_json_object(body);
  ParsedRequest r;
  r.kind = ApiKind::Completion;
  parse_common(b, lim, r);
  const OJson* p = field(b, "prompt");
  if (!p) bad_field("prompt", "'prompt' is required");
  auto ids_of = [&](const OJson& arr) {
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (const auto& v : arr) ids.push_back(token_id(v, "prompt", lim));
    if (ids.empty()) bad_field("prompt", "'prompt' token array must not be empty");
    return ids;
  };
  if (p->is_string()) {
    r.prompts.emplace_back(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) bad_field("prompt", "'prompt' must not be an empty array");
    if ((*p)[0].is_number()) {
      r.prompts.emplace_back(ids_of(*p));
    } else {
      if (p->size() > 256) bad_field("prompt", "'prompt' has too many entries (at most 256)");
      for (const auto& e : *p) {
        if (e.is_string())
          r.prompts.emplace_back(e.get<std::string>());
        else if (e.is_array())
          r.prompts.emplace_back(ids_of(e));
        else
          bad_field("prompt", "'prompt' must be a string, an array of strings, or token id arrays");
      }
    }
  } else {
    bad_field("prompt", "'prompt' must be a string, an array of strings, or token id arrays");
  }
  if (r.num_choices() > 256) bad_field("n", "'n' × prompts is {}; at most 256 choices per request", r.num_choices());
  r.echo = get_bool(b, "echo").value_or(false);
  if (r.echo && r.stream)
    throw ApiError(400, "'echo' with 'stream' is not supported", "echo", "unsupported_parameter");
  if (auto suffix = get_string(b, "suffix"); suffix && !suffix->empty())
    throw ApiError(400, "'suffix' is not supported", "suffix", "unsupported_parameter");
  if (auto k = get_int(b, "logprobs")) {
    if (*k < 0 || *k > lim.max_top_logprobs)
      bad_field("logprobs", "'logprobs' must be in [0, {}], got {}", lim.max_top_logprobs, *k);
    r.logprobs = true;
    r.top_logprobs = int(*k);
    r.gen.top_logprobs = int(*k);
  }
  return r;
}

int resolve_max_tokens(const ParsedRequest& r, int64_t prompt_tokens, int64_t max_model_len) {
  const char* param = r.kind == ApiKind::Chat ? "messages" : "prompt";
  if (prompt_tokens <= 0) throw ApiError(400, "The prompt is empty (0 tokens)", param);
  if (prompt_tokens >= max_model_len)
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} "
                               "tokens, which leaves no room for generation. Please shorten the {}.",
                               max_model_len, prompt_tokens, param),
                   param, "context_length_exceeded");
  if (!r.max_tokens) {
    if (r.kind == ApiKind::Completion) return int(std::min<int64_t>(16, max_model_len - prompt_tokens));
    return int(max_model_len - prompt_tokens);
  }
  if (prompt_tokens + *r.max_tokens > max_model_len)
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                               "({} in the {}, {} for the completion). Please reduce the length of the {} or the "
                               "completion (max_tokens).",
                               max_model_len, prompt_tokens + *r.max_tokens, prompt_tokens, param, *r.max_tokens,
                               param),
                   param, "context_length_exceeded");
  return *r.max_tokens;
}

}  // namespace m3::server
