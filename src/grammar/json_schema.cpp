#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace m3::grammar {

namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxWs = 32;         // bytes of whitespace per gap
constexpr int kMaxIntDigits = 16;  // digits after the leading one
constexpr int kMaxFracDigits = 16;
constexpr int kMaxExpDigits = 2;
constexpr int kMaxCounted = 256;  // minLength / maxLength / minItems / maxItems expanded up to this
constexpr int kMaxDepth = 64;     // nesting of subschemas (not of the generated document: $ref may recurse)

// Keywords that only annotate (no effect on validity).
const std::set<std::string> kAnnotations = {"title",         "description", "default",    "examples", "$schema",
                                            "$id",           "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs",         "definitions", "strict",     "name",     "$anchor",
                                            "discriminator", "x-order"};
// Keywords the compiler understands (some with restrictions checked where they are read).
const std::set<std::string> kHandled = {"type",    "properties", "required",  "additionalProperties",
                                        "items",   "minItems",   "maxItems",  "enum",
                                        "const",   "anyOf",      "oneOf",     "allOf",
                                        "$ref",    "minLength",  "maxLength", "nullable",
                                        "minimum", "uniqueItems", "maximum",   "exclusiveMinimum",
                                        "exclusiveMaximum"};

std::string json_literal(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {
    ws_ = g_.add_rule("ws");
    g_.define(ws_, rep(cls(" \x20\t\t\n\n\r\r"), 0, kMaxWs));
  }

  Grammar compile_value_root(const json& schema) {
    const int32_t root = g_.add_rule("root");
    const Expr v = value(schema, "", 0);
    g_.define(root, seq({ref(ws_), v, ref(ws_)}));
    g_.set_root(root);
    return std::move(g_);
  }

  Grammar& grammar() { return g_; }
  Expr ws() { return ref(ws_); }

  // One JSON value valid under `s` (path: the JSON pointer, for messages).
  Expr value(const json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) refuse(path, "schemas nested deeper than {} levels", kMaxDepth);
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(path, "the schema 'false' (no value is valid)");
      return any_value();
    }
    if (!s.is_object()) refuse(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!kAnnotations.count(it.key()) && !kHandled.count(it.key())) refuse(path, "the keyword '{}'", it.key());
    Expr e = value_inner(s, path, depth);
    if (auto n = s.find("nullable"); n != s.end() && n->is_boolean() && n->get<bool>())
      e = alt({std::move(e), lit("null")});
    return e;
  }

  // A rule holding value(s): keeps expressions small where a value is used in several places.
  int32_t value_rule(const json& s, const std::string& path, int depth) {
    if (s.is_object())
      if (auto r = s.find("$ref"); r != s.end() && s.size() == 1) return ref_rule(*r, path);
    const int32_t r = g_.add_rule(path.empty() ? "/" : path);
    g_.define(r, value(s, path, depth));
    return r;
  }

  int32_t string_rule() {
    if (string_ < 0) {
      string_ = g_.add_rule("string");
      g_.define(string_, seq({byte('"'), star(string_char()), byte('"')}));
    }
    return string_;
  }

  int32_t any_value_rule() {
    if (any_ < 0) {
      any_ = g_.add_rule("any");
      const int32_t obj = g_.add_rule("any_object"), arr = g_.add_rule("any_array");
      const Expr kv = seq({ref(string_rule()), ws(), byte(':'), ws(), ref(any_)});
      g_.define(obj, seq({byte('{'), ws(), opt(seq({kv, star(seq({ws(), byte(','), ws(), kv}))})), ws(), byte('}')}));
      g_.define(arr, seq({byte('['), ws(), opt(seq({ref(any_), star(seq({ws(), byte(','), ws(), ref(any_)}))})), ws(),
                          byte(']')}));
      g_.define(any_, alt({ref(obj), ref(arr), ref(string_rule()), number(false, false), lit("true"), lit("false"),
                           lit("null")}));
      any_object_ = obj;
    }
    return any_;
  }
  Expr any_value() { return ref(any_value_rule()); }
  int32_t any_object_rule() {
    any_value_rule();
    return any_object_;
  }

  template <typename... Args>
  [[noreturn]] static void refuse(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
    throw SchemaError(fmt::format("unsupported JSON schema at '{}': {} is not supported", path.empty() ? "#" : path,
                                  fmt::format(f, std::forward<Args>(args)...)));
  }

  // ---- pieces ----
  static Expr string_char() {
    return alt({
        cls("\x20\x21\x23\x5b\x5d\x7f"),  // ASCII but '"' and '\'
        seq({range(0xc2, 0xdf), range(0x80, 0xbf)}),
        seq({byte(0xe0), range(0xa0, 0xbf), range(0x80, 0xbf)}),
        seq({cls("\xe1\xec\xee\xef"), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({byte(0xed), range(0x80, 0x9f), range(0x80, 0xbf)}),
        seq({byte(0xf0), range(0x90, 0xbf), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({range(0xf1, 0xf3), range(0x80, 0xbf), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({byte(0xf4), range(0x80, 0x8f), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({byte('\\'), alt({cls("\"\"\\\\//bbffnnrrtt"), seq({byte('u'), rep(cls("09afAF"), 4, 4)})})}),
    });
  }
  // integer: −?(0|[1-9][0-9]{0,16}); nonneg drops the sign; positive also drops 0.
  static Expr integer(bool nonneg, bool positive) {
    Expr digits = seq({range('1', '9'), rep(range('0', '9'), 0, kMaxIntDigits)});
    Expr body = positive ? std::move(digits) : alt({byte('0'), std::move(digits)});
    return nonneg ? body : seq({opt(byte('-')), std::move(body)});
  }
  static Expr number(bool nonneg, bool) {
    return seq({integer(nonneg, false), opt(seq({byte('.'), rep(range('0', '9'), 1, kMaxFracDigits)})),
                opt(seq({cls("eeEE"), opt(cls("++--")), rep(range('0', '9'), 1, kMaxExpDigits)}))});
  }

 private:
  static int counted(const json& s, const char* key, const std::string& path, int dflt) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      refuse(path, "'{}' that is not a non-negative integer", key);
    const int64_t v = it->get<int64_t>();
    if (v > kMaxCounted) refuse(path, "'{}' above {}", key, kMaxCounted);
    return int(v);
  }

  int32_t ref_rule(const json& r, const std::string& path) {
    if (!r.is_string()) refuse(path, "a '$ref' that is not a string");
    const std::string p = r.get<std::string>();
    if (auto it = refs_.find(p); it != refs_.end()) return it->second;
    if (p.empty() || p[0] != '#') refuse(path, "the '$ref' '{}' (only references within the schema, '#...')", p);
    const json* target = &root_;
    if (p.size() > 1) {
      try {
        target = &root_.at(json::json_pointer(p.substr(1)));
      } catch (const std::exception&) {
        refuse(path, "the '$ref' '{}' (it names no subschema of this schema)", p);
      }
    }
    const int32_t rule = g_.add_rule(p);
    refs_.emplace(p, rule);  // before compiling the target: recursive schemas refer to the rule
    g_.define(rule, value(*target, p.substr(1), 0));
    return rule;
  }

  Expr value_inner(const json& s, const std::string& path, int depth) {
    if (auto r = s.find("$ref"); r != s.end()) {
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != "$ref" && kHandled.count(it.key())) refuse(path, "'$ref' next to '{}'", it.key());
      return ref(ref_rule(*r, path));
    }
    if (auto c = s.find("const"); c != s.end()) return lit(json_literal(*c));
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) refuse(path, "an 'enum' that is not a non-empty array");
      std::vector<Expr> k;
      std::set<std::string> seen;
      for (const json& v : *e)
        if (seen.insert(json_literal(v)).second) k.push_back(lit(json_literal(v)));
      return alt(std::move(k));
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) refuse(path, "an '{}' that is not a non-empty array", key);
        std::vector<Expr> k;
        for (size_t i = 0; i < a->size(); ++i)
          k.push_back(ref(value_rule((*a)[i], fmt::format("{}/{}/{}", path, key, i), depth + 1)));
        return alt(std::move(k));
      }
    if (auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1) refuse(path, "'allOf' with more than one schema");
      return value((*a)[0], path + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_string()) {
        types.push_back(t->get<std::string>());
      } else if (t->is_array()) {
        for (const json& x : *t) {
          if (!x.is_string()) refuse(path, "a 'type' entry that is not a string");
          types.push_back(x.get<std::string>());
        }
      } else {
        refuse(path, "a 'type' that is neither a string nor an array");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return any_value();
    }
    std::vector<Expr> k;
    for (const std::string& t : types) {
      if (t == "object")
        k.push_back(object(s, path, depth));
      else if (t == "array")
        k.push_back(array(s, path, depth));
      else if (t == "string")
        k.push_back(string(s, path));
      else if (t == "integer" || t == "number")
        k.push_back(numeric(s, path, t == "integer"));
      else if (t == "boolean")
        k.push_back(alt({lit("true"), lit("false")}));
      else if (t == "null")
        k.push_back(lit("null"));
      else
        refuse(path, "the type '{}'", t);
    }
    if (k.empty()) refuse(path, "an empty 'type' list");
    return alt(std::move(k));
  }

  // Integers in [lo, hi] (digits only, no sign): one alternative per digit count, each a same-length range.
  static Expr same_length_range(const std::string& a, const std::string& b) {
    if (a.empty()) return empty();
    if (a.find_first_not_of('0') == std::string::npos && b.find_first_not_of('9') == std::string::npos)
      return rep(range('0', '9'), int(a.size()), int(a.size()));  // every digit string (keeps this linear)
    const std::string ra = a.substr(1), rb = b.substr(1);
    if (a[0] == b[0]) return seq({byte(uint8_t(a[0])), same_length_range(ra, rb)});
    std::vector<Expr> k;
    k.push_back(seq({byte(uint8_t(a[0])), same_length_range(ra, std::string(ra.size(), '9'))}));
    if (a[0] + 1 <= b[0] - 1)
      k.push_back(seq({range(uint8_t(a[0] + 1), uint8_t(b[0] - 1)), rep(range('0', '9'), int(ra.size()), int(ra.size()))}));
    k.push_back(seq({byte(uint8_t(b[0])), same_length_range(std::string(rb.size(), '0'), rb)}));
    return alt(std::move(k));
  }
  // 0 ≤ lo ≤ hi: lo's length up to its 9s, every length strictly between in one counted repetition, then hi's
  // length from its 10…0 — few alternatives, so the matcher stays nearly deterministic.
  static Expr nonneg_range(int64_t lo, int64_t hi) {
    const std::string a = std::to_string(lo), b = std::to_string(hi);
    if (a.size() == b.size()) return same_length_range(a, b);
    std::vector<Expr> k;
    k.push_back(same_length_range(a, std::string(a.size(), '9')));
    if (b.size() >= a.size() + 2)
      k.push_back(seq({range('1', '9'), rep(range('0', '9'), int(a.size()), int(b.size()) - 2)}));
    k.push_back(same_length_range("1" + std::string(b.size() - 1, '0'), b));
    return alt(std::move(k));
  }
  static Expr int_range(int64_t lo, int64_t hi) {
    std::vector<Expr> k;
    if (lo < 0) k.push_back(seq({byte('-'), nonneg_range(std::max<int64_t>(1, hi < 0 ? -hi : 1), -lo)}));
    if (hi >= 0) k.push_back(nonneg_range(std::max<int64_t>(0, lo), hi));
    return alt(std::move(k));
  }

  Expr numeric(const json& s, const std::string& path, bool is_int) {
    const bool bounded = s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum") ||
                         (s.contains("minimum") && is_int);
    if (bounded) {
      if (!is_int) refuse(path, "'maximum' / 'exclusiveMinimum' / 'exclusiveMaximum' on numbers (integers only)");
      // The largest magnitude the integer grammar writes: 17 digits.
      constexpr int64_t kBig = 99999999999999999;
      auto clamp = [](double v) { return v >= 1e17 ? kBig : v <= -1e17 ? -kBig : int64_t(v); };
      int64_t lo = -kBig, hi = kBig;
      auto bound = [&](const char* key) -> std::optional<double> {
        auto it = s.find(key);
        if (it == s.end()) return std::nullopt;
        if (!it->is_number()) refuse(path, "a '{}' that is not a number", key);
        return it->get<double>();
      };
      if (auto v = bound("minimum")) lo = std::max(lo, clamp(std::ceil(*v)));
      if (auto v = bound("exclusiveMinimum")) lo = std::max(lo, clamp(std::floor(*v) + 1));
      if (auto v = bound("maximum")) hi = std::min(hi, clamp(std::floor(*v)));
      if (auto v = bound("exclusiveMaximum")) hi = std::min(hi, clamp(std::ceil(*v) - 1));
      if (lo > hi) refuse(path, "an integer range with no integer in it (empty range)");
      return int_range(lo, hi);
    }
    bool nonneg = false, positive = false;
    if (auto m = s.find("minimum"); m != s.end()) {
      if (!m->is_number()) refuse(path, "a 'minimum' that is not a number");
      const double v = m->get<double>();
      if (v == 0)
        nonneg = true;
      else if (is_int && v == 1)
        nonneg = positive = true;
      else
        refuse(path, "'minimum' other than 0 (or 1 for integers)");
    }
    return is_int ? integer(nonneg, positive) : number(nonneg, false);
  }

  Expr string(const json& s, const std::string& path) {
    const int lo = counted(s, "minLength", path, 0);
    const int hi = s.contains("maxLength") ? counted(s, "maxLength", path, 0) : -1;
    if (hi >= 0 && hi < lo) refuse(path, "'maxLength' below 'minLength'");
    if (lo == 0 && hi < 0) return ref(string_rule());
    return seq({byte('"'), rep(string_char(), lo, hi), byte('"')});
  }

  Expr array(const json& s, const std::string& path, int depth) {
    if (auto u = s.find("uniqueItems"); u != s.end() && u->is_boolean() && u->get<bool>())
      refuse(path, "'uniqueItems': true");
    const int lo = counted(s, "minItems", path, 0);
    const int hi = s.contains("maxItems") ? counted(s, "maxItems", path, 0) : -1;
    if (hi >= 0 && hi < lo) refuse(path, "'maxItems' below 'minItems'");
    Expr item;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) refuse(path, "'items' as an array (tuples)");
      item = ref(value_rule(*it, path + "/items", depth + 1));
    } else {
      item = any_value();
    }
    const Expr open = seq({byte('['), ws()}), close = seq({ws(), byte(']')});
    if (hi == 0) return seq({open, close});
    const Expr more = seq({ws(), byte(','), ws(), item});
    Expr body = seq({item, rep(more, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1)});
    return seq({open, lo > 0 ? std::move(body) : opt(std::move(body)), close});
  }

  Expr object(const json& s, const std::string& path, int depth) {
    const json* props = nullptr;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) refuse(path, "'properties' that is not an object");
      props = &*p;
    }
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) refuse(path, "'required' that is not an array");
      for (const json& x : *r) {
        if (!x.is_string()) refuse(path, "a 'required' entry that is not a string");
        required.insert(x.get<std::string>());
      }
    }
    for (const std::string& r : required)
      if (!props || !props->contains(r)) refuse(path, "the required property '{}' without a schema in 'properties'", r);
    const json* extra = nullptr;
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (!a->is_boolean() && !a->is_object()) refuse(path, "'additionalProperties' that is not a schema");
      extra = &*a;
    }
    const Expr open = seq({byte('{'), ws()}), close = seq({ws(), byte('}')});
    if (!props || props->empty()) {
      // Free keys: any string key, values under additionalProperties (absent or true: any value).
      if (extra && extra->is_boolean() && !extra->get<bool>()) return seq({open, close});
      const Expr v = extra && extra->is_object() ? ref(value_rule(*extra, path + "/additionalProperties", depth + 1))
                                                 : any_value();
      const Expr kv = seq({ref(string_rule()), ws(), byte(':'), ws(), v});
      return seq({open, opt(seq({kv, star(seq({ws(), byte(','), ws(), kv}))})), close});
    }
    // Declared properties in schema order; undeclared keys are never generated (valid whatever
    // additionalProperties says). kv[i]: "name": value.
    struct P {
      Expr kv;
      bool req;
    };
    std::vector<P> ps;
    for (auto it = props->begin(); it != props->end(); ++it) {
      const std::string sub = path + "/properties/" + it.key();
      ps.push_back(
          {seq({lit(json_literal(json(it.key()))), ws(), byte(':'), ws(), ref(value_rule(*it, sub, depth + 1))}),
           required.count(it.key()) > 0});
    }
    // after(i): the rest once something has been written: each later property with a leading comma, optional
    // unless required. first(i): the rest when nothing has been written yet.
    // Each suffix is a rule of its own, so the grammar stays linear in the number of properties.
    const size_t n = ps.size();
    std::vector<Expr> after(n + 1);
    for (size_t i = n; i-- > 0;) {
      Expr c = seq({ws(), byte(','), ws(), ps[i].kv});
      const int32_t r = g_.add_rule(fmt::format("{}/after{}", path, i));
      g_.define(r, seq({ps[i].req ? std::move(c) : opt(std::move(c)), after[i + 1]}));
      after[i] = ref(r);
    }
    // first(i) = kv_i after(i+1) | (optional i) first(i+1); first(n) = empty.
    Expr first = empty();
    for (size_t i = n; i-- > 0;) {
      Expr take = seq({ps[i].kv, after[i + 1]});
      Expr f = ps[i].req ? std::move(take) : (i + 1 == n ? opt(std::move(take)) : alt({std::move(take), first}));
      const int32_t r = g_.add_rule(fmt::format("{}/first{}", path, i));
      g_.define(r, f);
      first = ref(r);
    }
    return seq({open, first, close});
  }

  Grammar g_;
  const json& root_;
  int32_t ws_ = -1, string_ = -1, any_ = -1, any_object_ = -1;
  std::map<std::string, int32_t> refs_;
};

// ---- M3 tool calls ------------------------------------------------------------------------------------------------
constexpr std::string_view kNs = "]<]minimax[>[";

class ToolCompiler {
 public:
  ToolCompiler(const json& root) : c_(root) {}
  Compiler& c() { return c_; }

  // The XML form of a value under schema s (M3: strings verbatim, objects as child tags, arrays as <item>s).
  Expr xml_value(const json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) Compiler::refuse(path, "schemas nested deeper than {} levels", kMaxDepth);
    if (!s.is_object()) return text();  // true / no schema: any text
    if (auto r = s.find("$ref"); r != s.end()) {
      const json* target = nullptr;
      if (r->is_string() && r->get<std::string>().rfind('#', 0) == 0) {
        try {
          target = &root_of(s).at(json::json_pointer(r->get<std::string>().substr(1)));
        } catch (const std::exception&) {
        }
      }
      if (!target) return text();  // a reference outside the tool's schema: any text
      return xml_value(*target, path, depth + 1);
    }
    if (auto e = s.find("enum"); e != s.end() && e->is_array() && !e->empty()) {
      std::vector<Expr> k;
      for (const json& v : *e) k.push_back(lit(v.is_string() ? v.get<std::string>() : json_literal(v)));
      return alt(std::move(k));
    }
    if (auto cst = s.find("const"); cst != s.end())
      return lit(cst->is_string() ? cst->get<std::string>() : json_literal(*cst));
    for (const char* key : {"anyOf", "oneOf"})
      if (auto a = s.find(key); a != s.end() && a->is_array() && !a->empty()) {
        std::vector<Expr> k;
        for (size_t i = 0; i < a->size(); ++i)
          k.push_back(xml_value((*a)[i], fmt::format("{}/{}/{}", path, key, i), depth + 1));
        return alt(std::move(k));
      }
    std::vector<std::string> types;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_string())
        types.push_back(t->get<std::string>());
      else if (t->is_array())
        for (const json& x : *t)
          if (x.is_string()) types.push_back(x.get<std::string>());
    } else if (s.contains("properties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    }
    if (types.empty()) return text();
    std::vector<Expr> k;
    for (const std::string& t : types) {
      if (t == "string")
        k.push_back(text());
      else if (t == "integer" || t == "number" || t == "boolean" || t == "null") {
        // Tool schemas come from agent frameworks with keywords the compiler cannot express (format, pattern,
        // bounds on numbers, ...): the type is enforced, integer bounds and a number's minimum 0 too, the rest is
        // not (docs/SERVER.md).
        json one = {{"type", t}};
        for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
          if (auto m = s.find(key); m != s.end() && m->is_number() &&
                                    (t == "integer" || (std::string(key) == "minimum" && m->get<double>() == 0)))
            one[key] = *m;
        k.push_back(c_.value(one, path, depth));
      } else if (t == "object")
        k.push_back(xml_object(s, path, depth));
      else if (t == "array")
        k.push_back(xml_array(s, path, depth));
      else
        k.push_back(text());  // an unknown type: the parser keeps the text
    }
    return alt(std::move(k));
  }

  Expr element(const std::string& tag, Expr inner) {
    return seq({lit(kNs), lit("<" + tag + ">"), std::move(inner), lit(kNs), lit("</" + tag + ">")});
  }

  Expr xml_object(const json& s, const std::string& path, int depth) {
    auto p = s.find("properties");
    if (p == s.end() || !p->is_object() || p->empty()) return ref(c_.any_object_rule());  // JSON text
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end() && r->is_array())
      for (const json& x : *r)
        if (x.is_string()) required.insert(x.get<std::string>());
    std::vector<Expr> parts;
    for (auto it = p->begin(); it != p->end(); ++it) {
      Expr e = element(it.key(), xml_value(*it, path + "/properties/" + it.key(), depth + 1));
      parts.push_back(required.count(it.key()) ? std::move(e) : opt(std::move(e)));
    }
    return seq(std::move(parts));
  }

  Expr xml_array(const json& s, const std::string& path, int depth) {
    auto it = s.find("items");
    Expr item = element("item", it != s.end() ? xml_value(*it, path + "/items", depth + 1) : text());
    int lo = 0, hi = -1;
    if (auto m = s.find("minItems"); m != s.end() && m->is_number_integer())
      lo = std::min(int(m->get<int64_t>()), kMaxCounted);
    if (auto m = s.find("maxItems"); m != s.end() && m->is_number_integer())
      hi = std::min(int(m->get<int64_t>()), kMaxCounted);
    if (hi >= 0 && hi < lo) hi = lo;
    return rep(item, lo, hi);
  }

  // Verbatim text of a string parameter: any UTF-8 without the sequence "]<" (which starts the closing marker).
  Expr text() {
    if (text_ < 0) {
      text_ = c_.grammar().add_rule("text");
      // A: after anything but ']'; B: after one or more ']'. '<' may not follow ']'.
      const Expr not_bracket = alt({cls("\x01\x5c\x5e\x7f"), utf8_multi()});
      const Expr after_bracket = alt({cls("\x01\x3b\x3d\x5c\x5e\x7f"), utf8_multi()});
      // text := (not_bracket | ']'+ after_bracket)* ']'*
      c_.grammar().define(text_,
                          seq({star(alt({not_bracket, seq({plus(byte(']')), after_bracket})})), star(byte(']'))}));
    }
    return ref(text_);
  }

  void set_root(const json* root) { root_ = root; }

 private:
  static Expr utf8_multi() {
    return alt({
        seq({range(0xc2, 0xdf), range(0x80, 0xbf)}),
        seq({byte(0xe0), range(0xa0, 0xbf), range(0x80, 0xbf)}),
        seq({cls("\xe1\xec\xee\xef"), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({byte(0xed), range(0x80, 0x9f), range(0x80, 0xbf)}),
        seq({byte(0xf0), range(0x90, 0xbf), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({range(0xf1, 0xf3), range(0x80, 0xbf), range(0x80, 0xbf), range(0x80, 0xbf)}),
        seq({byte(0xf4), range(0x80, 0x8f), range(0x80, 0xbf), range(0x80, 0xbf)}),
    });
  }
  const json& root_of(const json&) { return *root_; }

  Compiler c_;
  const json* root_ = nullptr;
  int32_t text_ = -1;
};

}  // namespace

Grammar json_schema_grammar(const json& schema) {
  Compiler c(schema);
  return c.compile_value_root(schema);
}

Grammar json_object_grammar() {
  const json schema = {{"type", "object"}};
  Compiler c(schema);
  return c.compile_value_root(schema);
}

Grammar m3_tool_call_grammar(const std::vector<ToolSchema>& tools, bool parallel) {
  if (tools.empty()) throw SchemaError("tool_choice needs at least one tool");
  static const json kNull;
  ToolCompiler tc(kNull);
  Grammar& g = tc.c().grammar();
  std::vector<Expr> invokes;
  for (const ToolSchema& t : tools) {
    tc.set_root(&t.parameters);
    if (t.name.empty() || t.name.find_first_of("\"<>") != std::string::npos)
      throw SchemaError(fmt::format("tool name '{}' cannot be written in M3's markup", t.name));
    Expr params = t.parameters.is_object() && t.parameters.contains("properties")
                      ? tc.xml_object(t.parameters, "/" + t.name, 0)
                      : empty();
    invokes.push_back(
        seq({lit(kNs), lit("<invoke name=\"" + t.name + "\">"), std::move(params), lit(kNs), lit("</invoke>")}));
  }
  const int32_t invoke = g.add_rule("invoke");
  g.define(invoke, alt(std::move(invokes)));
  const Expr nl = opt(byte('\n'));
  const int32_t root = g.add_rule("root");
  Expr calls = parallel ? seq({ref(invoke), star(seq({nl, ref(invoke)}))}) : ref(invoke);
  g.define(root, seq({rep(cls("\n\n  "), 0, 4), lit(kNs), lit("<tool_call>"), nl, std::move(calls), nl, lit(kNs),
                      lit("</tool_call>"), rep(cls("\n\n"), 0, 2)}));
  g.set_root(root);
  return std::move(g);
}

}  // namespace m3::grammar
