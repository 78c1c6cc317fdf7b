// Jinja filters ({{ x | tojson }}) and tests ({% if x is defined %}) with jinja2's semantics; the evaluator
// looks them up by name through filters() / tests().
#include <algorithm>
#include <chrono>
#include <cmath>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace m3::jinja
