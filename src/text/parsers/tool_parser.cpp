#include "text/parsers/tool_parser.h"

#include "base/json_depth.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace m3 {
namespace {

using ojson = nlohmann::ordered_json;

// Nesting limits keep recursion (JSON dump, schema walks) bounded on adversarial model output.
constexpr int kMaxTagDepth = 64;
constexpr int kMaxSchemaDepth = 16;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

bool all_ws(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return is_ws(c); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// The JSON-schema types a value may take. Collected from "type" (string or list), anyOf/oneOf/allOf
// branches, and, when no type is given, from properties/items/enum/const.
struct TypeSet {
  bool string = false, integer = false, number = false, boolean = false;
  bool object = false, array = false, null = false;
  bool any() const { return string || integer || number || boolean || object || array || null; }

  void add_name(std::string_view raw) {
    std::string n = lower_ascii(raw);
    if (n == "string" || n == "str") string = true;
    else if (n == "integer" || n == "int") integer = true;
    else if (n == "number" || n == "float") number = true;
    else if (n == "boolean" || n == "bool") boolean = true;
    else if (n == "object" || n == "dict") object = true;
    else if (n == "array" || n == "list") array = true;
    else if (n == "null") null = true;
  }
  void add_value(const nlohmann::json& v) {
    if (v.is_string()) string = true;
    else if (v.is_number_integer()) integer = true;
    else if (v.is_number()) number = true;
    else if (v.is_boolean()) boolean = true;
    else if (v.is_object()) object = true;
    else if (v.is_array()) array = true;
    else if (v.is_null()) null = true;
  }
};

void collect_types(const nlohmann::json& s, TypeSet& t, int depth) {
  if (!s.is_object() || depth > kMaxSchemaDepth) return;
  bool typed = false;
  if (auto it = s.find("type"); it != s.end()) {
    if (it->is_string()) {
      t.add_name(it->get_ref<const std::string&>());
      typed = true;
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (e.is_string()) {
          t.add_name(e.get_ref<const std::string&>());
          typed = true;
        }
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = s.find(key); it != s.end() && it->is_array()) {
      for (const auto& branch : *it) collect_types(branch, t, depth + 1);
      typed = true;
    }
  }
  if (typed) return;
  if (s.contains("properties") || s.contains("additionalProperties")) t.object = true;
  if (s.contains("items") || s.contains("prefixItems")) t.array = true;
  if (auto it = s.find("enum"); it != s.end() && it->is_array()) {
    for (const auto& v : *it) t.add_value(v);
  }
  if (auto it = s.find("const"); it != s.end()) t.add_value(*it);
}

TypeSet types_of(const nlohmann::json* schema) {
  TypeSet t;
  if (schema != nullptr) collect_types(*schema, t, 0);
  return t;
}

// The (sub)schema that describes the object / array form of a value: the schema itself, or the first
// anyOf/oneOf branch that does (e.g. {"anyOf":[{"type":"object",...},{"type":"null"}]}).
const nlohmann::json* branch_with(const nlohmann::json* s, bool want_array, int depth = 0) {
  if (s == nullptr || !s->is_object() || depth > kMaxSchemaDepth) return nullptr;
  TypeSet own;
  if (auto it = s->find("type"); it != s->end()) {
    if (it->is_string()) own.add_name(it->get_ref<const std::string&>());
    if (it->is_array()) {
      for (const auto& e : *it) {
        if (e.is_string()) own.add_name(e.get_ref<const std::string&>());
      }
    }
  }
  bool has_shape = want_array ? (s->contains("items") || s->contains("prefixItems"))
                              : (s->contains("properties") || s->contains("additionalProperties"));
  if (has_shape || (want_array ? own.array : own.object)) return s;
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = s->find(key); it != s->end() && it->is_array()) {
      for (const auto& b : *it) {
        if (const auto* found = branch_with(&b, want_array, depth + 1)) return found;
      }
    }
  }
  return nullptr;
}

const nlohmann::json* object_child_schema(const nlohmann::json* parent, const std::string& tag) {
  const nlohmann::json* obj = branch_with(parent, /*want_array=*/false);
  if (obj == nullptr) return nullptr;
  if (auto props = obj->find("properties"); props != obj->end() && props->is_object()) {
    if (auto it = props->find(tag); it != props->end() && it->is_object()) return &*it;
  }
  if (auto extra = obj->find("additionalProperties"); extra != obj->end() && extra->is_object()) {
    return &*extra;
  }
  return nullptr;
}

const nlohmann::json* array_item_schema(const nlohmann::json* parent, size_t index) {
  const nlohmann::json* arr = branch_with(parent, /*want_array=*/true);
  if (arr == nullptr) return nullptr;
  if (auto pre = arr->find("prefixItems"); pre != arr->end() && pre->is_array()) {
    if (index < pre->size() && (*pre)[index].is_object()) return &(*pre)[index];
  }
  if (auto items = arr->find("items"); items != arr->end()) {
    if (items->is_object()) return &*items;
    // Draft-4 tuple form: "items": [schema, schema, ...].
    if (items->is_array() && index < items->size() && (*items)[index].is_object()) {
      return &(*items)[index];
    }
  }
  return nullptr;
}

// Whether a container element with these children is a JSON array: by schema when the schema says
// exactly one of array/object, else when every child is an <item>.
bool container_is_array(const nlohmann::json* schema, const std::vector<std::string>& child_tags) {
  TypeSet t = types_of(schema);
  if (t.array && !t.object) return true;
  if (t.object && !t.array) return false;
  return !child_tags.empty() &&
         std::all_of(child_tags.begin(), child_tags.end(), [](const std::string& s) { return s == "item"; });
}

std::optional<int64_t> parse_int(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  // from_chars accepts "inf"/"nan"; JSON has neither, so require a digit.
  if (s.empty() || std::none_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || c == '-' || c == '.' || c == 'e' || c == 'E' || c == '+')) {
      return std::nullopt;
    }
  }
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<ojson> parse_json_container(std::string_view s) {
  if (s.empty() || (s.front() != '{' && s.front() != '[')) return std::nullopt;
  if (json_too_deep(s)) return std::nullopt;
  try {
    ojson j = ojson::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  } catch (...) {
    return std::nullopt;
  }
}

// Tag names are parameter names; reject characters that cannot be part of one so that stray markup
// (e.g. an M2-style <parameter name="x">) is treated as malformed rather than as a key.
bool valid_tag_name(std::string_view n) {
  if (n.empty()) return false;
  return std::none_of(n.begin(), n.end(), [](char c) {
    return is_ws(c) || c == '<' || c == '>' || c == '/' || c == '"' || c == '\'' || c == '=';
  });
}

// Parses the inside of an invoke open tag: `invoke name="f"` (also 'f' or bare f).
std::optional<std::string> parse_invoke_header(std::string_view h) {
  constexpr std::string_view kInvoke = "invoke";
  if (h.substr(0, kInvoke.size()) != kInvoke) return std::nullopt;
  h.remove_prefix(kInvoke.size());
  if (h.empty() || !is_ws(h.front())) return std::nullopt;
  h = trim(h);
  constexpr std::string_view kName = "name";
  if (h.substr(0, kName.size()) != kName) return std::nullopt;
  h.remove_prefix(kName.size());
  h = trim(h);
  if (h.empty() || h.front() != '=') return std::nullopt;
  h.remove_prefix(1);
  h = trim(h);
  if (h.empty()) return std::nullopt;
  std::string_view name;
  if (h.front() == '"' || h.front() == '\'') {
    char q = h.front();
    size_t end = h.find(q, 1);
    if (end == std::string_view::npos || !trim(h.substr(end + 1)).empty()) return std::nullopt;
    name = h.substr(1, end - 1);
  } else {
    name = h;
    if (std::any_of(name.begin(), name.end(), [](char c) { return is_ws(c) || c == '"' || c == '\''; })) {
      return std::nullopt;
    }
  }
  if (name.empty()) return std::nullopt;
  return std::string(name);
}

struct Child {
  std::string tag;
  ojson value;
  bool schema_is_array;  // the child's own schema says array: repeated tags extend it
};

struct Frame {
  std::string tag;
  const nlohmann::json* schema = nullptr;
  std::string_view text;  // text after the open tag; the leaf value when the element has no children
  bool container = false;
  std::vector<Child> children;
};

ojson build_object(std::vector<Child>& children) {
  ojson obj = ojson::object();
  std::set<std::string> merged;  // keys already turned into arrays by a repeat
  for (auto& c : children) {
    auto it = obj.find(c.tag);
    if (it == obj.end()) {
      obj[c.tag] = std::move(c.value);
      if (c.schema_is_array) merged.insert(c.tag);
      continue;
    }
    if (!merged.count(c.tag) || !it->is_array()) {
      ojson arr = ojson::array();
      arr.push_back(std::move(*it));
      *it = std::move(arr);
      merged.insert(c.tag);
    }
    if (c.schema_is_array && c.value.is_array()) {
      for (auto& e : c.value) it->push_back(std::move(e));
    } else {
      it->push_back(std::move(c.value));
    }
  }
  return obj;
}

ojson close_value(Frame& f) {
  if (!f.container) return coerce_m3_value(f.text, f.schema);
  std::vector<std::string> tags;
  tags.reserve(f.children.size());
  for (const auto& c : f.children) tags.push_back(c.tag);
  if (container_is_array(f.schema, tags)) {
    ojson arr = ojson::array();
    for (auto& c : f.children) arr.push_back(std::move(c.value));
    return arr;
  }
  return build_object(f.children);
}

}  // namespace

ToolSchemas::ToolSchemas(const nlohmann::json& tools) {
  if (!tools.is_array()) return;
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const nlohmann::json* fn = &t;
    if (auto it = t.find("function"); it != t.end() && it->is_object()) fn = &*it;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    nlohmann::json params;
    if (auto p = fn->find("parameters"); p != fn->end()) params = *p;
    by_name_.emplace(name->get<std::string>(), std::move(params));
  }
}

const nlohmann::json* ToolSchemas::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

std::string dump_json_lenient(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

nlohmann::ordered_json coerce_m3_value(std::string_view text, const nlohmann::json* schema) {
  TypeSet t = types_of(schema);
  if (!t.any()) return std::string(text);  // unknown schema: keep the model's text
  if (text == "null" && (t.null || !t.string)) return nullptr;
  if (t.string) return std::string(text);
  std::string_view s = trim(text);
  if (t.null && s.empty()) return nullptr;
  if (t.integer) {
    if (auto v = parse_int(s)) return *v;
    if (auto d = parse_double(s); d && std::floor(*d) == *d && std::fabs(*d) <= 9007199254740992.0) {
      return static_cast<int64_t>(*d);
    }
  }
  if (t.number) {
    if (auto v = parse_int(s)) return *v;
    if (auto d = parse_double(s)) return *d;
  }
  if (t.boolean) {
    std::string l = lower_ascii(s);
    if (l == "true") return true;
    if (l == "false") return false;
  }
  if (t.object || t.array) {
    if (s.empty()) return (t.array && !t.object) ? ojson::array() : ojson::object();
    if (auto j = parse_json_container(s)) {
      if ((j->is_object() && t.object) || (j->is_array() && t.array)) return *std::move(j);
    }
    if (t.array && !t.object && s.front() != '[') {
      // A single bare value where an array is expected: one-element array, item coerced by its schema.
      ojson arr = ojson::array();
      arr.push_back(coerce_m3_value(text, array_item_schema(schema, 0)));
      return arr;
    }
  }
  return std::string(text);
}

std::optional<ParsedInvoke> parse_m3_invoke(std::string_view invoke_text, const ToolSchemas& tools) {
  try {
    if (invoke_text.substr(0, kM3Namespace.size()) != kM3Namespace) return std::nullopt;
    // Split into segments, one per NS marker: each is a tag followed by text up to the next marker.
    std::vector<std::string_view> segs;
    size_t pos = 0;
    while (pos < invoke_text.size()) {
      size_t start = pos + kM3Namespace.size();
      size_t next = invoke_text.find(kM3Namespace, start);
      size_t end = next == std::string_view::npos ? invoke_text.size() : next;
      segs.push_back(invoke_text.substr(start, end - start));
      pos = end;
    }
    if (segs.size() < 2) return std::nullopt;

    std::vector<Frame> stack;
    std::optional<ParsedInvoke> result;
    for (size_t i = 0; i < segs.size(); ++i) {
      std::string_view s = segs[i];
      while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);  // tolerated: NS <tag>
      if (s.size() < 2 || s.front() != '<') return std::nullopt;
      size_t gt = s.find('>');
      if (gt == std::string_view::npos) return std::nullopt;
      std::string_view after = s.substr(gt + 1);
      if (i == 0) {
        auto name = parse_invoke_header(s.substr(1, gt - 1));
        if (!name) return std::nullopt;
        const nlohmann::json* schema = tools.find(*name);
        if (schema == nullptr) return std::nullopt;  // unknown tool → caller returns raw text
        result = ParsedInvoke{*name, {}};
        Frame root;
        root.tag = "invoke";
        root.schema = schema->is_null() ? nullptr : schema;
        root.text = after;
        root.container = true;  // the arguments are always an object, even with no parameters
        stack.push_back(std::move(root));
        continue;
      }
      if (stack.empty()) return std::nullopt;  // markup after </invoke>
      if (s[1] == '/') {
        std::string tag(trim(s.substr(2, gt - 2)));
        if (tag != stack.back().tag || !all_ws(after)) return std::nullopt;
        if (stack.size() == 1) {
          if (i + 1 != segs.size() || !all_ws(stack.back().text)) return std::nullopt;
          ojson args = build_object(stack.back().children);
          result->arguments_json = dump_json_lenient(args);
          stack.clear();
          continue;
        }
        Frame done = std::move(stack.back());
        stack.pop_back();
        bool schema_is_array = types_of(done.schema).array && !types_of(done.schema).object;
        ojson value = close_value(done);
        stack.back().children.push_back(Child{std::move(done.tag), std::move(value), schema_is_array});
        continue;
      }
      std::string tag(trim(s.substr(1, gt - 1)));
      if (!valid_tag_name(tag)) return std::nullopt;
      Frame& parent = stack.back();
      // Mixed content (text then a child element) is not a valid encoding of any JSON value. Text
      // between later siblings was already checked when the previous sibling closed.
      if (parent.children.empty() && !all_ws(parent.text)) return std::nullopt;
      parent.container = true;
      if (stack.size() >= static_cast<size_t>(kMaxTagDepth)) return std::nullopt;
      Frame child;
      child.tag = tag;
      TypeSet pt = types_of(parent.schema);
      bool parent_array = (pt.array && !pt.object) || (pt.array && tag == "item");
      child.schema = parent_array ? array_item_schema(parent.schema, parent.children.size())
                                  : object_child_schema(parent.schema, tag);
      child.text = after;
      stack.push_back(std::move(child));
    }
    if (!stack.empty() || !result || result->arguments_json.empty()) return std::nullopt;
    return result;
  } catch (...) {
    // nlohmann or allocation errors on adversarial input: treat as malformed, never throw.
    return std::nullopt;
  }
}

}  // namespace m3
