// Jinja lexer. Mirrors jinja2's lexer rules (jinja2/lexer.py) for the default delimiters:
//  - newlines normalised to "\n", one trailing newline dropped unless keep_trailing_newline;
//  - "{%-"/"{{-"/"{#-" strip all whitespace before the tag, "-%}"/"-}}"/"-#}" all whitespace after;
//  - trim_blocks drops one "\n" after "%}"/"#}" (not after "}}"), "+%}" disables that;
//  - lstrip_blocks strips spaces before "{%"/"{#" when only whitespace precedes them on the line,
//    "{%+" disables that; it never applies to "{{".
// Whitespace control must match jinja2 exactly: chat templates are full of it and a single stray
// newline changes the token ids the model sees.
#include <algorithm>
#include <cstring>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {
namespace {

bool is_ws_at(const std::string& s, size_t i, size_t* len) {
  size_t j = i;
  uint32_t cp = utf8_decode_at(s, j);
  if (py_isspace_cp(cp)) {
    *len = j - i;
    return true;
  }
  return false;
}

// Skips Python-regex `\s*` from i.
size_t skip_ws(const std::string& s, size_t i) {
  size_t len = 0;
  while (i < s.size() && is_ws_at(s, i, &len)) i += len;
  return i;
}

bool all_ws(const std::string& s, size_t from, size_t to) {
  size_t len = 0;
  while (from < to) {
    if (!is_ws_at(s, from, &len)) return false;
    from += len;
  }
  return true;
}

// rstrip() with Python's whitespace definition.
size_t rstrip_end(const std::string& s, size_t from, size_t to) {
  // Walk forward remembering the end of the last non-space char (UTF-8 safe).
  size_t last = from, i = from;
  while (i < to) {
    size_t j = i;
    uint32_t cp = utf8_decode_at(s, j);
    if (!py_isspace_cp(cp)) last = j;
    i = j;
  }
  return last;
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name, const Options& o) : name_(name), opts_(o) {
    // Normalise \r\n and \r to \n (jinja2 3.x treats only these as line breaks).
    s_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        s_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        s_ += src[i];
      }
    }
    if (!opts_.keep_trailing_newline && !s_.empty() && s_.back() == '\n') s_.pop_back();
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') nl_.push_back(i);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = s_.size();
    while (pos < n) {
      size_t q = pos;
      while (true) {
        q = s_.find('{', q);
        if (q == std::string::npos || q + 1 >= n) {
          q = std::string::npos;
          break;
        }
        char c = s_[q + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++q;
      }
      if (q == std::string::npos) {
        emit_data(pos, n);
        break;
      }
      char kind = s_[q + 1];
      char sign = (q + 2 < n && (s_[q + 2] == '-' || s_[q + 2] == '+')) ? s_[q + 2] : 0;
      size_t after = q + 2 + (sign ? 1 : 0);

      // {% raw %}: its own rule, tried before the plain block rule.
      size_t raw_body = 0;
      bool is_raw = kind == '%' && match_raw_begin(after, &raw_body);

      size_t text_end = q;
      if (sign == '-') {
        text_end = rstrip_end(s_, pos, q);
      } else if (sign != '+' && opts_.lstrip_blocks && kind != '{') {
        size_t nlp = q == pos ? std::string::npos : s_.rfind('\n', q - 1);
        size_t l_pos = (nlp == std::string::npos || nlp < pos) ? pos : nlp + 1;
        bool has_nl = l_pos > pos;
        if ((has_nl || line_starting) && all_ws(s_, l_pos, q)) text_end = l_pos;
      }
      emit_data(pos, text_end);

      if (is_raw) {
        pos = lex_raw(raw_body, &line_starting);
        continue;
      }
      if (kind == '#') {
        pos = lex_comment(after, q, &line_starting);
        continue;
      }
      Token b;
      b.type = kind == '{' ? Tok::VarBegin : Tok::BlockBegin;
      set_pos(b, q);
      out_.push_back(b);
      pos = lex_tag(after, kind, q, &line_starting);
    }
    Token e;
    e.type = Tok::Eof;
    set_pos(e, n);
    out_.push_back(e);
    return std::move(out_);
  }

 private:
  [[noreturn]] void error_at(size_t p, const std::string& msg) {
    int line, col;
    line_col(p, line, col);
    fail("{}:{}:{}: {}", name_, line, col, msg);
  }

  void line_col(size_t p, int& line, int& col) const {
    auto it = std::lower_bound(nl_.begin(), nl_.end(), p);
    line = static_cast<int>(it - nl_.begin()) + 1;
    size_t line_start = it == nl_.begin() ? 0 : *(it - 1) + 1;
    col = static_cast<int>(p - line_start) + 1;
  }

  void set_pos(Token& t, size_t p) const { line_col(p, t.line, t.col); }

  void emit_data(size_t from, size_t to) {
    if (to <= from) return;
    Token t;
    t.type = Tok::Data;
    t.text = s_.substr(from, to - from);
    set_pos(t, from);
    out_.push_back(std::move(t));
  }

  bool starts(size_t p, const char* lit) const {
    size_t l = std::strlen(lit);
    return p + l <= s_.size() && s_.compare(p, l, lit) == 0;
  }

  bool match_raw_begin(size_t p, size_t* body) {
    p = skip_ws(s_, p);
    if (!starts(p, "raw")) return false;
    p += 3;
    // "raw" must be a whole word: jinja's regex requires \s* then the block end.
    p = skip_ws(s_, p);
    if (starts(p, "-%}")) {
      *body = skip_ws(s_, p + 3);
      return true;
    }
    if (starts(p, "%}")) {
      *body = p + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t body, bool* line_starting) {
    size_t p = body;
    while (true) {
      size_t q = s_.find("{%", p);
      if (q == std::string::npos) error_at(body, "Missing end of raw directive");
      size_t r = q + 2;
      char sign = 0;
      if (r < s_.size() && (s_[r] == '-' || s_[r] == '+')) sign = s_[r++];
      r = skip_ws(s_, r);
      if (!starts(r, "endraw")) {
        p = q + 2;
        continue;
      }
      r = skip_ws(s_, r + 6);
      size_t end;
      if (starts(r, "+%}")) {
        end = r + 3;
      } else if (starts(r, "-%}")) {
        end = skip_ws(s_, r + 3);
      } else if (starts(r, "%}")) {
        end = r + 2;
        if (opts_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
      } else {
        p = q + 2;
        continue;
      }
      size_t text_end = q;
      if (sign == '-') {
        text_end = rstrip_end(s_, body, q);
      } else if (sign != '+' && opts_.lstrip_blocks) {
        size_t nlp = q == body ? std::string::npos : s_.rfind('\n', q - 1);
        size_t l_pos = (nlp == std::string::npos || nlp < body) ? body : nlp + 1;
        if (l_pos > body && all_ws(s_, l_pos, q)) text_end = l_pos;
      }
      emit_data(body, text_end);
      *line_starting = end > 0 && s_[end - 1] == '\n';
      return end;
    }
  }

  size_t lex_comment(size_t p, size_t start, bool* line_starting) {
    size_t e = s_.find("#}", p);
    if (e == std::string::npos) error_at(start, "Missing end of comment tag");
    size_t end;
    if (e > p && s_[e - 1] == '+') {
      end = e + 2;
    } else if (e > p && s_[e - 1] == '-') {
      end = skip_ws(s_, e + 2);
    } else {
      end = e + 2;
      if (opts_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
    }
    *line_starting = s_[end - 1] == '\n';
    return end;
  }

  // Lexes the inside of {{ }} or {% %} starting at p; returns the position after the end tag.
  size_t lex_tag(size_t p, char kind, size_t start, bool* line_starting) {
    std::vector<char> balance;
    const size_t n = s_.size();
    while (true) {
      if (p >= n) error_at(start, kind == '{' ? "unexpected end of template, expected '}}'"
                                              : "unexpected end of template, expected '%}'");
      if (balance.empty()) {
        size_t end = 0;
        bool ended = false;
        if (kind == '{') {
          if (starts(p, "-}}")) {
            end = skip_ws(s_, p + 3);
            ended = true;
          } else if (starts(p, "}}")) {
            end = p + 2;
            ended = true;
          }
        } else {
          if (starts(p, "+%}")) {
            end = p + 3;
            ended = true;
          } else if (starts(p, "-%}")) {
            end = skip_ws(s_, p + 3);
            ended = true;
          } else if (starts(p, "%}")) {
            end = p + 2;
            if (opts_.trim_blocks && end < n && s_[end] == '\n') ++end;
            ended = true;
          }
        }
        if (ended) {
          Token t;
          t.type = kind == '{' ? Tok::VarEnd : Tok::BlockEnd;
          set_pos(t, p);
          out_.push_back(t);
          *line_starting = s_[end - 1] == '\n';
          return end;
        }
      }
      size_t wl = 0;
      if (is_ws_at(s_, p, &wl)) {
        p += wl;
        continue;
      }
      unsigned char c = static_cast<unsigned char>(s_[p]);
      Token t;
      set_pos(t, p);
      if (std::isdigit(c)) {
        p = lex_number(p, t);
      } else if (std::isalpha(c) || c == '_' || c >= 0x80) {
        size_t q = p;
        while (q < n) {
          unsigned char d = static_cast<unsigned char>(s_[q]);
          if (std::isalnum(d) || d == '_' || d >= 0x80)
            ++q;
          else
            break;
        }
        t.type = Tok::Name;
        t.text = s_.substr(p, q - p);
        p = q;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, t);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~",
                                    "[",  "]",  "(",  ")",  "{",  "}",  ">", "<", "=", ".", ":", "|",
                                    ",",  ";"};
        const char* found = nullptr;
        for (const char* op : ops)
          if (starts(p, op)) {
            found = op;
            break;
          }
        if (!found) error_at(p, fmt::format("unexpected char '{}'", s_[p]));
        t.type = Tok::Op;
        t.text = found;
        p += std::strlen(found);
        char ch = found[0];
        if (t.text.size() == 1 && (ch == '(' || ch == '[' || ch == '{')) {
          balance.push_back(ch == '(' ? ')' : ch == '[' ? ']' : '}');
        } else if (t.text.size() == 1 && (ch == ')' || ch == ']' || ch == '}')) {
          if (balance.empty()) error_at(p - 1, fmt::format("unexpected '{}'", ch));
          if (balance.back() != ch)
            error_at(p - 1, fmt::format("unexpected '{}', expected '{}'", ch, balance.back()));
          balance.pop_back();
        }
      }
      out_.push_back(std::move(t));
    }
  }

  size_t lex_number(size_t p, Token& t) {
    const size_t n = s_.size();
    auto digits = [&](size_t q) {  // (\d+_)*\d+
      size_t st = q;
      while (q < n && (std::isdigit(static_cast<unsigned char>(s_[q])) ||
                       (s_[q] == '_' && q > st && q + 1 < n && std::isdigit(static_cast<unsigned char>(s_[q + 1])))))
        ++q;
      return q;
    };
    bool after_dot = !out_.empty() && out_.back().type == Tok::Op && out_.back().text == ".";
    // Float: digits ( (.digits)? e[+-]?digits | .digits )
    if (!after_dot) {
      size_t q = digits(p);
      size_t r = q;
      bool is_float = false;
      if (r < n && s_[r] == '.' && r + 1 < n && std::isdigit(static_cast<unsigned char>(s_[r + 1]))) {
        r = digits(r + 1);
        is_float = true;
      }
      if (r < n && (s_[r] == 'e' || s_[r] == 'E')) {
        size_t e = r + 1;
        if (e < n && (s_[e] == '+' || s_[e] == '-')) ++e;
        if (e < n && std::isdigit(static_cast<unsigned char>(s_[e]))) {
          r = digits(e);
          is_float = true;
        }
      }
      if (is_float) {
        std::string txt;
        for (size_t i = p; i < r; ++i)
          if (s_[i] != '_') txt += s_[i];
        t.type = Tok::Float;
        t.fval = std::strtod(txt.c_str(), nullptr);
        t.text = txt;
        return r;
      }
    }
    // Integer (0b / 0o / 0x / decimal).
    int base = 10;
    size_t q = p;
    if (s_[p] == '0' && p + 1 < n && std::strchr("bBoOxX", s_[p + 1]) && s_[p + 1] != 0) {
      char b = static_cast<char>(std::tolower(s_[p + 1]));
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      q = p + 2;
    }
    std::string txt;
    while (q < n) {
      char ch = s_[q];
      if (ch == '_') {
        ++q;
        continue;
      }
      int v = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
              : (base == 16 && std::isxdigit(static_cast<unsigned char>(ch))) ? 10 + (std::tolower(ch) - 'a')
                                                                               : 99;
      if (v >= base) break;
      txt += ch;
      ++q;
    }
    if (txt.empty()) error_at(p, "invalid integer literal");
    errno = 0;
    long long v = std::strtoll(txt.c_str(), nullptr, base);
    if (errno == ERANGE) error_at(p, "integer literal out of range");
    t.type = Tok::Int;
    t.ival = v;
    t.text = s_.substr(p, q - p);
    return q;
  }

  size_t lex_string(size_t p, Token& t) {
    const char quote = s_[p];
    const size_t n = s_.size();
    std::string v;
    size_t q = p + 1;
    while (true) {
      if (q >= n) error_at(p, "unexpected end of string");
      char c = s_[q];
      if (c == quote) {
        ++q;
        break;
      }
      if (c != '\\') {
        v += c;
        ++q;
        continue;
      }
      if (q + 1 >= n) error_at(p, "unexpected end of string");
      char e = s_[q + 1];
      q += 2;
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'n': v += '\n'; break;
        case 'r': v += '\r'; break;
        case 't': v += '\t'; break;
        case 'v': v += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (q + len > n) error_at(q - 2, "truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = 0;
          for (int i = 0; i < len; ++i) {
            char h = s_[q + i];
            if (!std::isxdigit(static_cast<unsigned char>(h)))
              error_at(q - 2, "truncated \\" + std::string(1, e) + " escape");
            cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
          }
          if (cp > 0x10FFFF) error_at(q - 2, "illegal Unicode character");
          utf8_append(v, cp);
          q += len;
          break;
        }
        case 'N': error_at(q - 2, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int i = 0; i < 2 && q < n && s_[q] >= '0' && s_[q] <= '7'; ++i) cp = cp * 8 + (s_[q++] - '0');
            utf8_append(v, cp);
          } else {
            v += '\\';
            v += e;
          }
      }
    }
    t.type = Tok::String;
    t.text = std::move(v);
    return q;
  }

  std::string s_;
  const std::string& name_;
  const Options& opts_;
  std::vector<size_t> nl_;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name, const Options& opts) {
  Lexer l(source, name, opts);
  return l.run();
}

}  // namespace m3::jinja
