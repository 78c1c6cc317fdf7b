// parse_json_lifting_long_strings (server/json_long_strings.h) must build exactly the tree nlohmann builds from the
// same text, whatever the long strings are, and fail where nlohmann fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "server/json_long_strings.h"

namespace m3::server {
namespace {

using OJson = nlohmann::ordered_json;

std::string b64ish(size_t n, uint32_t seed) {
  static const char kAlpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::mt19937 g(seed);
  std::string s(n, 'A');
  for (char& c : s) c = kAlpha[g() % 64];
  return s;
}

void expect_same_tree(const std::string& body, size_t lifted_expected) {
  size_t lifted = 99;
  const OJson fast = parse_json_lifting_long_strings(body, &lifted);
  const OJson ref = OJson::parse(body);
  EXPECT_EQ(lifted, lifted_expected);
  EXPECT_TRUE(fast == ref) << "trees differ for a body of " << body.size() << " bytes";
}

TEST(JsonLongStrings, LiftedStringsComeBackAsTheSameTree) {
  const std::string big = b64ish(kLiftMinBytes + 17, 1), big2 = b64ish(3 * kLiftMinBytes, 2);
  // Values in nested objects and arrays, with whitespace around them, and a short string beside them.
  expect_same_tree(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,)" +
                       big + R"("}},{"type":"text","text":"hi"}, "data:)" + big2 + R"(" ]}], "n" : [1, 2.5, null, true]})",
                   2);
  // A long key stays a key (keys are not lifted); a long value after it is.
  expect_same_tree("{\"" + big + "\" : \"" + big2 + "\"}", 1);
  // Escapes, non-ASCII UTF-8 and control-free but non-printable bytes keep a long string in the lexer's hands.
  expect_same_tree("[\"" + big + "\\n" + big + "\", \"" + big + "\\u00e9\\\"\"]", 0);
  expect_same_tree("[\"" + big + "\xc3\xa9\"]", 0);
  expect_same_tree("[\"" + big + "\\\\\", \"" + big2 + "\"]", 1);  // an escaped backslash right before the quote
  // Just below the threshold: parsed as it is.
  expect_same_tree("[\"" + b64ish(kLiftMinBytes - 1, 3) + "\"]", 0);
}

TEST(JsonLongStrings, ABytePlainAsciiRefusesAnywhereInALongStringKeepsItInTheLexer) {
  // The plain-ASCII test runs 64 bytes per step (SSE2), then 8, then 1: one offending byte at every step's edges,
  // in the 64-byte part, the 8-byte part and the last bytes must keep the string out of the lift (same tree, or the
  // same parse error), and the printable edges 0x20 / 0x7e must not.
  const size_t n = kLiftMinBytes + 64 + 8 + 3;  // all three loops run
  const std::string base = b64ish(n, 6);
  for (size_t at : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(63), size_t(64), size_t(65), n / 2,
                    n - 75, n - 12, n - 11, n - 9, n - 4, n - 1}) {
    for (const std::string& bad : {std::string("\x7f"), std::string("\xc3\xa9"), std::string("\\n"),
                                   std::string("\\u0041"), std::string("\x80\x80")}) {
      std::string s = base;
      s.replace(at, bad.size(), bad);
      s.resize(n);
      const std::string body = "[\"" + s + "\"]";
      SCOPED_TRACE(testing::Message() << "byte " << int(static_cast<unsigned char>(bad[0])) << " at " << at);
      bool ref_throws = false;
      try {
        const OJson ref = OJson::parse(body);
        (void)ref;
      } catch (const nlohmann::json::parse_error&) {
        ref_throws = true;
      }
      if (ref_throws)
        EXPECT_THROW(parse_json_lifting_long_strings(body), nlohmann::json::parse_error);
      else
        expect_same_tree(body, 0);
    }
    std::string s = base;
    s[at] = '\x1f';  // a raw control byte: invalid JSON either way
    EXPECT_THROW(parse_json_lifting_long_strings("[\"" + s + "\"]"), nlohmann::json::parse_error);
  }
  std::string edges(n, ' ');
  for (size_t i = 0; i < n; i += 3) edges[i] = '~';
  expect_same_tree("[\"" + edges + "\"]", 1);
}

TEST(JsonLongStrings, AClientStringShapedLikeAPlaceholderIsKeptAsSent) {
  const std::string big = b64ish(kLiftMinBytes, 4);
  // The placeholder's shape without the per-call random key: never mistaken for a lifted string.
  for (const std::string& fake : {std::string("\\u0001m3-lifted-0000000000000000-0"), std::string("\\u0001m3-lifted-"),
                                  std::string("\\u0001m3-lifted-0123456789abcdef-1")})
    expect_same_tree("[\"" + big + "\", \"" + fake + "\"]", 1);
}

TEST(JsonLongStrings, MalformedBodiesFailAsNlohmannFails) {
  const std::string big = b64ish(kLiftMinBytes, 5);
  for (const std::string& bad : {"[\"" + big + "\", ", "[\"" + big + "\" \"x\"]", "{\"a\": \"" + big + "\"",
                                 "[\"" + big + "\", tru]", "[\"" + big})
    EXPECT_THROW(parse_json_lifting_long_strings(bad), nlohmann::json::parse_error) << bad.substr(bad.size() - 8);
}

TEST(JsonLongStrings, EightImageBodyParsesFasterThanTheLexerAlone) {
  // Not a speed assertion: prints both times so a regression is visible in the test log; checks the tree.
  std::string body = R"({"model":"m3","messages":[{"role":"user","content":[)";
  for (int k = 0; k < 8; ++k)
    body += std::string(k ? "," : "") + R"({"type":"image_url","image_url":{"url":"data:image/jpeg;base64,)" +
            b64ish(2 << 20, 10 + uint32_t(k)) + R"("}})";
  body += "]}]}";
  auto t0 = std::chrono::steady_clock::now();
  size_t lifted = 0;
  const OJson fast = parse_json_lifting_long_strings(body, &lifted);
  auto t1 = std::chrono::steady_clock::now();
  const OJson ref = OJson::parse(body);
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(lifted, 8u);
  EXPECT_TRUE(fast == ref);
  std::printf("[json-lift] %zu MB body: lifted parse %.1f ms, nlohmann alone %.1f ms\n", body.size() >> 20,
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count());
}

}  // namespace
}  // namespace m3::server
