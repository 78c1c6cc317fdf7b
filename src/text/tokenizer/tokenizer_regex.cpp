// PCRE2 (JIT) regex with the matching semantics of Oniguruma, which HF tokenizers uses for Split patterns.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstring>
#include <utility>

#include "base/error.h"
#include "text/tokenizer/tokenizer_impl.h"

namespace m3::tok {

namespace {

#include "text/tokenizer/tokenizer_unicode_delta.inc"

// Class items that bring PCRE2's \p{name} up to the Unicode version of HF's Oniguruma ("" if none).
const char* unicode_delta(std::string_view name) {
  for (auto& [cat, items] : kUnicodeDelta)
    if (name == cat) return items;
  return "";
}

// Oniguruma's \s in Unicode mode is the White_Space property; PCRE2 (UCP) misses U+0085 there.
constexpr const char* kWhiteSpaceClassBody =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceClassBody;
        } else {
          out += '[';
          out += kWhiteSpaceClassBody;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceClassBody;
        out += ']';
      } else if ((e == 'p' || e == 'P') && i + 2 < p.size()) {
        // \p{X} / \pX: add the code points newer Unicode assigns to X (negated forms only outside classes).
        size_t name_start = i + 2, name_end = i + 3;
        if (p[i + 2] == '{') {
          size_t close = p.find('}', i + 3);
          if (close == std::string::npos) fail("tokenizer: bad \\p in regex {:?}", p);
          name_start = i + 3;
          name_end = close;
        }
        std::string name = p.substr(name_start, name_end - name_start);
        std::string item = p.substr(i, (p[i + 2] == '{' ? name_end + 1 : name_end) - i);
        const char* delta = unicode_delta(name);
        if (!*delta || (e == 'P' && in_class)) {
          out += item;
        } else if (in_class) {
          out += item;
          out += delta;
        } else {
          out += e == 'p' ? "[" : "[^";
          out += "\\p{" + name + "}";
          out += delta;
          out += ']';
        }
        i = (p[i + 2] == '{' ? name_end : name_end - 1);
        continue;
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:name:] inside a bracket: copy through to the closing ":]".
      size_t close = p.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread JIT stack and match data, shared by all patterns (JIT matching is not reentrant per stack).
struct ThreadMatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    // Long whitespace runs make `\s+(?!\S)` backtrack deeply; allow the JIT stack to grow to 64 MiB.
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState st;
  return st;
}

}  // namespace

Regex::Regex(const std::string& pattern, bool onig_compat) : pattern_(pattern) {
  std::string p = onig_compat ? onig_to_pcre2(pattern) : pattern;
  int err = 0;
  PCRE2_SIZE off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                             &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("tokenizer: cannot compile regex {:?} at offset {}: {}", pattern, size_t(off), reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

size_t Regex::utf8_char_len(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  return std::min(n, s.size() - i);
}

bool Regex::match(std::string_view s, size_t start, size_t& m_start, size_t& m_end) const {
  auto& st = thread_state();
  auto* code = static_cast<pcre2_code*>(code_);
  // Subjects are validated UTF-8 by the caller.
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, PCRE2_NO_UTF_CHECK, st.md,
                       st.mctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    fail("tokenizer: regex {:?} failed on a {}-byte input: {}", pattern_, s.size(), reinterpret_cast<char*>(msg));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  m_start = ov[0];
  m_end = ov[1];
  return true;
}

}  // namespace m3::tok
