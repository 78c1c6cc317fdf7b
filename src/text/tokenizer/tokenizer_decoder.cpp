// Decoders of tokenizer.json (HF decode_chain semantics): token strings in, token strings out.
#include "base/error.h"
#include "text/tokenizer/tokenizer_impl.h"

namespace m3::tok {

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    // Each token maps char-by-char back to bytes; a token with a char outside the table keeps its UTF-8
    // bytes. The joined bytes are read lossily (one U+FFFD per maximal invalid subpart).
    const auto& t = ByteLevelTable::get();
    std::string bytes;
    for (auto& tok : tokens) {
      size_t start = bytes.size();
      size_t i = 0;
      bool ok = true;
      while (i < tok.size()) {
        uint32_t cp = utf8_next(tok, i);
        auto it = t.cp_to_byte.find(cp);
        if (it == t.cp_to_byte.end()) {
          ok = false;
          break;
        }
        bytes += char(it->second);
      }
      if (!ok) {
        bytes.resize(start);
        bytes += tok;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
  const char* name() const override { return "ByteLevel"; }
};

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_lossy(pending) == pending) {
        out.push_back(pending);
      } else {
        // HF emits one U+FFFD per byte when the byte run is not valid UTF-8 as a whole.
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& tok : tokens) {
      int b = byte_of(tok);
      if (b >= 0) {
        pending += char(b);
      } else {
        flush();
        out.push_back(std::move(tok));
      }
    }
    flush();
    tokens.swap(out);
  }
  // "<0xAB>" -> 0xAB, else -1 (u8::from_str_radix on the two chars, which also accepts "+d").
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int hi = hexval(t[3]), lo = hexval(t[4]);
    if (t[3] == '+' && lo >= 0) return lo;
    if (hi < 0 || lo < 0) return -1;
    return hi * 16 + lo;
  }
  const char* name() const override { return "ByteFallback"; }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
  const char* name() const override { return "Fuse"; }
};

std::vector<uint32_t> to_cps(const std::string& s) {
  std::vector<uint32_t> v;
  size_t i = 0;
  while (i < s.size()) v.push_back(utf8_next(s, i));
  return v;
}

class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& tok : tokens) {
      auto cps = to_cps(tok);
      size_t b = 0, e = cps.size();
      for (size_t i = 0; i < start_ && i < cps.size() && cps[i] == content_; ++i) b = i + 1;
      for (size_t i = 0; i < stop_ && i < cps.size() && cps[cps.size() - 1 - i] == content_; ++i) e = cps.size() - 1 - i;
      std::string s;
      for (size_t i = b; i < e; ++i) utf8_append(s, cps[i]);
      tok = std::move(s);
    }
  }
  const char* name() const override { return "Strip"; }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> re, std::string literal, std::string content)
      : re_(std::move(re)), literal_(std::move(literal)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& tok : tokens) {
      std::string out;
      size_t prev = 0;
      auto on_match = [&](size_t a, size_t b) {
        out.append(tok, prev, a - prev);
        out += content_;
        prev = b;
      };
      if (re_) {
        re_->find_iter(tok, on_match);
      } else if (!literal_.empty()) {
        for (size_t p = tok.find(literal_); p != std::string::npos; p = tok.find(literal_, p + literal_.size()))
          on_match(p, p + literal_.size());
      }
      out.append(tok, prev, std::string::npos);
      tok = std::move(out);
    }
  }
  const char* name() const override { return "Replace"; }

 private:
  std::unique_ptr<Regex> re_;
  std::string literal_, content_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string repl, bool strip_first) : repl_(std::move(repl)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t p = 0;
      for (size_t q = t.find(repl_); q != std::string::npos; q = t.find(repl_, p)) {
        out.append(t, p, q - p);
        out += ' ';
        p = q + repl_.size();
      }
      out.append(t, p, std::string::npos);
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }
  const char* name() const override { return "Metaspace"; }

 private:
  std::string repl_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> v) : v_(std::move(v)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : v_) d->decode_chain(tokens);
  }
  const char* name() const override { return "Sequence"; }

 private:
  std::vector<std::unique_ptr<Decoder>> v_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type")) fail("tokenizer: decoder without a type");
  std::string t = j["type"].get<std::string>();
  if (t == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (t == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (t == "Fuse") return std::make_unique<FuseDecoder>();
  if (t == "Strip") {
    std::string c = j.at("content").get<std::string>();
    size_t i = 0;
    uint32_t cp = c.empty() ? 0 : utf8_next(c, i);
    return std::make_unique<StripDecoder>(cp, j.value("start", size_t(0)), j.value("stop", size_t(0)));
  }
  if (t == "Replace") {
    std::unique_ptr<Regex> re;
    std::string lit;
    const json& p = j.at("pattern");
    if (p.contains("Regex")) re = std::make_unique<Regex>(p["Regex"].get<std::string>());
    else if (p.contains("String")) lit = p["String"].get<std::string>();
    else fail("tokenizer: Replace decoder pattern must be String or Regex");
    return std::make_unique<ReplaceDecoder>(std::move(re), lit, j.at("content").get<std::string>());
  }
  if (t == "Metaspace") {
    bool strip = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) strip = j["prepend_scheme"].get<std::string>() != "never";
    else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean()) strip = j["add_prefix_space"].get<bool>();
    return std::make_unique<MetaspaceDecoder>(j.value("replacement", std::string("\xE2\x96\x81")), strip);
  }
  if (t == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> v;
    for (auto& d : j.at("decoders"))
      if (auto p = make_decoder(d)) v.push_back(std::move(p));
    return std::make_unique<SequenceDecoder>(std::move(v));
  }
  fail("tokenizer: unsupported decoder type \"{}\"", t);
}

}  // namespace m3::tok
