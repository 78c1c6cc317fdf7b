// Jinja evaluator: executes the AST over JSON data with jinja2's runtime semantics (scoping, default Undefined,
// sandboxed attribute lookup, operators, macros, loops). Python str/dict/list methods and %-formatting live in
// jinja_methods.cpp, filters and tests in jinja_filters.cpp; all three share the declarations of jinja_internal.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {

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

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

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

// ============================================================================================ operators

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
