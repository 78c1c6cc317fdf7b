// Jinja evaluator: executes the AST over JSON data with jinja2's runtime semantics (scoping, default
// Undefined, sandboxed attribute lookup, filters, tests, string/dict methods, macros, loops).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include <utf8proc.h>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {

namespace {

enum class Flow { Normal, Break, Continue };

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find(const std::string& n) {
    for (auto& [k, v] : vars)
      if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    if (Value* p = find(n))
      *p = std::move(v);
    else
      vars.emplace_back(n, std::move(v));
  }
};
using FramePtr = std::shared_ptr<Frame>;

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return "function";
    case Value::Kind::Loop: return "LoopContext";
    case Value::Kind::Data: break;
  }
  const Json& j = v.j();
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_integer()) return "int";
  if (j.is_number_float()) return "float";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

using FilterFn = Value (*)(Evaluator&, const Value&, CallValues&);
using TestFn = bool (*)(Evaluator&, const Value&, CallValues&);
const std::unordered_map<std::string, FilterFn>& filters();
const std::unordered_map<std::string, TestFn>& tests();

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

class Evaluator {
 public:
  Evaluator(const Program& p, const Json& ctx) : prog_(p) {
    // Non-owning (aliasing with an empty owner): the caller's context outlives the render.
    root_data_.kind = Value::Kind::Data;
    root_data_.data = std::shared_ptr<const Json>(std::shared_ptr<const Json>(), &ctx);
    root_ = std::make_shared<Frame>();
    install_globals();
  }

  std::string run() {
    std::string out;
    exec(prog_.body, root_, out);
    return out;
  }

  // ------------------------------------------------------------------------------------ errors
  [[noreturn]] void rt_fail(int line, const std::string& msg) const {
    fail("{}:{}: {}", prog_.name, line, msg);
  }
  void need(const Value& v, int line) const {
    if (v.is_undefined()) rt_fail(line, v.hint);
  }
  int line() const { return cur_line_; }

  // ------------------------------------------------------------------------------------ helpers
  static const Value* arg(CallValues& a, size_t idx, const char* name) {
    if (idx < a.pos.size()) return &a.pos[idx];
    for (auto& [k, v] : a.kw)
      if (k == name) return &v;
    return nullptr;
  }

  std::string as_string(const Value& v) const { return py_str(v); }

  Json to_json(const Value& v, int line) const {
    if (v.is_data()) return v.j();
    if (v.is_undefined()) return nullptr;
    rt_fail(line, "a " + type_name(v) + " value cannot be stored in a list or dict");
  }

  std::vector<Value> iterate(const Value& v, int line) const {
    std::vector<Value> r;
    if (v.is_undefined()) return r;
    if (!v.is_data()) rt_fail(line, "'" + type_name(v) + "' object is not iterable");
    const Json& j = v.j();
    if (j.is_array()) {
      r.reserve(j.size());
      for (const auto& e : j) {
        r.push_back(Value::child(v, &e));
        if (v.shape == 2) r.back().shape = 1;
      }
    } else if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) r.push_back(Value::of(it.key()));
    } else if (j.is_string()) {
      for (auto c : utf8_chars(v.str())) r.push_back(Value::of(std::string(c)));
    } else {
      rt_fail(line, "'" + type_name(v) + "' object is not iterable");
    }
    return r;
  }

  static Value list_value(const std::vector<Value>& items, const Evaluator& ev, int line) {
    Json arr = Json::array();
    bool all_tuples = !items.empty();
    for (auto& x : items) {
      arr.push_back(ev.to_json(x, line));
      all_tuples = all_tuples && x.shape == 1;
    }
    Value v = Value::of(std::move(arr));
    if (all_tuples) v.shape = 2;
    return v;
  }

  void check_size(size_t n, int line) const {
    if (n > prog_.opts.max_output_bytes) rt_fail(line, "template output exceeds the size limit");
  }

  // ------------------------------------------------------------------------------------ lookups
  Value lookup(const std::string& name, const FramePtr& f) {
    for (Frame* fr = f.get(); fr; fr = fr->parent.get())
      if (Value* v = fr->find(name)) return *v;
    const Json& ctx = root_data_.j();
    auto it = ctx.find(name);
    if (it != ctx.end()) return Value::child(root_data_, &*it);
    auto g = globals_.find(name);
    if (g != globals_.end()) return g->second;
    return Value::undefined("'" + name + "' is undefined");
  }

  Value bound(std::string name, std::function<Value(Evaluator&, CallValues&)> fn) {
    Value v;
    v.kind = Value::Kind::Callable;
    v.fn = std::make_shared<Callable>();
    v.fn->name = std::move(name);
    v.fn->fn = std::move(fn);
    return v;
  }

  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
  Value string_method(const Value& obj, const std::string& name);
  Value dict_method(const Value& obj, const std::string& name);
  Value list_method(const Value& obj, const std::string& name);
  Value loop_attr(const Value& obj, const std::string& name);

  // ------------------------------------------------------------------------------------ eval
  Value eval(const Expr& e, const FramePtr& f);
  Value call(const Value& callee, CallValues& args, int line) {
    if (callee.kind == Value::Kind::Callable) {
      args.line = line;
      int saved = cur_line_;
      cur_line_ = line;
      Value r = callee.fn->fn(*this, args);
      cur_line_ = saved;
      return r;
    }
    need(callee, line);
    rt_fail(line, "'" + type_name(callee) + "' object is not callable");
  }
  void eval_args(const CallArgs& a, const FramePtr& f, CallValues& out) {
    for (auto& p : a.pos) out.pos.push_back(eval(*p, f));
    for (auto& [k, v] : a.kw) out.kw.emplace_back(k, eval(*v, f));
  }
  Value apply_filter(const Expr& e, const Value& input, const FramePtr& f) {
    CallValues args;
    eval_args(e.args, f, args);
    args.line = e.line;
    int saved = cur_line_;
    cur_line_ = e.line;
    Value r = filters().at(e.name)(*this, input, args);
    cur_line_ = saved;
    return r;
  }
  // A filter chain whose innermost input is `input` (for {% filter %} and {% set x | f %}).
  Value apply_filter_chain(const Expr& e, const Value& input, const FramePtr& f) {
    Value in = e.a ? apply_filter_chain(*e.a, input, f) : input;
    return apply_filter(e, in, f);
  }
  bool run_test(const std::string& name, const Value& v, CallValues& args, int line) {
    args.line = line;
    int saved = cur_line_;
    cur_line_ = line;
    bool r = tests().at(name)(*this, v, args);
    cur_line_ = saved;
    return r;
  }
  Value binary(const std::string& op, const Value& l, const Value& r, int line);
  bool compare(const std::string& op, const Value& l, const Value& r, int line);
  bool contains(const Value& container, const Value& item, int line);
  Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line);

  // ------------------------------------------------------------------------------------ exec
  Flow exec(const Body& body, const FramePtr& f, std::string& out);
  void bind_targets(const Stmt& s, const Value& v, Frame& f);
  Value make_macro(const Stmt& s, const FramePtr& def_frame);
  Value invoke_macro(const Stmt& s, const std::vector<MacroParam>& params, const Body& body,
                     const FramePtr& def_frame, CallValues& args, const std::string& name);

  const Program& prog_;
  int depth_ = 0;
  int cur_line_ = 0;

 private:
  void install_globals();

  Value root_data_;
  FramePtr root_;
  std::unordered_map<std::string, Value> globals_;
};

// ============================================================================================ globals

void Evaluator::install_globals() {
  globals_["range"] = bound("range", [](Evaluator& ev, CallValues& a) -> Value {
    std::vector<int64_t> p;
    for (auto& v : a.pos) {
      if (!v.is_int() && !v.is_bool()) ev.rt_fail(a.line, "range() arguments must be integers");
      p.push_back(num_as_int(v.j()));
    }
    if (p.empty() || p.size() > 3) ev.rt_fail(a.line, "range expected 1 to 3 arguments");
    int64_t start = p.size() == 1 ? 0 : p[0], stop = p.size() == 1 ? p[0] : p[1], step = p.size() == 3 ? p[2] : 1;
    if (step == 0) ev.rt_fail(a.line, "range() arg 3 must not be zero");
    Json arr = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      // Same cap as jinja2's sandbox (MAX_RANGE).
      if (arr.size() >= 100000) ev.rt_fail(a.line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      arr.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return Value::of(std::move(arr));
  });
  globals_["namespace"] = bound("namespace", [](Evaluator& ev, CallValues& a) -> Value {
    Value v;
    v.kind = Value::Kind::Namespace;
    v.ns = std::make_shared<Namespace>();
    for (auto& p : a.pos) {
      if (!p.is_dict()) ev.rt_fail(a.line, "namespace() positional argument must be a mapping");
      for (auto it = p.j().begin(); it != p.j().end(); ++it) {
        if (Value* x = v.ns->find(it.key()))
          *x = Value::child(p, &it.value());
        else
          v.ns->attrs.emplace_back(it.key(), Value::child(p, &it.value()));
      }
    }
    for (auto& [k, x] : a.kw) {
      if (Value* y = v.ns->find(k))
        *y = x;
      else
        v.ns->attrs.emplace_back(k, x);
    }
    return v;
  });
  globals_["dict"] = bound("dict", [](Evaluator& ev, CallValues& a) -> Value {
    Json o = Json::object();
    for (auto& p : a.pos) {
      if (!p.is_dict()) ev.rt_fail(a.line, "dict() positional argument must be a mapping");
      for (auto it = p.j().begin(); it != p.j().end(); ++it) o[it.key()] = it.value();
    }
    for (auto& [k, x] : a.kw) o[k] = ev.to_json(x, a.line);
    return Value::of(std::move(o));
  });
  globals_["raise_exception"] = bound("raise_exception", [](Evaluator&, CallValues& a) -> Value {
    // transformers raises TemplateError(message); the message is meant for the API client.
    throw Error(a.pos.empty() ? std::string("raise_exception called") : py_str(a.pos[0]));
  });
  globals_["strftime_now"] = bound("strftime_now", [](Evaluator& ev, CallValues& a) -> Value {
    const Value* f = arg(a, 0, "format");
    if (!f || !f->is_string()) ev.rt_fail(a.line, "strftime_now expects a format string");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof(buf), f->str().c_str(), &tm);
    return Value::of(std::string(buf, n));
  });
}

// ============================================================================================ attributes

Value Evaluator::get_attr(const Value& obj, const std::string& name, int line) {
  switch (obj.kind) {
    case Value::Kind::Undefined: rt_fail(line, obj.hint);
    case Value::Kind::Namespace: {
      if (Value* v = obj.ns->find(name)) return *v;
      return Value::undefined("'Namespace' object has no attribute '" + name + "'");
    }
    case Value::Kind::Loop: return loop_attr(obj, name);
    case Value::Kind::Callable: return Value::undefined("'function' object has no attribute '" + name + "'");
    case Value::Kind::Data: break;
  }
  const Json& j = obj.j();
  if (j.is_object()) {
    Value m = dict_method(obj, name);
    if (!m.is_undefined() || !m.hint.empty()) return m;
    auto it = j.find(name);
    if (it != j.end()) return Value::child(obj, &*it);
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  if (j.is_string()) {
    Value m = string_method(obj, name);
    if (!m.is_undefined() || !m.hint.empty()) return m;
    return Value::undefined("'str object' has no attribute '" + name + "'");
  }
  if (j.is_array()) {
    Value m = list_method(obj, name);
    if (!m.is_undefined() || !m.hint.empty()) return m;
    return Value::undefined("'list object' has no attribute '" + name + "'");
  }
  return Value::undefined("'" + py_str(obj) + "' has no attribute '" + name + "'");
}

Value Evaluator::get_item(const Value& obj, const Value& key, int line) {
  switch (obj.kind) {
    case Value::Kind::Undefined: rt_fail(line, obj.hint);
    case Value::Kind::Namespace:
    case Value::Kind::Loop:
    case Value::Kind::Callable:
      if (key.is_string()) return get_attr(obj, key.str(), line);
      return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
    case Value::Kind::Data: break;
  }
  const Json& j = obj.j();
  if (j.is_object()) {
    if (key.is_string()) {
      auto it = j.find(key.str());
      if (it != j.end()) return Value::child(obj, &*it);
      Value m = dict_method(obj, key.str());
      if (!m.is_undefined() || !m.hint.empty()) return m;
      return Value::undefined("'dict object' has no attribute '" + key.str() + "'");
    }
    return Value::undefined("'dict object' has no attribute " + py_str(key));
  }
  if (j.is_array() || j.is_string()) {
    if (key.is_int() || key.is_bool()) {
      int64_t i = num_as_int(key.j());
      if (j.is_array()) {
        int64_t n = static_cast<int64_t>(j.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("list object has no element " + py_str(key));
        Value r = Value::child(obj, &j[static_cast<size_t>(i)]);
        if (obj.shape == 2) r.shape = 1;
        return r;
      }
      auto chars = utf8_chars(obj.str());
      int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("str object has no element " + py_str(key));
      return Value::of(std::string(chars[static_cast<size_t>(i)]));
    }
    if (key.is_string()) return get_attr(obj, key.str(), line);
    return Value::undefined("'" + type_name(obj) + "' object has no element " + py_str(key));
  }
  return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
}

Value Evaluator::loop_attr(const Value& obj, const std::string& name) {
  const LoopInfo& L = *obj.loop;
  int64_t n = static_cast<int64_t>(L.items->size());
  int64_t i = L.index0;
  if (name == "index") return Value::of(i + 1);
  if (name == "index0") return Value::of(i);
  if (name == "revindex") return Value::of(n - i);
  if (name == "revindex0") return Value::of(n - i - 1);
  if (name == "first") return Value::of(i == 0);
  if (name == "last") return Value::of(i == n - 1);
  if (name == "length") return Value::of(n);
  if (name == "depth") return Value::of(L.depth0 + 1);
  if (name == "depth0") return Value::of(L.depth0);
  if (name == "previtem") {
    if (i == 0) return Value::undefined("there is no previous item");
    return (*L.items)[static_cast<size_t>(i - 1)];
  }
  if (name == "nextitem") {
    if (i + 1 >= n) return Value::undefined("there is no next item");
    return (*L.items)[static_cast<size_t>(i + 1)];
  }
  if (name == "cycle") {
    return bound("cycle", [i](Evaluator& ev, CallValues& a) -> Value {
      if (a.pos.empty()) ev.rt_fail(a.line, "no items for cycling given");
      return a.pos[static_cast<size_t>(i) % a.pos.size()];
    });
  }
  return Value::undefined("'LoopContext' object has no attribute '" + name + "'");
}

namespace {
Value unsafe(const std::string& type, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type + "' object is unsafe.");
}
}  // namespace

Value Evaluator::dict_method(const Value& obj, const std::string& name) {
  if (name == "get") {
    return bound("get", [obj](Evaluator& ev, CallValues& a) -> Value {
      const Value* k = arg(a, 0, "key");
      const Value* d = arg(a, 1, "default");
      if (!k) ev.rt_fail(a.line, "get expected at least 1 argument");
      if (k->is_string()) {
        auto it = obj.j().find(k->str());
        if (it != obj.j().end()) return Value::child(obj, &*it);
      }
      return d ? *d : Value::of(nullptr);
    });
  }
  if (name == "items") {
    return bound("items", [obj](Evaluator&, CallValues&) -> Value {
      Json arr = Json::array();
      for (auto it = obj.j().begin(); it != obj.j().end(); ++it) arr.push_back(Json::array({it.key(), it.value()}));
      Value r = Value::of(std::move(arr));
      r.shape = 2;
      return r;
    });
  }
  if (name == "keys") {
    return bound("keys", [obj](Evaluator&, CallValues&) -> Value {
      Json arr = Json::array();
      for (auto it = obj.j().begin(); it != obj.j().end(); ++it) arr.push_back(it.key());
      return Value::of(std::move(arr));
    });
  }
  if (name == "values") {
    return bound("values", [obj](Evaluator&, CallValues&) -> Value {
      Json arr = Json::array();
      for (auto it = obj.j().begin(); it != obj.j().end(); ++it) arr.push_back(it.value());
      return Value::of(std::move(arr));
    });
  }
  if (name == "copy") {
    return bound("copy", [obj](Evaluator&, CallValues&) -> Value { return Value::of(obj.j()); });
  }
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
    return unsafe("dict", name);
  return Value{};
}

Value Evaluator::list_method(const Value& obj, const std::string& name) {
  if (name == "index" || name == "count") {
    bool is_index = name == "index";
    return bound(name, [obj, is_index](Evaluator& ev, CallValues& a) -> Value {
      if (a.pos.empty()) ev.rt_fail(a.line, "list method expects an argument");
      int64_t cnt = 0, idx = 0;
      for (const auto& e : obj.j()) {
        if (a.pos[0].is_data() && py_eq_json(e, a.pos[0].j())) {
          if (is_index) return Value::of(idx);
          ++cnt;
        }
        ++idx;
      }
      if (is_index) ev.rt_fail(a.line, py_str(a.pos[0]) + " is not in list");
      return Value::of(cnt);
    });
  }
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
      name == "reverse" || name == "sort" || name == "clear")
    return unsafe("list", name);
  return Value{};
}

namespace {

std::string str_arg(Evaluator& ev, CallValues& a, size_t idx, const char* name, bool required = true) {
  const Value* v = Evaluator::arg(a, idx, name);
  if (!v || v->is_none()) {
    if (required) ev.rt_fail(a.line, std::string("missing string argument '") + name + "'");
    return {};
  }
  if (!v->is_string()) ev.rt_fail(a.line, std::string("argument '") + name + "' must be str, not " + type_name(*v));
  return v->str();
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  size_t i = 0;
  bool first = true;
  while (i < s.size()) {
    size_t st = i;
    utf8_decode_at(s, i);
    out += first ? py_upper(s.substr(st, i - st)) : py_lower(s.substr(st, i - st));
    first = false;
  }
  return out;
}

bool is_cased_letter(uint32_t cp) {
  if (cp < 0x80) return std::isalpha(static_cast<int>(cp)) != 0;
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

// Python str.title(): a cased char following an uncased one is upper-cased, others lower-cased.
std::string py_title_method(std::string_view s) {
  std::string out;
  size_t i = 0;
  bool prev_cased = false;
  while (i < s.size()) {
    size_t st = i;
    uint32_t cp = utf8_decode_at(s, i);
    std::string_view ch = s.substr(st, i - st);
    out += prev_cased ? py_lower(ch) : py_upper(ch);
    prev_cased = is_cased_letter(cp);
  }
  return out;
}

std::vector<std::string> py_split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
    size_t q = s.find(sep, pos);
    if (q == std::string::npos) break;
    out.push_back(s.substr(pos, q - pos));
    pos = q + sep.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::vector<std::string> py_rsplit_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t end = s.size();
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
    if (end < sep.size()) break;
    size_t q = s.rfind(sep, end - sep.size());
    if (q == std::string::npos) break;
    out.push_back(s.substr(q + sep.size(), end - q - sep.size()));
    end = q;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Json strings_to_json(const std::vector<std::string>& v) {
  Json arr = Json::array();
  for (auto& s : v) arr.push_back(s);
  return arr;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `rep` before every code point and at the end.
    auto chars = utf8_chars(s);
    int64_t done = 0;
    for (auto c : chars) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) out += rep;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t q = s.find(old, pos);
    if (q == std::string::npos) break;
    out.append(s, pos, q - pos);
    out += rep;
    pos = q + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

bool str_pred(const std::string& s, int which) {
  // which: 0 isdigit, 1 isalpha, 2 isalnum, 3 isspace, 4 islower, 5 isupper
  if (s.empty()) return false;
  bool any_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = utf8_decode_at(s, i);
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    bool digit = cat == UTF8PROC_CATEGORY_ND;
    bool alpha = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
                 cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO;
    switch (which) {
      case 0: if (!digit) return false; break;
      case 1: if (!alpha) return false; break;
      case 2: if (!alpha && !digit && cat != UTF8PROC_CATEGORY_NL && cat != UTF8PROC_CATEGORY_NO) return false; break;
      case 3: if (!py_isspace_cp(cp)) return false; break;
      case 4:
        if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) return false;
        if (cat == UTF8PROC_CATEGORY_LL) any_cased = true;
        break;
      case 5:
        if (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT) return false;
        if (cat == UTF8PROC_CATEGORY_LU) any_cased = true;
        break;
    }
  }
  return which < 4 ? true : any_cased;
}

int64_t cp_index_of_byte(const std::string& s, size_t byte_pos) { return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_pos))); }

}  // namespace

Value Evaluator::string_method(const Value& obj, const std::string& name) {
  const std::string s = obj.str();
  using F = std::function<Value(Evaluator&, CallValues&)>;
  F f;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    f = [s, l, r](Evaluator& ev, CallValues& a) -> Value {
      const Value* c = arg(a, 0, "chars");
      if (c && !c->is_none()) {
        std::string chars = str_arg(ev, a, 0, "chars");
        return Value::of(py_strip(s, l, r, &chars));
      }
      return Value::of(py_strip(s, l, r, nullptr));
    };
  } else if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    f = [s, right](Evaluator& ev, CallValues& a) -> Value {
      const Value* ms = arg(a, 1, "maxsplit");
      int64_t maxsplit = ms && ms->is_number() ? num_as_int(ms->j()) : -1;
      std::string sep = str_arg(ev, a, 0, "sep", false);
      const Value* sv = arg(a, 0, "sep");
      if (!sv || sv->is_none()) {
        if (right && maxsplit >= 0) ev.rt_fail(a.line, "rsplit() without a separator and with maxsplit is not supported");
        return Value::of(strings_to_json(py_split_whitespace(s, maxsplit)));
      }
      if (sep.empty()) ev.rt_fail(a.line, "empty separator");
      return Value::of(strings_to_json(right ? py_rsplit_sep(s, sep, maxsplit) : py_split_sep(s, sep, maxsplit)));
    };
  } else if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    f = [s, starts](Evaluator& ev, CallValues& a) -> Value {
      if (a.pos.empty()) ev.rt_fail(a.line, "startswith/endswith expects an argument");
      if (a.pos.size() > 1) ev.rt_fail(a.line, "startswith/endswith start/end arguments are not supported");
      std::vector<std::string> cands;
      if (a.pos[0].is_list()) {
        for (auto& e : a.pos[0].j()) {
          if (!e.is_string()) ev.rt_fail(a.line, "tuple for startswith must only contain str");
          cands.push_back(e.get<std::string>());
        }
      } else {
        cands.push_back(str_arg(ev, a, 0, "prefix"));
      }
      for (auto& c : cands) {
        if (c.size() > s.size()) continue;
        if (starts ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0)
          return Value::of(true);
      }
      return Value::of(false);
    };
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
    std::string n = name;
    f = [s, n](Evaluator& ev, CallValues& a) -> Value {
      if (n == "upper") return Value::of(py_upper(s));
      if (n == "lower") return Value::of(py_lower(s));
      if (n == "title") return Value::of(py_title_method(s));
      if (n == "capitalize") return Value::of(py_capitalize(s));
      ev.rt_fail(a.line, "str.swapcase is not supported");
    };
  } else if (name == "replace") {
    f = [s](Evaluator& ev, CallValues& a) -> Value {
      std::string old = str_arg(ev, a, 0, "old"), rep = str_arg(ev, a, 1, "new");
      const Value* c = arg(a, 2, "count");
      int64_t count = c && c->is_number() ? num_as_int(c->j()) : -1;
      return Value::of(py_replace(s, old, rep, count));
    };
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    std::string n = name;
    f = [s, n](Evaluator& ev, CallValues& a) -> Value {
      if (a.pos.size() > 1) ev.rt_fail(a.line, "str." + n + " start/end arguments are not supported");
      std::string sub = str_arg(ev, a, 0, "sub");
      if (n == "count") {
        if (sub.empty()) return Value::of(static_cast<int64_t>(utf8_length(s) + 1));
        int64_t c = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
        return Value::of(c);
      }
      size_t p = (n == "find" || n == "index") ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) {
        if (n == "index" || n == "rindex") ev.rt_fail(a.line, "substring not found");
        return Value::of(int64_t{-1});
      }
      return Value::of(cp_index_of_byte(s, p));
    };
  } else if (name == "join") {
    f = [s](Evaluator& ev, CallValues& a) -> Value {
      if (a.pos.empty()) ev.rt_fail(a.line, "join expects an iterable");
      std::string out;
      bool first = true;
      for (auto& x : ev.iterate(a.pos[0], a.line)) {
        if (!x.is_string()) ev.rt_fail(a.line, "sequence item: expected str instance, " + type_name(x) + " found");
        if (!first) out += s;
        first = false;
        out += x.str();
      }
      return Value::of(std::move(out));
    };
  } else if (name == "splitlines") {
    f = [s](Evaluator&, CallValues&) -> Value { return Value::of(strings_to_json(py_splitlines(s))); };
  } else if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
             name == "isupper") {
    int which = name == "isdigit" ? 0 : name == "isalpha" ? 1 : name == "isalnum" ? 2 : name == "isspace" ? 3
                : name == "islower" ? 4 : 5;
    f = [s, which](Evaluator&, CallValues&) -> Value { return Value::of(str_pred(s, which)); };
  } else if (name == "removeprefix" || name == "removesuffix") {
    bool pre = name == "removeprefix";
    f = [s, pre](Evaluator& ev, CallValues& a) -> Value {
      std::string x = str_arg(ev, a, 0, pre ? "prefix" : "suffix");
      if (pre && s.compare(0, x.size(), x) == 0 && x.size() <= s.size()) return Value::of(s.substr(x.size()));
      if (!pre && x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::of(s.substr(0, s.size() - x.size()));
      return Value::of(s);
    };
  } else if (name == "format") {
    f = [s](Evaluator& ev, CallValues& a) -> Value {
      // str.format with plain {} / {0} / {name} fields (no conversions or format specs).
      std::string out;
      size_t auto_idx = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        char c = s[i];
        if (c == '{' && i + 1 < s.size() && s[i + 1] == '{') {
          out += '{';
          ++i;
        } else if (c == '}' && i + 1 < s.size() && s[i + 1] == '}') {
          out += '}';
          ++i;
        } else if (c == '{') {
          size_t e = s.find('}', i);
          if (e == std::string::npos) ev.rt_fail(a.line, "Single '{' encountered in format string");
          std::string field = s.substr(i + 1, e - i - 1);
          if (field.find_first_of(":!.[") != std::string::npos)
            ev.rt_fail(a.line, "str.format field '" + field + "' is not supported");
          const Value* v = nullptr;
          if (field.empty()) {
            if (auto_idx < a.pos.size()) v = &a.pos[auto_idx++];
          } else if (field.size() < 9 && std::all_of(field.begin(), field.end(), ::isdigit)) {
            size_t k = std::stoul(field);
            if (k < a.pos.size()) v = &a.pos[k];
          } else {
            for (auto& [k, x] : a.kw)
              if (k == field) v = &x;
          }
          if (!v) ev.rt_fail(a.line, "str.format: missing argument for field '{" + field + "}'");
          out += py_str(*v);
          i = e;
        } else {
          out += c;
        }
      }
      return Value::of(std::move(out));
    };
  } else {
    static const char* other[] = {"casefold", "center", "encode", "expandtabs", "format_map", "isascii",
                                  "isdecimal", "isidentifier", "isnumeric", "isprintable", "istitle",
                                  "ljust", "maketrans", "partition", "rjust", "rpartition", "translate", "zfill"};
    for (const char* o : other)
      if (name == o) {
        std::string n = name;
        return bound(n, [n](Evaluator& ev, CallValues& a) -> Value {
          ev.rt_fail(a.line, "str." + n + "() is not supported by this template renderer");
        });
      }
    return Value{};
  }
  return bound(name, std::move(f));
}

// ============================================================================================ operators

namespace {

// Python printf-style formatting: fmt % args. `args` holds the positional values (a tuple's items, or
// the single right-hand value); `mapping` is set for "%(name)s" forms.
std::string py_percent_format(Evaluator& ev, const std::string& fmt, const std::vector<Value>& args,
                              const Value* mapping, int line) {
  std::string out;
  size_t next_arg = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c != '%') {
      out += c;
      continue;
    }
    if (++i >= fmt.size()) ev.rt_fail(line, "incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* arg = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos) ev.rt_fail(line, "incomplete format key");
      if (!mapping || !mapping->is_dict()) ev.rt_fail(line, "format requires a mapping");
      auto it = mapping->j().find(fmt.substr(i + 1, e - i - 1));
      if (it == mapping->j().end()) ev.rt_fail(line, "KeyError: '" + fmt.substr(i + 1, e - i - 1) + "'");
      keyed = Value::child(*mapping, &*it);
      arg = &keyed;
      i = e + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i]) && fmt[i] != 0) flags += fmt[i++];
    std::string width, prec;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) width += fmt[i++];
    bool has_prec = false;
    if (i < fmt.size() && fmt[i] == '.') {
      has_prec = true;
      ++i;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) prec += fmt[i++];
    }
    if (width.size() > 4 || prec.size() > 3) ev.rt_fail(line, "format width/precision too large");
    if (i >= fmt.size()) ev.rt_fail(line, "incomplete format");
    char conv = fmt[i];
    if (!arg) {
      if (next_arg >= args.size()) ev.rt_fail(line, "not enough arguments for format string");
      arg = &args[next_arg++];
    }
    std::string body;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        body = conv == 's' ? py_str(*arg) : (arg->is_data() ? py_repr_json(arg->j()) : py_str(*arg));
        if (has_prec) {
          auto chars = utf8_chars(body);
          size_t p = prec.empty() ? 0 : std::stoul(prec);
          if (chars.size() > p) {
            std::string t;
            for (size_t k = 0; k < p; ++k) t += chars[k];
            body = t;
          }
        }
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o':
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!arg->is_number())
          ev.rt_fail(line, std::string("%") + conv + " format: a real number is required, not " + type_name(*arg));
        std::string spec = "%" + flags + (has_prec ? "." + (prec.empty() ? std::string("0") : prec) : std::string());
        char buf[512];
        if (std::strchr("diuxXo", conv)) {
          spec += std::string("ll") + (conv == 'i' || conv == 'u' ? 'd' : conv);
          std::snprintf(buf, sizeof(buf), spec.c_str(), static_cast<long long>(num_as_int(arg->j())));
        } else {
          spec += conv;
          std::snprintf(buf, sizeof(buf), spec.c_str(), num_as_double(arg->j()));
        }
        body = buf;
        break;
      }
      case 'c': {
        if (arg->is_string() && utf8_length(arg->str()) == 1) {
          body = arg->str();
        } else if (arg->is_int()) {
          int64_t cp = num_as_int(arg->j());
          if (cp < 0 || cp > 0x10FFFF) ev.rt_fail(line, "%c arg not in range(0x110000)");
          utf8_append(body, static_cast<uint32_t>(cp));
        } else {
          ev.rt_fail(line, "%c requires int or char");
        }
        break;
      }
      default: ev.rt_fail(line, std::string("unsupported format character '") + conv + "'");
    }
    size_t w = width.empty() ? 0 : std::stoul(width);
    size_t len = utf8_length(body);
    if (len < w) {
      bool left = flags.find('-') != std::string::npos;
      bool zero = flags.find('0') != std::string::npos && std::strchr("diuxXoeEfFgG", conv) && !left;
      if (left) {
        body += std::string(w - len, ' ');
      } else if (zero) {
        size_t sign = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
        body.insert(sign, std::string(w - len, '0'));
      } else {
        body = std::string(w - len, ' ') + body;
      }
    }
    out += body;
  }
  if (!mapping && next_arg < args.size()) ev.rt_fail(line, "not all arguments converted during string formatting");
  return out;
}

}  // namespace

Value Evaluator::binary(const std::string& op, const Value& l, const Value& r, int line) {
  if (op == "~") {
    std::string s = py_str(l);
    s += py_str(r);
    check_size(s.size(), line);
    return Value::of(std::move(s));
  }
  need(l, line);
  need(r, line);
  auto bad = [&]() -> Value {
    rt_fail(line, "unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
  };
  if (!l.is_data() || !r.is_data()) return bad();
  const Json& a = l.j();
  const Json& b = r.j();
  bool an = l.is_number(), bn = r.is_number();
  if (an && bn) {
    bool fl = a.is_number_float() || b.is_number_float();
    if (!fl && (op == "+" || op == "-" || op == "*")) {
      // 64-bit ints (Python's are unbounded): overflow is an error, not wrap-around.
      int64_t x = num_as_int(a), y = num_as_int(b), res = 0;
      bool ovf = op == "+" ? __builtin_add_overflow(x, y, &res)
                 : op == "-" ? __builtin_sub_overflow(x, y, &res)
                             : __builtin_mul_overflow(x, y, &res);
      if (ovf) rt_fail(line, "integer overflow in '" + op + "'");
      return Value::of(res);
    }
    if (op == "+") return Value::of(num_as_double(a) + num_as_double(b));
    if (op == "-") return Value::of(num_as_double(a) - num_as_double(b));
    if (op == "*") return Value::of(num_as_double(a) * num_as_double(b));
    if (op == "/") {
      if (num_as_double(b) == 0) rt_fail(line, "division by zero");
      return Value::of(num_as_double(a) / num_as_double(b));
    }
    if (op == "//" || op == "%") {
      if (num_as_double(b) == 0) rt_fail(line, op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (fl) {
        // CPython's float_divmod.
        double x = num_as_double(a), y = num_as_double(b);
        double m = std::fmod(x, y);
        double div = (x - m) / y;
        if (m != 0) {
          if ((y < 0) != (m < 0)) {
            m += y;
            div -= 1.0;
          }
        } else {
          m = std::copysign(0.0, y);
        }
        if (op == "%") return Value::of(m);
        double fd;
        if (div != 0) {
          fd = std::floor(div);
          if (div - fd > 0.5) fd += 1.0;
        } else {
          fd = std::copysign(0.0, x / y);
        }
        return Value::of(fd);
      }
      int64_t x = num_as_int(a), y = num_as_int(b);
      if (x == INT64_MIN && y == -1) rt_fail(line, "integer overflow in '" + op + "'");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return op == "//" ? Value::of(q) : Value::of(m);
    }
    if (op == "**") {
      if (!fl && num_as_int(b) >= 0) {
        // Exponentiation by squaring; overflow is an error (Python ints are unbounded).
        int64_t base = num_as_int(a), e = num_as_int(b), res = 1;
        while (e > 0) {
          if ((e & 1) && __builtin_mul_overflow(res, base, &res)) rt_fail(line, "integer overflow in **");
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) rt_fail(line, "integer overflow in **");
        }
        return Value::of(res);
      }
      return Value::of(std::pow(num_as_double(a), num_as_double(b)));
    }
    return bad();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.get_ref<const std::string&>().size() + b.get_ref<const std::string&>().size(), line);
      return Value::of(a.get_ref<const std::string&>() + b.get_ref<const std::string&>());
    }
    if (a.is_array() && b.is_array()) {
      Json c = a;
      for (auto& e : b) c.push_back(e);
      return Value::of(std::move(c));
    }
    if (a.is_string()) rt_fail(line, "can only concatenate str (not \"" + type_name(r) + "\") to str");
    if (a.is_array()) rt_fail(line, "can only concatenate list (not \"" + type_name(r) + "\") to list");
    return bad();
  }
  if (op == "*") {
    const Json* seq = nullptr;
    const Json* cnt = nullptr;
    if ((a.is_string() || a.is_array()) && (b.is_number_integer() || b.is_boolean())) {
      seq = &a;
      cnt = &b;
    } else if ((b.is_string() || b.is_array()) && (a.is_number_integer() || a.is_boolean())) {
      seq = &b;
      cnt = &a;
    }
    if (!seq) return bad();
    int64_t n = std::max<int64_t>(0, num_as_int(*cnt));
    if (seq->is_string()) {
      const std::string& s = seq->get_ref<const std::string&>();
      if (!s.empty() && static_cast<uint64_t>(n) > prog_.opts.max_output_bytes / s.size())
        rt_fail(line, "string repetition exceeds the size limit");
      std::string out;
      out.reserve(s.size() * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) out += s;
      return Value::of(std::move(out));
    }
    if (!seq->empty() && static_cast<uint64_t>(n) > (1u << 24) / seq->size()) rt_fail(line, "list repetition too large");
    Json out = Json::array();
    for (int64_t i = 0; i < n; ++i)
      for (auto& e : *seq) out.push_back(e);
    return Value::of(std::move(out));
  }
  if (op == "%" && a.is_string()) {
    std::vector<Value> args;
    const Value* mapping = nullptr;
    if (r.shape == 1 && b.is_array()) {
      for (const auto& e : b) args.push_back(Value::child(r, &e));
    } else {
      args.push_back(r);
      if (b.is_object()) mapping = &r;
    }
    std::string res = py_percent_format(*this, a.get_ref<const std::string&>(), args, mapping, line);
    return Value::of(std::move(res));
  }
  return bad();
}

bool Evaluator::contains(const Value& container, const Value& item, int line) {
  if (container.is_undefined()) return false;
  if (!container.is_data()) rt_fail(line, "argument of type '" + type_name(container) + "' is not iterable");
  const Json& c = container.j();
  if (c.is_string()) {
    if (!item.is_string()) rt_fail(line, "'in <string>' requires string as left operand, not " + type_name(item));
    return c.get_ref<const std::string&>().find(item.str()) != std::string::npos;
  }
  if (c.is_array()) {
    if (!item.is_data()) return false;
    for (auto& e : c)
      if (py_eq_json(e, item.j())) return true;
    return false;
  }
  if (c.is_object()) {
    if (!item.is_string()) return false;
    return c.contains(item.str());
  }
  rt_fail(line, "argument of type '" + type_name(container) + "' is not iterable");
}

bool Evaluator::compare(const std::string& op, const Value& l, const Value& r, int line) {
  if (op == "==") return py_eq(l, r);
  if (op == "!=") return !py_eq(l, r);
  if (op == "in") return contains(r, l, line);
  if (op == "notin") return !contains(r, l, line);
  need(l, line);
  need(r, line);
  bool ok = false;
  bool res = false;
  if (l.is_data() && r.is_data()) {
    if (op == "<") res = py_less_json(l.j(), r.j(), ok);
    else if (op == ">") res = py_less_json(r.j(), l.j(), ok);
    else if (op == "<=") res = !py_less_json(r.j(), l.j(), ok);
    else if (op == ">=") res = !py_less_json(l.j(), r.j(), ok);
  }
  if (!ok)
    rt_fail(line, "'" + op + "' not supported between instances of '" + type_name(l) + "' and '" + type_name(r) + "'");
  return res;
}

Value Evaluator::slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line) {
  need(obj, line);
  auto get = [&](const Value* v, bool& present) -> int64_t {
    present = v && !v->is_none() && !v->is_undefined();
    if (!present) return 0;
    if (!v->is_int() && !v->is_bool()) rt_fail(line, "slice indices must be integers or None");
    return num_as_int(v->j());
  };
  bool has_start, has_stop, has_step;
  int64_t a = get(start, has_start), b = get(stop, has_stop), st = get(step, has_step);
  if (!has_step) st = 1;
  if (st == 0) rt_fail(line, "slice step cannot be zero");
  if (!obj.is_data() || !(obj.j().is_array() || obj.j().is_string()))
    rt_fail(line, "'" + type_name(obj) + "' object is not subscriptable");
  bool is_str = obj.j().is_string();
  std::vector<std::string_view> chars;
  if (is_str) chars = utf8_chars(obj.str());
  int64_t n = is_str ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.j().size());
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](int64_t v, bool present, int64_t def) {
    if (!present) return def;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  int64_t lo = adjust(a, has_start, st < 0 ? n - 1 : 0);
  int64_t hi = adjust(b, has_stop, st < 0 ? -1 : n);
  std::string s;
  Json arr = Json::array();
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
    if (is_str)
      s += chars[static_cast<size_t>(i)];
    else
      arr.push_back(obj.j()[static_cast<size_t>(i)]);
  }
  if (is_str) return Value::of(std::move(s));
  Value r = Value::of(std::move(arr));
  r.shape = obj.shape;
  return r;
}

// ============================================================================================ eval

Value Evaluator::eval(const Expr& e, const FramePtr& f) {
  switch (e.kind) {
    case EK::Literal: return Value::of(e.lit);
    case EK::Name: return lookup(e.name, f);
    case EK::List:
    case EK::Tuple: {
      Json arr = Json::array();
      for (auto& it : e.items) arr.push_back(to_json(eval(*it, f), e.line));
      Value v = Value::of(std::move(arr));
      if (e.kind == EK::Tuple) v.shape = 1;
      return v;
    }
    case EK::Dict: {
      Json obj = Json::object();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i], f);
        if (!k.is_string()) rt_fail(e.line, "dict literal keys must be strings");
        obj[k.str()] = to_json(eval(*e.items[i + 1], f), e.line);
      }
      return Value::of(std::move(obj));
    }
    case EK::GetAttr: return get_attr(eval(*e.a, f), e.name, e.line);
    case EK::GetItem: {
      Value o = eval(*e.a, f);
      Value k = eval(*e.b, f);
      return get_item(o, k, e.line);
    }
    case EK::Slice: {
      Value o = eval(*e.a, f);
      Value v[3];
      const Value* p[3] = {nullptr, nullptr, nullptr};
      for (int i = 0; i < 3; ++i)
        if (e.items[i]) {
          v[i] = eval(*e.items[i], f);
          p[i] = &v[i];
        }
      return slice(o, p[0], p[1], p[2], e.line);
    }
    case EK::Call: {
      Value callee = eval(*e.a, f);
      CallValues args;
      eval_args(e.args, f, args);
      return call(callee, args, e.line);
    }
    case EK::Filter: {
      Value in = e.a ? eval(*e.a, f) : Value{};
      return apply_filter(e, in, f);
    }
    case EK::Test: {
      Value v = eval(*e.a, f);
      CallValues args;
      eval_args(e.args, f, args);
      bool r = run_test(e.name, v, args, e.line);
      return Value::of(e.negated ? !r : r);
    }
    case EK::Neg:
    case EK::Pos: {
      Value v = eval(*e.a, f);
      need(v, e.line);
      if (!v.is_number()) rt_fail(e.line, "bad operand type for unary " + std::string(e.kind == EK::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
      if (e.kind == EK::Pos) return v.is_bool() ? Value::of(num_as_int(v.j())) : v;
      if (v.is_float()) return Value::of(-v.j().get<double>());
      if (num_as_int(v.j()) == INT64_MIN) rt_fail(e.line, "integer overflow in unary '-'");
      return Value::of(-num_as_int(v.j()));
    }
    case EK::Not: return Value::of(!py_truthy(eval(*e.a, f)));
    case EK::Binary: {
      Value l = eval(*e.a, f);
      Value r = eval(*e.b, f);
      return binary(e.name, l, r, e.line);
    }
    case EK::And: {
      Value l = eval(*e.a, f);
      if (!py_truthy(l)) return l;
      return eval(*e.b, f);
    }
    case EK::Or: {
      Value l = eval(*e.a, f);
      if (py_truthy(l)) return l;
      return eval(*e.b, f);
    }
    case EK::Compare: {
      Value l = eval(*e.a, f);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value r = eval(*e.items[i], f);
        if (!compare(e.ops[i], l, r, e.line)) return Value::of(false);
        l = std::move(r);
      }
      return Value::of(true);
    }
    case EK::Cond: {
      if (py_truthy(eval(*e.items[1], f))) return eval(*e.items[0], f);
      if (e.items.size() > 2) return eval(*e.items[2], f);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
  }
  rt_fail(e.line, "internal error: unknown expression");
}

// ============================================================================================ statements

void Evaluator::bind_targets(const Stmt& s, const Value& v, Frame& f) {
  if (!s.tuple_target) {
    f.set(s.targets[0], v);
    return;
  }
  std::vector<Value> items = iterate(v, s.line);
  if (items.size() != s.targets.size())
    rt_fail(s.line, items.size() < s.targets.size()
                        ? fmt::format("not enough values to unpack (expected {}, got {})", s.targets.size(), items.size())
                        : fmt::format("too many values to unpack (expected {})", s.targets.size()));
  for (size_t i = 0; i < items.size(); ++i) f.set(s.targets[i], items[i]);
}

Value Evaluator::invoke_macro(const Stmt& s, const std::vector<MacroParam>& params, const Body& body,
                              const FramePtr& def_frame, CallValues& args, const std::string& name) {
  if (++depth_ > prog_.opts.max_call_depth) rt_fail(s.line, "maximum macro recursion depth exceeded");
  auto frame = std::make_shared<Frame>();
  frame->parent = def_frame;
  std::vector<bool> used_kw(args.kw.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    const MacroParam& p = params[i];
    if (i < args.pos.size()) {
      frame->set(p.name, args.pos[i]);
      continue;
    }
    bool found = false;
    for (size_t k = 0; k < args.kw.size(); ++k)
      if (args.kw[k].first == p.name) {
        frame->set(p.name, args.kw[k].second);
        used_kw[k] = true;
        found = true;
      }
    if (found) continue;
    if (p.def)
      frame->set(p.name, eval(*p.def, frame));
    else
      frame->set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
  }
  Json varargs = Json::array();
  for (size_t i = params.size(); i < args.pos.size(); ++i) varargs.push_back(to_json(args.pos[i], s.line));
  Value va = Value::of(std::move(varargs));
  va.shape = 1;
  frame->set("varargs", va);
  Json kwargs = Json::object();
  for (size_t k = 0; k < args.kw.size(); ++k) {
    if (used_kw[k]) continue;
    if (args.kw[k].first == "caller") {
      frame->set("caller", args.kw[k].second);
      continue;
    }
    kwargs[args.kw[k].first] = to_json(args.kw[k].second, s.line);
  }
  frame->set("kwargs", Value::of(std::move(kwargs)));
  (void)name;
  std::string out;
  exec(body, frame, out);
  --depth_;
  return Value::of(std::move(out));
}

Value Evaluator::make_macro(const Stmt& s, const FramePtr& def_frame) {
  const Stmt* sp = &s;
  std::weak_ptr<Frame> weak = def_frame;  // the defining frame owns this macro: avoid a ref cycle
  return bound(s.text, [sp, weak](Evaluator& ev, CallValues& a) -> Value {
    FramePtr df = weak.lock();
    if (!df) ev.rt_fail(sp->line, "macro '" + sp->text + "' called outside its scope");
    return ev.invoke_macro(*sp, sp->params, sp->body, df, a, sp->text);
  });
}

Flow Evaluator::exec(const Body& body, const FramePtr& f, std::string& out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    switch (s.kind) {
      case SK::Data:
        out += s.text;
        check_size(out.size(), s.line);
        break;
      case SK::Output:
        out += py_str(eval(*s.expr, f));
        check_size(out.size(), s.line);
        break;
      case SK::If: {
        bool done = false;
        for (size_t i = 0; i < s.conds.size(); ++i) {
          if (py_truthy(eval(*s.conds[i], f))) {
            Flow fl = exec(s.bodies[i], f, out);
            if (fl != Flow::Normal) return fl;
            done = true;
            break;
          }
        }
        if (!done) {
          Flow fl = exec(s.else_body, f, out);
          if (fl != Flow::Normal) return fl;
        }
        break;
      }
      case SK::For: {
        Value seq = eval(*s.expr, f);
        std::vector<Value> items = iterate(seq, s.line);
        if (s.cond) {
          std::vector<Value> kept;
          for (auto& it : items) {
            auto tmp = std::make_shared<Frame>();
            tmp->parent = f;
            bind_targets(s, it, *tmp);
            if (py_truthy(eval(*s.cond, tmp))) kept.push_back(it);
          }
          items.swap(kept);
        }
        if (items.empty()) {
          Flow fl = exec(s.else_body, f, out);
          if (fl != Flow::Normal) return fl;
          break;
        }
        auto info = std::make_shared<LoopInfo>();
        info->items = std::make_shared<std::vector<Value>>(std::move(items));
        Value loopv;
        loopv.kind = Value::Kind::Loop;
        loopv.loop = info;
        for (size_t i = 0; i < info->items->size(); ++i) {
          // A fresh frame per iteration: jinja2 does not carry loop-body assignments to the next one.
          auto fr = std::make_shared<Frame>();
          fr->parent = f;
          info->index0 = static_cast<int64_t>(i);
          bind_targets(s, (*info->items)[i], *fr);
          fr->set("loop", loopv);
          Flow fl = exec(s.body, fr, out);
          if (fl == Flow::Break) break;
        }
        break;
      }
      case SK::Set: {
        Value v = eval(*s.expr, f);
        if (!s.attr.empty()) {
          Value target = lookup(s.targets[0], f);
          if (target.kind != Value::Kind::Namespace)
            rt_fail(s.line, "cannot assign attribute on non-namespace object");
          if (Value* x = target.ns->find(s.attr))
            *x = v;
          else
            target.ns->attrs.emplace_back(s.attr, v);
        } else {
          bind_targets(s, v, *f);
        }
        break;
      }
      case SK::SetBlock: {
        std::string captured;
        exec(s.body, f, captured);
        Value v = Value::of(std::move(captured));
        if (s.expr) v = apply_filter_chain(*s.expr, v, f);
        f->set(s.targets[0], v);
        break;
      }
      case SK::Macro: f->set(s.text, make_macro(s, f)); break;
      case SK::CallBlock: {
        const Expr& call_e = *s.expr;
        const Stmt* sp2 = &s;
        FramePtr cf = f;
        Value caller = bound("caller", [sp2, cf](Evaluator& ev, CallValues& a) -> Value {
          return ev.invoke_macro(*sp2, sp2->params, sp2->body, cf, a, "caller");
        });
        Value callee = eval(*call_e.a, f);
        CallValues args;
        eval_args(call_e.args, f, args);
        args.kw.emplace_back("caller", caller);
        out += py_str(call(callee, args, s.line));
        check_size(out.size(), s.line);
        break;
      }
      case SK::FilterBlock: {
        std::string captured;
        exec(s.body, f, captured);
        out += py_str(apply_filter_chain(*s.expr, Value::of(std::move(captured)), f));
        check_size(out.size(), s.line);
        break;
      }
      case SK::With: {
        auto fr = std::make_shared<Frame>();
        fr->parent = f;
        for (size_t i = 0; i < s.targets.size(); ++i) fr->set(s.targets[i], eval(*s.values[i], f));
        Flow fl = exec(s.body, fr, out);
        if (fl != Flow::Normal) return fl;
        break;
      }
      case SK::Break: return Flow::Break;
      case SK::Continue: return Flow::Continue;
    }
  }
  return Flow::Normal;
}

// ============================================================================================ filters

namespace {

const Value* A(CallValues& a, size_t i, const char* n) { return Evaluator::arg(a, i, n); }

bool arg_bool(CallValues& a, size_t i, const char* n, bool def) {
  const Value* v = A(a, i, n);
  return v ? py_truthy(*v) : def;
}

// jinja2's make_attrgetter: "a.b.0" -> getitem chain.
Value attr_path(Evaluator& ev, const Value& item, const std::string& path, int line) {
  Value cur = item;
  size_t st = 0;
  while (true) {
    size_t d = path.find('.', st);
    std::string part = path.substr(st, d == std::string::npos ? std::string::npos : d - st);
    Value key = Value::of(part);
    if (!part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), ::isdigit))
      key = Value::of(static_cast<int64_t>(std::stoll(part)));
    cur = ev.get_item(cur, key, line);
    if (d == std::string::npos) break;
    st = d + 1;
  }
  return cur;
}

Value f_default(Evaluator&, const Value& v, CallValues& a) {
  const Value* d = A(a, 0, "default_value");
  bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !py_truthy(v))) return d ? *d : Value::of(std::string());
  return v;
}

Value f_length(Evaluator& ev, const Value& v, CallValues& a) {
  if (v.is_undefined()) return Value::of(int64_t{0});
  if (v.is_data()) {
    const Json& j = v.j();
    if (j.is_string()) return Value::of(static_cast<int64_t>(utf8_length(v.str())));
    if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
  }
  ev.rt_fail(a.line, "object of type '" + type_name(v) + "' has no len()");
}

Value f_tojson(Evaluator& ev, const Value& v, CallValues& a) {
  // transformers: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
  if (!v.is_data()) {
    ev.need(v, a.line);
    ev.rt_fail(a.line, "Object of type " + type_name(v) + " is not JSON serializable");
  }
  DumpOpts o;
  o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  const Value* ind = A(a, 1, "indent");
  if (ind && !ind->is_none() && !ind->is_undefined()) {
    o.has_indent = true;
    if (ind->is_string())
      o.indent = ind->str();
    else if (ind->is_int())
      o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(num_as_int(ind->j()), 0, 4096)), ' ');
    else
      ev.rt_fail(a.line, "tojson indent must be an int or a string");
    o.item_sep = ",";
  }
  const Value* sep = A(a, 2, "separators");
  if (sep && !sep->is_none() && !sep->is_undefined()) {
    if (!sep->is_list() || sep->j().size() != 2 || !sep->j()[0].is_string() || !sep->j()[1].is_string())
      ev.rt_fail(a.line, "tojson separators must be a pair of strings");
    o.item_sep = sep->j()[0].get<std::string>();
    o.key_sep = sep->j()[1].get<std::string>();
  }
  o.sort_keys = arg_bool(a, 3, "sort_keys", false);
  return Value::of(py_json_dumps(v.j(), o));
}

Value f_str(Evaluator&, const Value& v, CallValues&) { return Value::of(py_str(v)); }
Value f_safe(Evaluator&, const Value& v, CallValues&) { return v; }
Value f_upper(Evaluator&, const Value& v, CallValues&) { return Value::of(py_upper(py_str(v))); }
Value f_lower(Evaluator&, const Value& v, CallValues&) { return Value::of(py_lower(py_str(v))); }
Value f_capitalize(Evaluator&, const Value& v, CallValues&) { return Value::of(py_capitalize(py_str(v))); }

Value f_title(Evaluator&, const Value& v, CallValues&) {
  // jinja2 do_title: words start after runs of [-\s({\[<].
  std::string s = py_str(v), out;
  size_t i = 0;
  bool start = true;
  while (i < s.size()) {
    size_t st = i;
    uint32_t cp = utf8_decode_at(s, i);
    std::string_view ch(s.data() + st, i - st);
    if (cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace_cp(cp)) {
      out += ch;
      start = true;
    } else {
      out += start ? py_upper(ch) : py_lower(ch);
      start = false;
    }
  }
  return Value::of(std::move(out));
}

Value f_trim(Evaluator& ev, const Value& v, CallValues& a) {
  const Value* c = A(a, 0, "chars");
  std::string s = py_str(v);
  if (c && !c->is_none()) {
    if (!c->is_string()) ev.rt_fail(a.line, "trim chars must be a string");
    std::string chars = c->str();
    return Value::of(py_strip(s, true, true, &chars));
  }
  return Value::of(py_strip(s, true, true, nullptr));
}

Value f_join(Evaluator& ev, const Value& v, CallValues& a) {
  const Value* d = A(a, 0, "d");
  const Value* attr = A(a, 1, "attribute");
  std::string sep = d ? py_str(*d) : std::string();
  std::string out;
  bool first = true;
  for (auto& x : ev.iterate(v, a.line)) {
    if (!first) out += sep;
    first = false;
    out += py_str(attr && !attr->is_none() ? attr_path(ev, x, py_str(*attr), a.line) : x);
  }
  return Value::of(std::move(out));
}

Value f_first(Evaluator& ev, const Value& v, CallValues& a) {
  auto items = ev.iterate(v, a.line);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}
Value f_last(Evaluator& ev, const Value& v, CallValues& a) {
  auto items = ev.iterate(v, a.line);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_replace(Evaluator& ev, const Value& v, CallValues& a) {
  const Value* o = A(a, 0, "old");
  const Value* n = A(a, 1, "new");
  const Value* c = A(a, 2, "count");
  if (!o || !n) ev.rt_fail(a.line, "replace expects old and new strings");
  int64_t count = c && c->is_number() ? num_as_int(c->j()) : -1;
  return Value::of(py_replace(py_str(v), py_str(*o), py_str(*n), count));
}

// Python int(str): optional sign, digits with single underscores, surrounding whitespace.
bool parse_py_int(const std::string& raw, int base, int64_t& out) {
  std::string s = py_strip(raw, true, true, nullptr);
  if (s.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    i = 1;
  }
  std::string digits;
  bool prev_us = true;
  for (; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (prev_us) return false;
      prev_us = true;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(s[i])) ? s[i] - '0'
            : std::isalpha(static_cast<unsigned char>(s[i])) ? std::tolower(s[i]) - 'a' + 10
                                                             : 99;
    if (d >= base) return false;
    digits += s[i];
    prev_us = false;
  }
  if (digits.empty() || prev_us) return false;
  errno = 0;
  long long v = std::strtoll(digits.c_str(), nullptr, base);
  if (errno == ERANGE) return false;
  out = neg ? -v : v;
  return true;
}

bool parse_py_float(const std::string& raw, double& out) {
  std::string s = py_strip(raw, true, true, nullptr);
  if (s.empty()) return false;
  std::string t;
  for (char c : s)
    if (c != '_') t += c;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end && *end == 0 && !t.empty();
}

Value f_int(Evaluator&, const Value& v, CallValues& a) {
  const Value* d = A(a, 0, "default");
  const Value* b = A(a, 1, "base");
  int base = b && b->is_int() ? static_cast<int>(num_as_int(b->j())) : 10;
  Value def = d ? *d : Value::of(int64_t{0});
  if (!v.is_data()) return def;
  const Json& j = v.j();
  if (j.is_boolean() || j.is_number_integer()) return Value::of(num_as_int(j));
  if (j.is_number_float()) {
    double x = j.get<double>();
    if (!std::isfinite(x)) return def;
    return Value::of(num_as_int(Json(std::trunc(x))));
  }
  if (j.is_string()) {
    int64_t r;
    if (parse_py_int(v.str(), base, r)) return Value::of(r);
    double x;
    if (parse_py_float(v.str(), x) && std::isfinite(x)) return Value::of(num_as_int(Json(std::trunc(x))));
  }
  return def;
}

Value f_float(Evaluator&, const Value& v, CallValues& a) {
  const Value* d = A(a, 0, "default");
  Value def = d ? *d : Value::of(0.0);
  if (!v.is_data()) return def;
  const Json& j = v.j();
  if (j.is_boolean() || j.is_number()) return Value::of(num_as_double(j));
  if (j.is_string()) {
    double x;
    if (parse_py_float(v.str(), x)) return Value::of(x);
  }
  return def;
}

Value f_list(Evaluator& ev, const Value& v, CallValues& a) {
  return Evaluator::list_value(ev.iterate(v, a.line), ev, a.line);
}

Value f_items(Evaluator& ev, const Value& v, CallValues& a) {
  if (v.is_undefined()) return Value::of(Json::array());
  if (!v.is_dict()) ev.rt_fail(a.line, "Can only get item pairs from a mapping.");
  Json arr = Json::array();
  for (auto it = v.j().begin(); it != v.j().end(); ++it) arr.push_back(Json::array({it.key(), it.value()}));
  Value r = Value::of(std::move(arr));
  r.shape = 2;
  return r;
}

Json sort_key(const Json& j, bool case_sensitive) {
  if (!case_sensitive && j.is_string()) return py_lower(j.get_ref<const std::string&>());
  return j;
}

Value f_dictsort(Evaluator& ev, const Value& v, CallValues& a) {
  if (!v.is_dict()) ev.rt_fail(a.line, "dictsort expects a mapping");
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = A(a, 1, "by");
  bool by_value = by && by->is_string() && by->str() == "value";
  bool reverse = arg_bool(a, 2, "reverse", false);
  std::vector<Json> pairs;
  for (auto it = v.j().begin(); it != v.j().end(); ++it) pairs.push_back(Json::array({it.key(), it.value()}));
  bool ok = true;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Json& x, const Json& y) {
    bool o2;
    bool r = reverse ? py_less_json(sort_key(y[by_value], cs), sort_key(x[by_value], cs), o2)
                     : py_less_json(sort_key(x[by_value], cs), sort_key(y[by_value], cs), o2);
    ok = ok && o2;
    return r;
  });
  if (!ok) ev.rt_fail(a.line, "dictsort: values are not orderable");
  Json arr = Json::array();
  for (auto& p : pairs) arr.push_back(std::move(p));
  Value r = Value::of(std::move(arr));
  r.shape = 2;
  return r;
}

bool apply_named_test(Evaluator& ev, const std::string& name, const Value& v, const std::vector<Value>& extra,
                      int line) {
  auto it = tests().find(name);
  if (it == tests().end()) ev.rt_fail(line, "no test named '" + name + "'");
  CallValues ta;
  ta.pos = extra;
  ta.line = line;
  return it->second(ev, v, ta);
}

Value select_impl(Evaluator& ev, const Value& v, CallValues& a, bool by_attr, bool keep_if) {
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) ev.rt_fail(a.line, "selectattr/rejectattr need an attribute name");
    attr = py_str(a.pos[0]);
    i = 1;
  }
  std::string test;
  std::vector<Value> extra;
  if (i < a.pos.size()) {
    test = py_str(a.pos[i]);
    extra.assign(a.pos.begin() + static_cast<long>(i) + 1, a.pos.end());
  }
  std::vector<Value> out;
  for (auto& x : ev.iterate(v, a.line)) {
    Value t = by_attr ? attr_path(ev, x, attr, a.line) : x;
    bool r = test.empty() ? py_truthy(t) : apply_named_test(ev, test, t, extra, a.line);
    if (r == keep_if) out.push_back(x);
  }
  return Evaluator::list_value(out, ev, a.line);
}
Value f_select(Evaluator& ev, const Value& v, CallValues& a) { return select_impl(ev, v, a, false, true); }
Value f_reject(Evaluator& ev, const Value& v, CallValues& a) { return select_impl(ev, v, a, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, CallValues& a) { return select_impl(ev, v, a, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, CallValues& a) { return select_impl(ev, v, a, true, false); }

Value f_map(Evaluator& ev, const Value& v, CallValues& a) {
  std::vector<Value> out;
  const Value* attr = nullptr;
  const Value* def = nullptr;
  for (auto& [k, x] : a.kw) {
    if (k == "attribute") attr = &x;
    if (k == "default") def = &x;
  }
  auto items = ev.iterate(v, a.line);
  if (attr) {
    for (auto& x : items) {
      Value r = attr_path(ev, x, py_str(*attr), a.line);
      if (r.is_undefined() && def) r = *def;
      out.push_back(r);
    }
    return Evaluator::list_value(out, ev, a.line);
  }
  if (a.pos.empty()) ev.rt_fail(a.line, "map requires a filter name or attribute=");
  std::string fname = py_str(a.pos[0]);
  auto it = filters().find(fname);
  if (it == filters().end()) ev.rt_fail(a.line, "no filter named '" + fname + "'");
  for (auto& x : items) {
    CallValues fa;
    fa.pos.assign(a.pos.begin() + 1, a.pos.end());
    fa.kw = a.kw;
    fa.line = a.line;
    out.push_back(it->second(ev, x, fa));
  }
  return Evaluator::list_value(out, ev, a.line);
}

Value f_indent(Evaluator& ev, const Value& v, CallValues& a) {
  const Value* w = A(a, 0, "width");
  std::string ind = "    ";
  if (w) {
    if (w->is_string())
      ind = w->str();
    else if (w->is_int())
      ind = std::string(static_cast<size_t>(std::clamp<int64_t>(num_as_int(w->j()), 0, 4096)), ' ');
    else
      ev.rt_fail(a.line, "indent width must be an int or a string");
  }
  bool first = arg_bool(a, 1, "first", false);
  bool blank = arg_bool(a, 2, "blank", false);
  std::string s = py_str(v) + "\n";
  auto lines = py_splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        rv += lines[i].empty() ? lines[i] : ind + lines[i];
      }
    }
  }
  if (first) rv = ind + rv;
  return Value::of(std::move(rv));
}

Value f_reverse(Evaluator& ev, const Value& v, CallValues& a) {
  if (v.is_string()) {
    auto chars = utf8_chars(v.str());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value::of(std::move(out));
  }
  auto items = ev.iterate(v, a.line);
  std::reverse(items.begin(), items.end());
  return Evaluator::list_value(items, ev, a.line);
}

Value f_sort(Evaluator& ev, const Value& v, CallValues& a) {
  bool reverse = arg_bool(a, 0, "reverse", false);
  bool cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attr = A(a, 2, "attribute");
  auto items = ev.iterate(v, a.line);
  std::vector<std::pair<Json, Value>> keyed;
  for (auto& x : items) {
    Value k = attr && !attr->is_none() ? attr_path(ev, x, py_str(*attr), a.line) : x;
    keyed.emplace_back(sort_key(ev.to_json(k, a.line), cs), x);
  }
  bool ok = true;
  std::stable_sort(keyed.begin(), keyed.end(), [&](auto& x, auto& y) {
    bool o2;
    bool r = reverse ? py_less_json(y.first, x.first, o2) : py_less_json(x.first, y.first, o2);
    ok = ok && o2;
    return r;
  });
  if (!ok) ev.rt_fail(a.line, "sort: values are not orderable");
  std::vector<Value> out;
  for (auto& [k, x] : keyed) out.push_back(x);
  return Evaluator::list_value(out, ev, a.line);
}

Value f_unique(Evaluator& ev, const Value& v, CallValues& a) {
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = A(a, 1, "attribute");
  std::vector<Json> seen;
  std::vector<Value> out;
  for (auto& x : ev.iterate(v, a.line)) {
    Value k = attr && !attr->is_none() ? attr_path(ev, x, py_str(*attr), a.line) : x;
    Json kj = sort_key(ev.to_json(k, a.line), cs);
    bool dup = false;
    for (auto& s : seen)
      if (py_eq_json(s, kj)) dup = true;
    if (!dup) {
      seen.push_back(kj);
      out.push_back(x);
    }
  }
  return Evaluator::list_value(out, ev, a.line);
}

Value minmax(Evaluator& ev, const Value& v, CallValues& a, bool want_max) {
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = A(a, 1, "attribute");
  auto items = ev.iterate(v, a.line);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  Json bk;
  for (size_t i = 0; i < items.size(); ++i) {
    Value k = attr && !attr->is_none() ? attr_path(ev, items[i], py_str(*attr), a.line) : items[i];
    Json kj = sort_key(ev.to_json(k, a.line), cs);
    if (i == 0) {
      bk = kj;
      continue;
    }
    bool ok;
    bool better = want_max ? py_less_json(bk, kj, ok) : py_less_json(kj, bk, ok);
    if (!ok) ev.rt_fail(a.line, "min/max: values are not orderable");
    if (better) {
      best = i;
      bk = kj;
    }
  }
  return items[best];
}
Value f_min(Evaluator& ev, const Value& v, CallValues& a) { return minmax(ev, v, a, false); }
Value f_max(Evaluator& ev, const Value& v, CallValues& a) { return minmax(ev, v, a, true); }

Value f_sum(Evaluator& ev, const Value& v, CallValues& a) {
  const Value* attr = A(a, 0, "attribute");
  const Value* start = A(a, 1, "start");
  Value acc = start ? *start : Value::of(int64_t{0});
  for (auto& x : ev.iterate(v, a.line)) {
    Value k = attr && !attr->is_none() ? attr_path(ev, x, py_str(*attr), a.line) : x;
    acc = ev.binary("+", acc, k, a.line);
  }
  return acc;
}

Value f_abs(Evaluator& ev, const Value& v, CallValues& a) {
  if (!v.is_number()) ev.rt_fail(a.line, "bad operand type for abs(): '" + type_name(v) + "'");
  if (v.is_float()) return Value::of(std::fabs(v.j().get<double>()));
  if (num_as_int(v.j()) == INT64_MIN) ev.rt_fail(a.line, "integer overflow in abs()");
  return Value::of(std::llabs(num_as_int(v.j())));
}

Value f_round(Evaluator& ev, const Value& v, CallValues& a) {
  if (!v.is_number()) ev.rt_fail(a.line, "round expects a number");
  const Value* p = A(a, 0, "precision");
  const Value* m = A(a, 1, "method");
  int64_t prec = p && p->is_number() ? num_as_int(p->j()) : 0;
  std::string method = m ? py_str(*m) : "common";
  double x = num_as_double(v.j());
  double scale = std::pow(10.0, static_cast<double>(prec));
  double r;
  if (method == "common")
    r = std::nearbyint(x * scale) / scale;  // Python round(): half to even
  else if (method == "ceil")
    r = std::ceil(x * scale) / scale;
  else if (method == "floor")
    r = std::floor(x * scale) / scale;
  else
    ev.rt_fail(a.line, "method must be common, ceil or floor");
  if (v.is_int() && method == "common") return Value::of(num_as_int(Json(r)));
  return Value::of(r);
}

Value f_escape(Evaluator&, const Value& v, CallValues&) {
  std::string s = py_str(v), out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::of(std::move(out));
}

Value f_attr(Evaluator& ev, const Value& v, CallValues& a) {
  if (a.pos.empty()) ev.rt_fail(a.line, "attr expects a name");
  return ev.get_attr(v, py_str(a.pos[0]), a.line);
}

// jinja2 do_format: str(value) % (kwargs or args).
Value f_format(Evaluator& ev, const Value& v, CallValues& a) {
  if (!a.pos.empty() && !a.kw.empty()) ev.rt_fail(a.line, "can't handle positional and keyword arguments at the same time");
  std::string fmt = py_str(v);
  if (!a.kw.empty()) {
    Json m = Json::object();
    for (auto& [k, x] : a.kw) m[k] = ev.to_json(x, a.line);
    Value mv = Value::of(std::move(m));
    return Value::of(py_percent_format(ev, fmt, {mv}, &mv, a.line));
  }
  return Value::of(py_percent_format(ev, fmt, a.pos, nullptr, a.line));
}

Value f_wordcount(Evaluator&, const Value& v, CallValues&) {
  return Value::of(static_cast<int64_t>(py_split_whitespace(py_str(v), -1).size()));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> m = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"capitalize", f_capitalize},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"format", f_format},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_str},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return m;
}

// ============================================================================================ tests

bool t_defined(Evaluator&, const Value& v, CallValues&) { return !v.is_undefined(); }
bool t_undefined(Evaluator&, const Value& v, CallValues&) { return v.is_undefined(); }
bool t_none(Evaluator&, const Value& v, CallValues&) { return v.is_none(); }
bool t_boolean(Evaluator&, const Value& v, CallValues&) { return v.is_bool(); }
bool t_true(Evaluator&, const Value& v, CallValues&) { return v.is_bool() && v.j().get<bool>(); }
bool t_false(Evaluator&, const Value& v, CallValues&) { return v.is_bool() && !v.j().get<bool>(); }
bool t_integer(Evaluator&, const Value& v, CallValues&) { return v.is_int(); }
bool t_float(Evaluator&, const Value& v, CallValues&) { return v.is_float(); }
bool t_number(Evaluator&, const Value& v, CallValues&) { return v.is_number(); }
bool t_string(Evaluator&, const Value& v, CallValues&) { return v.is_string(); }
bool t_mapping(Evaluator&, const Value& v, CallValues&) { return v.is_dict(); }
bool t_iterable(Evaluator&, const Value& v, CallValues&) {
  return v.is_undefined() || (v.is_data() && (v.j().is_string() || v.j().is_array() || v.j().is_object()));
}
bool t_sequence(Evaluator& ev, const Value& v, CallValues& a) { return t_iterable(ev, v, a); }
bool t_callable(Evaluator&, const Value& v, CallValues&) { return v.kind == Value::Kind::Callable; }
bool t_escaped(Evaluator&, const Value&, CallValues&) { return false; }

const Value& test_arg(Evaluator& ev, CallValues& a) {
  if (a.pos.empty()) {
    if (!a.kw.empty()) return a.kw[0].second;
    ev.rt_fail(a.line, "test expects an argument");
  }
  return a.pos[0];
}
bool t_eq(Evaluator& ev, const Value& v, CallValues& a) { return py_eq(v, test_arg(ev, a)); }
bool t_ne(Evaluator& ev, const Value& v, CallValues& a) { return !py_eq(v, test_arg(ev, a)); }
bool t_lt(Evaluator& ev, const Value& v, CallValues& a) { return ev.compare("<", v, test_arg(ev, a), a.line); }
bool t_le(Evaluator& ev, const Value& v, CallValues& a) { return ev.compare("<=", v, test_arg(ev, a), a.line); }
bool t_gt(Evaluator& ev, const Value& v, CallValues& a) { return ev.compare(">", v, test_arg(ev, a), a.line); }
bool t_ge(Evaluator& ev, const Value& v, CallValues& a) { return ev.compare(">=", v, test_arg(ev, a), a.line); }
bool t_in(Evaluator& ev, const Value& v, CallValues& a) { return ev.contains(test_arg(ev, a), v, a.line); }
bool t_sameas(Evaluator& ev, const Value& v, CallValues& a) {
  const Value& o = test_arg(ev, a);
  if (v.is_data() && o.is_data()) {
    if (v.data == o.data) return true;
    const Json& x = v.j();
    const Json& y = o.j();
    if (x.is_null() || x.is_boolean()) return x.type() == y.type() && x == y;
    return false;
  }
  return v.kind == o.kind && v.ns == o.ns && v.fn == o.fn && v.loop == o.loop;
}
// value % n == 0 with Python semantics (floats included).
bool py_mod_is_zero(Evaluator& ev, const Value& v, const Value& n, int line) {
  Value m = ev.binary("%", v, n, line);
  return !py_truthy(m);
}
bool t_odd(Evaluator& ev, const Value& v, CallValues& a) { return !py_mod_is_zero(ev, v, Value::of(int64_t{2}), a.line); }
bool t_even(Evaluator& ev, const Value& v, CallValues& a) { return py_mod_is_zero(ev, v, Value::of(int64_t{2}), a.line); }
bool t_divisibleby(Evaluator& ev, const Value& v, CallValues& a) { return py_mod_is_zero(ev, v, test_arg(ev, a), a.line); }
bool t_lower(Evaluator&, const Value& v, CallValues&) { return str_pred(py_str(v), 4); }
bool t_upper(Evaluator&, const Value& v, CallValues&) { return str_pred(py_str(v), 5); }
bool t_filter(Evaluator&, const Value& v, CallValues&) { return v.is_string() && filters().count(v.str()); }
bool t_test(Evaluator&, const Value& v, CallValues&) { return v.is_string() && tests().count(v.str()); }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> m = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},   {"divisibleby", t_divisibleby},
      {"eq", t_eq},           {"equalto", t_eq},        {"==", t_eq},             {"escaped", t_escaped},
      {"even", t_even},       {"false", t_false},       {"filter", t_filter},     {"float", t_float},
      {"ge", t_ge},           {">=", t_ge},             {"gt", t_gt},             {">", t_gt},
      {"greaterthan", t_gt},  {"in", t_in},             {"integer", t_integer},   {"iterable", t_iterable},
      {"le", t_le},           {"<=", t_le},             {"lower", t_lower},       {"lt", t_lt},
      {"<", t_lt},            {"lessthan", t_lt},       {"mapping", t_mapping},   {"ne", t_ne},
      {"!=", t_ne},           {"none", t_none},         {"number", t_number},     {"odd", t_odd},
      {"sameas", t_sameas},   {"sequence", t_sequence}, {"string", t_string},     {"test", t_test},
      {"true", t_true},       {"undefined", t_undefined}, {"upper", t_upper},
  };
  return m;
}

}  // namespace

// ============================================================================================ Template

Template Template::parse(std::string source, std::string name, Options opts) {
  auto prog = std::make_shared<Program>();
  prog->name = std::move(name);
  prog->opts = opts;
  std::vector<Token> toks = lex(source, prog->name, prog->opts);
  prog->body = parse_program(toks, prog->name);
  Template t;
  t.prog_ = std::move(prog);
  return t;
}

std::string Template::render(const Json& context) const {
  M3_CHECK(prog_ != nullptr, "render() on an empty template");
  M3_CHECK(context.is_object(), "{}: template context must be a JSON object", prog_->name);
  Evaluator ev(*prog_, context);
  if (!prog_->opts.wrap_internal_errors) return ev.run();
  try {
    return ev.run();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail("{}: out of memory while rendering", prog_->name);
  } catch (const std::exception& e) {
    // Safety net: a library exception escaping the evaluator is a renderer bug; surface it as an
    // m3::Error so a request fails instead of the server (the fuzz target aborts on this text).
    fail("{}: internal template error: {}", prog_->name, e.what());
  }
}

const std::string& Template::name() const {
  static const std::string empty;
  return prog_ ? prog_->name : empty;
}

}  // namespace m3::jinja
