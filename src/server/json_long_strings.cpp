#include "server/json_long_strings.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

namespace m3::server {

namespace {

using OJson = nlohmann::ordered_json;

struct Span {
  size_t begin, size;  // the string's bytes in body, without its quotes
};

// True when p[0, n) is a JSON string's content that decodes to itself: printable ASCII (0x20–0x7e), no '\\' (the
// caller found no '"' in it). Eight bytes at a time: a byte b is flagged when b ≥ 0x80, b < 0x20, b == 0x7f or
// b == '\\' (zero-byte tests on w − 0x20…, w ^ 0x7f…, w ^ 0x5c…).
bool plain_ascii(const char* p, size_t n) {
  constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x8080808080808080ull;
  auto has_zero = [](uint64_t v) { return (v - k01) & ~v & k80; };
  size_t i = 0;
#if defined(__SSE2__)
  // 64 bytes per step with SSE2 (x86-64's baseline): as signed bytes, b < 0x20 also flags every b ≥ 0x80. A 16 MB
  // body of data: URLs took ~4 ms in the word loop below on the dev VM.
  const __m128i space = _mm_set1_epi8(0x20), del = _mm_set1_epi8(0x7f), backslash = _mm_set1_epi8('\\');
  for (; i + 64 <= n; i += 64) {
    __m128i bad = _mm_setzero_si128();
    for (size_t k = 0; k < 64; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + k));
      bad = _mm_or_si128(bad, _mm_or_si128(_mm_cmplt_epi8(v, space),
                                           _mm_or_si128(_mm_cmpeq_epi8(v, del), _mm_cmpeq_epi8(v, backslash))));
    }
    if (_mm_movemask_epi8(bad) != 0) return false;
  }
#endif
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    const uint64_t bad = (w & k80) | ((w - 0x20 * k01) & ~w & k80) | has_zero(w ^ (0x7f * k01)) |
                         has_zero(w ^ (0x5c * k01));
    if (bad) return false;
  }
  for (; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c < 0x20 || c > 0x7e || c == '\\') return false;
  }
  return true;
}

// Puts the lifted strings back: every string value equal to prefix + index. Depth is bounded by the caller's
// json_too_deep check (request_parse.cpp) before parsing.
void restore(OJson& j, std::string_view body, const std::vector<Span>& spans, const std::string& prefix) {
  if (j.is_string()) {
    std::string& s = j.get_ref<std::string&>();
    if (s.size() <= prefix.size() || s.compare(0, prefix.size(), prefix) != 0) return;
    size_t idx = 0;
    for (size_t i = prefix.size(); i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9' || idx > spans.size()) return;
      idx = idx * 10 + size_t(s[i] - '0');
    }
    if (idx >= spans.size()) return;
    s.assign(body.data() + spans[idx].begin, spans[idx].size);
  } else if (j.is_array()) {
    for (OJson& v : j) restore(v, body, spans, prefix);
  } else if (j.is_object()) {
    for (auto& kv : j.items()) restore(kv.value(), body, spans, prefix);
  }
}

}  // namespace

OJson parse_json_lifting_long_strings(std::string_view body, size_t* lifted) {
  if (lifted) *lifted = 0;
  if (body.size() < kLiftMinBytes) return OJson::parse(body.begin(), body.end());
  // One pass over the text, outside strings jumping quote to quote. A string ends at the first unescaped '"'; when
  // its bytes before the next '"' hold no backslash that quote is the end (the common case, found with memchr).
  std::vector<Span> spans;
  const char* p = body.data();
  const size_t n = body.size();
  size_t i = 0;
  while (i < n) {
    const void* q = std::memchr(p + i, '"', n - i);
    if (!q) break;
    const size_t begin = size_t(static_cast<const char*>(q) - p) + 1;
    const void* e = std::memchr(p + begin, '"', n - begin);
    if (!e) break;  // unterminated: the parser reports it
    size_t end = size_t(static_cast<const char*>(e) - p);
    const bool escaped = std::memchr(p + begin, '\\', end - begin) != nullptr;
    if (escaped) {  // the first quote not preceded by an odd run of backslashes
      end = begin;
      while (end < n && p[end] != '"') end += p[end] == '\\' ? 2 : 1;
      if (end >= n) break;
    }
    i = end + 1;
    const size_t size = end - begin;
    if (escaped || size < kLiftMinBytes || !plain_ascii(p + begin, size)) continue;
    size_t after = i;  // a key is followed by ':' — keys stay (the restore walks values only)
    while (after < n && (p[after] == ' ' || p[after] == '\t' || p[after] == '\n' || p[after] == '\r')) ++after;
    if (after < n && p[after] == ':') continue;
    spans.push_back(Span{begin, size});
  }
  if (spans.empty()) return OJson::parse(body.begin(), body.end());
  // "\u0001m3-lifted-<key>-<index>": a client cannot produce a string that matches without knowing the key.
  std::random_device rd;
  const uint64_t key = (uint64_t(rd()) << 32) ^ rd();
  const std::string text_prefix = fmt::format("\\u0001m3-lifted-{:016x}-", key);
  const std::string value_prefix = fmt::format("\x01m3-lifted-{:016x}-", key);
  std::string shrunk;
  shrunk.reserve(n - [&] {
    size_t t = 0;
    for (const Span& s : spans) t += s.size;
    return t;
  }() + spans.size() * (text_prefix.size() + 8));
  size_t from = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    shrunk.append(p + from, spans[k].begin - from);
    shrunk.append(text_prefix);
    shrunk.append(std::to_string(k));
    from = spans[k].begin + spans[k].size;
  }
  shrunk.append(p + from, n - from);
  OJson j = OJson::parse(shrunk);
  restore(j, body, spans, value_prefix);
  if (lifted) *lifted = spans.size();
  return j;
}

}  // namespace m3::server
