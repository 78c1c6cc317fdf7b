// Python value semantics for the Jinja renderer: str()/repr(), truthiness, ==/<, float repr,
// json.dumps (as transformers' tojson calls it) and code-point string helpers.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <utf8proc.h>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {

// ------------------------------------------------------------------------------------------ UTF-8

uint32_t utf8_decode_at(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + len > s.size()) len = 1;
  uint32_t cp;
  if (len == 1) {
    cp = c;  // ASCII or an invalid byte: treat the byte as one unit
  } else {
    cp = c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) {
        len = 1;
        cp = c;
        break;
      }
      cp = (cp << 6) | (d & 0x3F);
    }
  }
  i += len;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> r;
  r.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t st = i;
    utf8_decode_at(s, i);
    r.push_back(s.substr(st, i - st));
  }
  return r;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    utf8_decode_at(s, i);
    ++n;
  }
  return n;
}

// str.isspace(): Unicode White_Space plus the ASCII separators \x1c-\x1f.
bool py_isspace_cp(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars) {
  std::vector<uint32_t> set;
  if (chars) {
    size_t i = 0;
    while (i < chars->size()) set.push_back(utf8_decode_at(*chars, i));
  }
  auto strip_it = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : py_isspace_cp(cp);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t j = b;
      if (!strip_it(utf8_decode_at(s, j))) break;
      b = j;
    }
  }
  if (right) {
    // Walk forward to find the end of the last kept char.
    size_t i = b, last = b;
    while (i < e) {
      size_t j = i;
      if (!strip_it(utf8_decode_at(s, j))) last = j;
      i = j;
    }
    e = last;
  }
  return std::string(s.substr(b, e - b));
}

static std::string map_case(std::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = utf8_decode_at(s, i);
    if (cp < 0x80) {
      out += static_cast<char>(upper ? std::toupper(static_cast<int>(cp)) : std::tolower(static_cast<int>(cp)));
    } else if (upper && cp == 0xDF) {
      out += "SS";  // Python's full case mapping for sharp s
    } else {
      utf8_append(out, static_cast<uint32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))
                                                   : utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    }
  }
  return out;
}
std::string py_upper(std::string_view s) { return map_case(s, true); }
std::string py_lower(std::string_view s) { return map_case(s, false); }

std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    size_t j = i;
    while (j < n) {  // skip whitespace
      size_t k = j;
      if (!py_isspace_cp(utf8_decode_at(s, k))) break;
      j = k;
    }
    if (j >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      // The remainder, with trailing whitespace stripped.
      out.push_back(py_strip(s.substr(j), false, true, nullptr));
      return out;
    }
    size_t st = j;
    while (j < n) {
      size_t k = j;
      if (py_isspace_cp(utf8_decode_at(s, k))) break;
      j = k;
    }
    out.emplace_back(s.substr(st, j - st));
    i = j;
  }
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0, st = 0;
  const size_t n = s.size();
  while (i < n) {
    size_t j = i;
    uint32_t cp = utf8_decode_at(s, j);
    bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
               cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (brk) {
      out.emplace_back(s.substr(st, i - st));
      if (cp == '\r' && j < n && s[j] == '\n') ++j;
      st = j;
    }
    i = j;
  }
  if (st < n) out.emplace_back(s.substr(st));
  return out;
}

// ------------------------------------------------------------------------------------------ numbers

double num_as_double(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  if (j.is_number_unsigned()) return static_cast<double>(j.get<uint64_t>());
  if (j.is_number_integer()) return static_cast<double>(j.get<int64_t>());
  return j.get<double>();
}

int64_t num_as_int(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned()) return static_cast<int64_t>(j.get<uint64_t>());
  if (j.is_number_integer()) return j.get<int64_t>();
  // Saturating float -> int (a plain cast of an out-of-range double is undefined behaviour).
  double d = j.get<double>();
  if (std::isnan(d)) return 0;
  if (d >= 9.2233720368547758e18) return INT64_MAX;
  if (d <= -9.2233720368547758e18) return INT64_MIN;
  return static_cast<int64_t>(d);
}

// repr(float): shortest round-trip digits; fixed notation for 1e-4 <= |x| < 1e16, else scientific.
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -5 && exp < 16) {
    // Python switches to exponent form when exp < -4 (repr uses 'r' mode: -4 <= exp < 16).
    if (exp < -4) goto sci_form;
    if (exp >= 0) {
      if (static_cast<int>(digits.size()) <= exp + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
    return out;
  }
sci_form:
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exp < 0 ? "e-" : "e+";
  int ae = exp < 0 ? -exp : exp;
  if (ae < 10) out += "0";
  out += std::to_string(ae);
  return out;
}

// ------------------------------------------------------------------------------------------ repr/str

static std::string py_repr_string(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos;
  bool has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  size_t i = 0;
  while (i < s.size()) {
    size_t st = i;
    uint32_t cp = utf8_decode_at(s, i);
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp >= 0x80 && cp < 0xA0) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp == 0xAD || cp == 0x2028 || cp == 0x2029 || (cp >= 0x200B && cp <= 0x200F) ||
               (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) || cp == 0xFEFF) {
      // Not printable in Python: format characters and line/paragraph separators.
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s, st, i - st);
    }
  }
  out += q;
  return out;
}

std::string py_repr_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float: return py_float_repr(j.get<double>());
    case Json::value_t::string: return py_repr_string(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      bool first = true;
      for (const auto& e : j) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_json(e);
      }
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(it.key()) + ": " + py_repr_json(it.value());
      }
      return out + "}";
    }
    default: return "<binary>";
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::Data:
      if (v.data->is_string()) return v.str();
      if (v.shape != 0 && v.data->is_array()) {
        auto tuple_repr = [](const Json& t) {
          if (!t.is_array()) return py_repr_json(t);
          std::string out = "(";
          for (size_t i = 0; i < t.size(); ++i) out += (i ? ", " : "") + py_repr_json(t[i]);
          return out + (t.size() == 1 ? ",)" : ")");
        };
        if (v.shape == 1) return tuple_repr(*v.data);
        std::string out = "[";
        for (size_t i = 0; i < v.data->size(); ++i) out += (i ? ", " : "") + tuple_repr((*v.data)[i]);
        return out + "]";
      }
      return py_repr_json(*v.data);
    case Value::Kind::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (auto& [k, x] : v.ns->attrs) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(k) + ": " + (x.is_data() ? py_repr_json(x.j()) : py_str(x));
      }
      return out + "}>";
    }
    case Value::Kind::Callable: return "<function " + v.fn->name + ">";
    case Value::Kind::Loop: return "<LoopContext>";
  }
  return "";
}

bool py_truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::Data: {
      const Json& j = *v.data;
      switch (j.type()) {
        case Json::value_t::null: return false;
        case Json::value_t::boolean: return j.get<bool>();
        case Json::value_t::number_integer: return j.get<int64_t>() != 0;
        case Json::value_t::number_unsigned: return j.get<uint64_t>() != 0;
        case Json::value_t::number_float: return j.get<double>() != 0.0;
        case Json::value_t::string: return !j.get_ref<const std::string&>().empty();
        case Json::value_t::array:
        case Json::value_t::object: return !j.empty();
        default: return true;
      }
    }
    default: return true;
  }
}

static bool is_num(const Json& j) { return j.is_number() || j.is_boolean(); }

bool py_eq_json(const Json& a, const Json& b) {
  if (is_num(a) && is_num(b)) {
    if (a.is_number_float() || b.is_number_float()) return num_as_double(a) == num_as_double(b);
    return num_as_int(a) == num_as_int(b);
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Json::value_t::null: return true;
    case Json::value_t::string: return a.get_ref<const std::string&>() == b.get_ref<const std::string&>();
    case Json::value_t::array: {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!py_eq_json(a[i], b[i])) return false;
      return true;
    }
    case Json::value_t::object: {
      if (a.size() != b.size()) return false;
      for (auto it = a.begin(); it != a.end(); ++it) {
        auto f = b.find(it.key());
        if (f == b.end() || !py_eq_json(it.value(), *f)) return false;
      }
      return true;
    }
    default: return a == b;
  }
}

bool py_eq(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_data() && b.is_data()) {
    if ((a.shape == 1) != (b.shape == 1) && a.j().is_array() && b.j().is_array()) return false;  // (1,) != [1]
    return py_eq_json(a.j(), b.j());
  }
  if (a.kind != b.kind) return false;
  return a.ns == b.ns && a.fn == b.fn && a.loop == b.loop;
}

bool py_less_json(const Json& a, const Json& b, bool& ok) {
  ok = true;
  if (is_num(a) && is_num(b)) {
    if (a.is_number_float() || b.is_number_float()) return num_as_double(a) < num_as_double(b);
    return num_as_int(a) < num_as_int(b);
  }
  if (a.is_string() && b.is_string())
    return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();  // UTF-8 order == code point order
  if (a.is_array() && b.is_array()) {
    size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
      if (py_eq_json(a[i], b[i])) continue;
      return py_less_json(a[i], b[i], ok);
    }
    return a.size() < b.size();
  }
  ok = false;
  return false;
}

// ------------------------------------------------------------------------------------------ json.dumps

static void dump_string(std::string& out, const std::string& s, bool ensure_ascii = false) {
  out += '"';
  if (ensure_ascii) {
    // json.dumps(ensure_ascii=True): non-ASCII as \uXXXX (UTF-16 surrogate pairs above the BMP).
    size_t i = 0;
    while (i < s.size()) {
      size_t st = i;
      uint32_t cp = utf8_decode_at(s, i);
      if (cp < 0x80) {
        std::string one;
        dump_string(one, s.substr(st, i - st));
        out.append(one, 1, one.size() - 2);
      } else if (cp < 0x10000) {
        out += fmt::format("\\u{:04x}", cp);
      } else {
        uint32_t v = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      }
    }
    out += '"';
    return;
  }
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  out += '"';
}

static void dump_rec(std::string& out, const Json& j, const DumpOpts& o, int level) {
  switch (j.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_integer: out += std::to_string(j.get<int64_t>()); return;
    case Json::value_t::number_unsigned: out += std::to_string(j.get<uint64_t>()); return;
    case Json::value_t::number_float: {
      double d = j.get<double>();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(d);
      return;
    }
    case Json::value_t::string: dump_string(out, j.get_ref<const std::string&>(), o.ensure_ascii); return;
    case Json::value_t::array:
    case Json::value_t::object: {
      bool is_obj = j.is_object();
      if (j.empty()) {
        out += is_obj ? "{}" : "[]";
        return;
      }
      out += is_obj ? '{' : '[';
      std::string nl;
      if (o.has_indent) {
        nl = "\n";
        for (int i = 0; i <= level; ++i) nl += o.indent;
      }
      std::vector<std::pair<const std::string*, const Json*>> kv;
      if (is_obj) {
        for (auto it = j.begin(); it != j.end(); ++it) kv.emplace_back(&it.key(), &it.value());
        if (o.sort_keys)
          std::stable_sort(kv.begin(), kv.end(), [](auto& x, auto& y) { return *x.first < *y.first; });
      }
      size_t n = j.size();
      for (size_t i = 0; i < n; ++i) {
        if (i) out += o.item_sep;
        out += nl;
        if (is_obj) {
          dump_string(out, *kv[i].first, o.ensure_ascii);
          out += o.key_sep;
          dump_rec(out, *kv[i].second, o, level + 1);
        } else {
          dump_rec(out, j[i], o, level + 1);
        }
      }
      if (o.has_indent) {
        out += "\n";
        for (int i = 0; i < level; ++i) out += o.indent;
      }
      out += is_obj ? '}' : ']';
      return;
    }
    default: out += "null"; return;
  }
}

std::string py_json_dumps(const Json& j, const DumpOpts& o) {
  std::string out;
  dump_rec(out, j, o, 0);
  return out;
}

}  // namespace m3::jinja
