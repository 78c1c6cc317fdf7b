// json_nesting_depth (base/json_depth.h) skips string bodies with memchr; it must give what a byte-by-byte scan
// gives on any text: brackets inside strings ignored, escapes (also an escaped quote or backslash, and a backslash
// as the last byte) honoured, unterminated strings, and long strings.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "base/json_depth.h"

namespace m3 {
namespace {

int reference_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return max_depth;
}

TEST(JsonDepth, MatchesAByteScanOnRandomTextOfBracketsQuotesAndEscapes) {
  std::mt19937 g(7);
  const char alphabet[] = {'[', ']', '{', '}', '"', '\\', 'a', ' ', ':', ','};
  for (int n = 0; n < 20000; ++n) {
    std::string s(size_t(g() % 64), ' ');
    for (char& c : s) c = alphabet[g() % sizeof alphabet];
    ASSERT_EQ(json_nesting_depth(s), reference_depth(s)) << s;
  }
}

TEST(JsonDepth, IgnoresBracketsInsideLongStringsAndCountsThoseAround) {
  const std::string b64(1 << 20, 'Q');
  EXPECT_EQ(json_nesting_depth("{\"a\": [\"" + b64 + "[[[{{\", {\"b\": 1}]}"), 3);
  EXPECT_EQ(json_nesting_depth("[\"x\\\"[[[\\\\\", [[]]]"), 3);  // escaped quote, then an escaped backslash
  EXPECT_EQ(json_nesting_depth("[\"unterminated [[[["), 1);
  EXPECT_EQ(json_nesting_depth("[\"ends in a backslash\\"), 1);
  EXPECT_EQ(json_nesting_depth(std::string(300, '[')), 300);
  EXPECT_TRUE(json_too_deep(std::string(kMaxJsonDepth + 1, '{')));
  EXPECT_FALSE(json_too_deep("{\"" + std::string(kMaxJsonDepth + 1, '{') + "\"}"));
}

}  // namespace
}  // namespace m3
