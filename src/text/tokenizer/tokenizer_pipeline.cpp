// Normalizers and pre-tokenizers of tokenizer.json (HF tokenizers v0.22 semantics, without offsets).
#include <algorithm>

#include <utf8proc.h>

#include "base/error.h"
#include "text/tokenizer/tokenizer_impl.h"

namespace m3::tok {

namespace {

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) fail("tokenizer: component without a \"type\": {}", j.dump().substr(0, 200));
  return j["type"].get<std::string>();
}

// ------------------------------------------------------------- normalizers

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(utf8proc_option_t opts) : opts_(opts) {}
  void apply(std::string& s) const override {
    // Normalization never reorders or composes across an ASCII character (ASCII is never the second
    // half of a composition and has canonical class 0), so only the stretches between ASCII runs,
    // each with its preceding ASCII character, go through utf8proc.
    size_t first = 0;
    while (first < s.size() && static_cast<unsigned char>(s[first]) < 0x80) ++first;
    if (first == s.size()) return;
    std::string out;
    out.reserve(s.size() + 16);
    size_t i = first ? first - 1 : 0;
    out.append(s, 0, i);
    while (i < s.size()) {
      // Region: one optional ASCII lead + the following non-ASCII bytes.
      size_t j = i;
      if (static_cast<unsigned char>(s[j]) < 0x80) ++j;
      while (j < s.size() && static_cast<unsigned char>(s[j]) >= 0x80) ++j;
      utf8proc_uint8_t* res = nullptr;
      auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i), utf8proc_ssize_t(j - i), &res,
                            utf8proc_option_t(opts_ | UTF8PROC_STABLE));
      if (n < 0) fail("tokenizer: unicode normalization failed: {}", utf8proc_errmsg(n));
      out.append(reinterpret_cast<char*>(res), size_t(n));
      std::free(res);
      // Copy the ASCII run up to (not including) the last ASCII char before the next non-ASCII byte.
      size_t k = j;
      while (k < s.size() && static_cast<unsigned char>(s[k]) < 0x80) ++k;
      if (k == s.size()) {
        out.append(s, j, k - j);
        break;
      }
      size_t lead = k > j ? k - 1 : k;
      out.append(s, j, lead - j);
      i = lead;
    }
    s.swap(out);
  }
  bool is_local() const override { return true; }

 private:
  utf8proc_option_t opts_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  // Rust str::to_lowercase: full case mapping (U+0130 -> "i\u0307") and the final-sigma rule.
  void apply(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    bool prev_cased = false;  // last non-case-ignorable char was cased
    while (i < s.size()) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) {
        out += char(c >= 'A' && c <= 'Z' ? c + 32 : c);
        bool letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
        if (letter) prev_cased = true;
        else if (c != '\'' && c != '.' && c != ':' && c != '^' && c != '`') prev_cased = false;
        ++i;
        continue;
      }
      uint32_t cp = utf8_next(s, i);
      if (cp == 0x130) {
        out += "i\xCC\x87";
      } else if (cp == 0x3A3) {
        // Final sigma: preceded by a cased letter and not followed by one (case-ignorables skipped).
        size_t k = i;
        bool next_cased = false;
        while (k < s.size()) {
          uint32_t n = utf8_next(s, k);
          if (is_case_ignorable(n)) continue;
          next_cased = is_cased(n);
          break;
        }
        utf8_append(out, prev_cased && !next_cased ? 0x3C2 : 0x3C3);
      } else {
        utf8_append(out, uint32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
      }
      if (is_cased(cp)) prev_cased = true;
      else if (!is_case_ignorable(cp)) prev_cased = false;
    }
    s.swap(out);
  }
  bool is_local() const override { return false; }  // final sigma looks across characters

 private:
  static bool is_cased(uint32_t cp) {
    auto c = utf8proc_category(utf8proc_int32_t(cp));
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
  }
  static bool is_case_ignorable(uint32_t cp) {
    auto c = utf8proc_category(utf8proc_int32_t(cp));
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == 0x2019 || cp == 0xB7 ||
           cp == '.' || cp == ':';
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t k = b;
        if (!is_unicode_whitespace(utf8_next(s, k))) break;
        b = k;
      }
    }
    if (right_) {
      while (e > b) {
        size_t st = e - 1;
        while (st > b && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
        size_t k = st;
        if (!is_unicode_whitespace(utf8_next(s, k))) break;
        e = st;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : p_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> re, std::string literal, std::string content)
      : re_(std::move(re)), literal_(std::move(literal)), content_(std::move(content)) {}
  void apply(std::string& s) const override {
    std::string out;
    size_t prev = 0;
    auto on_match = [&](size_t a, size_t b) {
      out.append(s, prev, a - prev);
      out += content_;
      prev = b;
    };
    if (re_) {
      re_->find_iter(s, on_match);
    } else if (!literal_.empty()) {
      for (size_t p = s.find(literal_); p != std::string::npos; p = s.find(literal_, p + literal_.size()))
        on_match(p, p + literal_.size());
    }
    out.append(s, prev, std::string::npos);
    s.swap(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string literal_, content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  void apply(std::string& s) const override {
    for (auto& n : v_) n->apply(s);
  }
  bool is_local() const override {
    return std::all_of(v_.begin(), v_.end(), [](auto& n) { return n->is_local(); });
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

// Pattern {"String": s} or {"Regex": r}: a compiled regex, or the literal string.
void parse_pattern(const json& j, const char* who, std::unique_ptr<Regex>& re, std::string& literal) {
  if (!j.is_object()) fail("tokenizer: {} pattern must be an object", who);
  if (j.contains("Regex")) {
    re = std::make_unique<Regex>(j["Regex"].get<std::string>());
  } else if (j.contains("String")) {
    literal = j["String"].get<std::string>();
  } else {
    fail("tokenizer: {} pattern must be String or Regex", who);
  }
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j) {
  if (j.is_null()) return nullptr;
  std::string t = type_of(j);
  if (t == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE);
  if (t == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE);
  if (t == "NFKC") return std::make_unique<UnicodeNormalizer>(utf8proc_option_t(UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (t == "NFKD") return std::make_unique<UnicodeNormalizer>(utf8proc_option_t(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  if (t == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (t == "Strip") return std::make_unique<StripNormalizer>(j.value("strip_left", true), j.value("strip_right", true));
  if (t == "Prepend") return std::make_unique<PrependNormalizer>(j.at("prepend").get<std::string>());
  if (t == "Replace") {
    std::unique_ptr<Regex> re;
    std::string lit;
    parse_pattern(j.at("pattern"), "Replace normalizer", re, lit);
    return std::make_unique<ReplaceNormalizer>(std::move(re), lit, j.at("content").get<std::string>());
  }
  if (t == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> v;
    for (auto& n : j.at("normalizers"))
      if (auto p = make_normalizer(n)) v.push_back(std::move(p));
    if (v.empty()) return nullptr;  // identity (DeepSeek-V3 ships one); lets the prefix cache work
    return std::make_unique<SequenceNormalizer>(std::move(v));
  }
  fail("tokenizer: unsupported normalizer type \"{}\"", t);
}

// ------------------------------------------------------------- pre-tokenizers

namespace {

// Applies a split behaviour to a list of (start, end, is_match) spans covering s; appends non-empty pieces.
struct Span {
  size_t a, b;
  bool m;
};

void apply_behavior(std::string_view s, std::vector<Span>& spans, SplitBehavior beh,
                    std::vector<std::string_view>& out) {
  auto emit = [&](size_t a, size_t b) {
    if (b > a) out.push_back(s.substr(a, b - a));
  };
  switch (beh) {
    case SplitBehavior::Isolated:
      for (auto& sp : spans) emit(sp.a, sp.b);
      return;
    case SplitBehavior::Removed:
      for (auto& sp : spans)
        if (!sp.m) emit(sp.a, sp.b);
      return;
    case SplitBehavior::MergedWithPrevious: {
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev = false;
      for (auto& sp : spans) {
        if (sp.m && !prev && !acc.empty()) acc.back().second = sp.b;
        else acc.push_back({sp.a, sp.b});
        prev = sp.m;
      }
      for (auto& [a, b] : acc) emit(a, b);
      return;
    }
    case SplitBehavior::MergedWithNext: {
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->m && !prev && !acc.empty()) acc.back().first = it->a;
        else acc.push_back({it->a, it->b});
        prev = it->m;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->first, it->second);
      return;
    }
    case SplitBehavior::Contiguous: {
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev = false;
      for (auto& sp : spans) {
        if (sp.m == prev && !acc.empty()) acc.back().second = sp.b;
        else acc.push_back({sp.a, sp.b});
        prev = sp.m;
      }
      for (auto& [a, b] : acc) emit(a, b);
      return;
    }
  }
}

SplitBehavior parse_behavior(const std::string& b) {
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  fail("tokenizer: unsupported Split behavior \"{}\"", b);
}

// Splits with a per-character predicate: every matching char is its own match (HF `impl Pattern for Fn(char)`).
template <typename Pred>
void split_chars(std::string_view s, Pred pred, SplitBehavior beh, bool invert, std::vector<std::string_view>& out) {
  std::vector<Span> spans;
  size_t last = 0, i = 0;
  while (i < s.size()) {
    size_t st = i;
    uint32_t cp = utf8_next(s, i);
    if (pred(cp)) {
      if (last < st) spans.push_back({last, st, false});
      spans.push_back({st, i, true});
      last = i;
    }
  }
  if (last < s.size()) spans.push_back({last, s.size(), false});
  if (invert)
    for (auto& sp : spans) sp.m = !sp.m;
  apply_behavior(s, spans, beh, out);
}

bool is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  auto c = utf8proc_category(utf8proc_int32_t(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

class DigitsPre : public PreTokenizer {
 public:
  explicit DigitsPre(bool individual) : individual_(individual) {}
  void apply(const Words& in, Words& out, const char*) const override {
    for (auto w : in.views)
      split_chars(w, is_numeric, individual_ ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false, out.views);
  }
  const char* name() const override { return "Digits"; }

 private:
  bool individual_;
};

class WhitespaceSplitPre : public PreTokenizer {
 public:
  void apply(const Words& in, Words& out, const char*) const override {
    for (auto w : in.views) split_chars(w, is_unicode_whitespace, SplitBehavior::Removed, false, out.views);
  }
  const char* name() const override { return "WhitespaceSplit"; }
};

class WhitespacePre : public PreTokenizer {
 public:
  WhitespacePre() : split_(std::make_unique<Regex>("\\w+|[^\\w\\s]+"), "", SplitBehavior::Removed, true) {}
  void apply(const Words& in, Words& out, const char* start) const override { split_.apply(in, out, start); }
  const char* name() const override { return "Whitespace"; }

 private:
  RegexSplit split_;
};

class MetaspacePre : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, std::string scheme, bool split)
      : repl_(std::move(replacement)), scheme_(std::move(scheme)), split_(split) {}
  void apply(const Words& in, Words& out, const char* text_start) const override {
    for (auto w : in.views) {
      bool first_piece = text_start && w.data() == text_start;
      std::string s;
      s.reserve(w.size() + 8);
      for (char c : w) {
        if (c == ' ') s += repl_;
        else s += c;
      }
      bool starts = s.compare(0, repl_.size(), repl_) == 0;
      if (!starts && (scheme_ == "always" || (scheme_ == "first" && first_piece))) s.insert(0, repl_);
      std::string& stored = out.storage->emplace_back(std::move(s));
      if (!split_) {
        if (!stored.empty()) out.views.push_back(stored);
        continue;
      }
      // Split on the replacement, merged with the next piece.
      std::vector<Span> spans;
      std::string_view sv = stored;
      size_t last = 0;
      for (size_t p = sv.find(repl_); p != std::string_view::npos; p = sv.find(repl_, p + repl_.size())) {
        if (last < p) spans.push_back({last, p, false});
        spans.push_back({p, p + repl_.size(), true});
        last = p + repl_.size();
      }
      if (last < sv.size()) spans.push_back({last, sv.size(), false});
      apply_behavior(sv, spans, SplitBehavior::MergedWithNext, out.views);
    }
  }
  const char* name() const override { return "Metaspace"; }

 private:
  std::string repl_, scheme_;
  bool split_;
};

}  // namespace

RegexSplit::RegexSplit(std::unique_ptr<Regex> re, std::string literal, SplitBehavior behavior, bool invert)
    : re_(std::move(re)), literal_(std::move(literal)), behavior_(behavior), invert_(invert) {}

void RegexSplit::split_one(std::string_view s, std::vector<std::string_view>& out) const {
  if (s.empty()) return;
  // Fast path for the common case (Isolated, not inverted): emit matches and gaps directly.
  std::vector<Span> spans;
  size_t prev = 0;
  bool direct = behavior_ == SplitBehavior::Isolated;
  auto on_match = [&](size_t a, size_t b) {
    if (direct) {
      if (prev < a) out.push_back(s.substr(prev, a - prev));
      if (b > a) out.push_back(s.substr(a, b - a));
    } else {
      if (prev < a) spans.push_back({prev, a, invert_});
      spans.push_back({a, b, !invert_});
    }
    prev = b;
  };
  if (re_) {
    re_->find_iter(s, on_match);
  } else if (!literal_.empty()) {
    for (size_t p = s.find(literal_); p != std::string_view::npos; p = s.find(literal_, p + literal_.size()))
      on_match(p, p + literal_.size());
  }
  if (direct) {
    if (prev < s.size()) out.push_back(s.substr(prev));
    return;
  }
  if (prev < s.size()) spans.push_back({prev, s.size(), invert_});
  apply_behavior(s, spans, behavior_, out);
}

void RegexSplit::apply(const Words& in, Words& out, const char*) const {
  for (auto w : in.views) split_one(w, out.views);
}

ByteLevelPre::ByteLevelPre(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
  if (use_regex_)
    re_ = std::make_unique<Regex>("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
}

void ByteLevelPre::apply(const Words& in, Words& out, const char*) const {
  // The byte -> printable-char mapping itself is folded into the BPE vocabulary (byte-level mode).
  for (auto w : in.views) {
    std::string_view s = w;
    if (add_prefix_space_ && (s.empty() || s[0] != ' ')) {
      std::string& stored = out.storage->emplace_back();
      stored.reserve(s.size() + 1);
      stored += ' ';
      stored += s;
      s = stored;
    }
    if (!use_regex_) {
      if (!s.empty()) out.views.push_back(s);
      continue;
    }
    size_t prev = 0;
    re_->find_iter(s, [&](size_t a, size_t b) {
      if (prev < a) out.views.push_back(s.substr(prev, a - prev));
      if (b > a) out.views.push_back(s.substr(a, b - a));
      prev = b;
    });
    if (prev < s.size()) out.views.push_back(s.substr(prev));
  }
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j) {
  std::string t = type_of(j);
  if (t == "Split") {
    std::unique_ptr<Regex> re;
    std::string lit;
    parse_pattern(j.at("pattern"), "Split", re, lit);
    return std::make_unique<RegexSplit>(std::move(re), lit, parse_behavior(j.at("behavior").get<std::string>()),
                                        j.value("invert", false));
  }
  if (t == "ByteLevel") return std::make_unique<ByteLevelPre>(j.value("add_prefix_space", true), j.value("use_regex", true));
  if (t == "Digits") return std::make_unique<DigitsPre>(j.value("individual_digits", false));
  if (t == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPre>();
  if (t == "Whitespace") return std::make_unique<WhitespacePre>();
  if (t == "Metaspace") {
    std::string scheme = "always";
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) scheme = j["prepend_scheme"].get<std::string>();
    else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean())
      scheme = j["add_prefix_space"].get<bool>() ? "always" : "never";
    return std::make_unique<MetaspacePre>(j.value("replacement", std::string("\xE2\x96\x81")), scheme, j.value("split", true));
  }
  fail("tokenizer: unsupported pre_tokenizer type \"{}\"", t);
}

}  // namespace m3::tok
