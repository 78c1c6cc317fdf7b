// Python str, dict and list methods of the Jinja evaluator ("a,b".split(","), d.items(), ...) and Python
// %-formatting ("%-5s" % x), with jinja2's sandbox rules for unsafe attributes.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include <utf8proc.h>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

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

// ============================================================================================ %-formatting

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

}  // namespace m3::jinja
