// Streaming detokenizer: pieces concatenate to the full decode and never end inside a UTF-8 sequence.
#include <gtest/gtest.h>

#include "text/tokenizer/detokenizer.h"
#include "text/tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace m3 {
namespace {

using test::json;
using Ids = std::vector<int32_t>;

std::vector<std::string> stream(const Tokenizer& t, const Ids& ids, bool skip) {
  IncrementalDetokenizer d(t, skip);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(d.push(id));
  pieces.push_back(d.flush());
  return pieces;
}

std::string concat(const std::vector<std::string>& v) {
  std::string s;
  for (auto& p : v) s += p;
  return s;
}

TEST(IncrementalDetokenizer, ByteLevelHoldsBackSplitCharacters) {
  auto j = test::byte_level_tokenizer({}, json::array());
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|eot|>"}, {"special", true}, {"normalized", false}}});
  Tokenizer t = Tokenizer::from_json(j.dump());
  // "é" = C3 A9 and "😀" = F0 9F 98 80, one byte per token.
  Ids ids{'a', 0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80, 300, 'b'};
  auto pieces = stream(t, ids, false);
  EXPECT_EQ(pieces[1], "");
  EXPECT_EQ(pieces[2], "\xC3\xA9");
  EXPECT_EQ(pieces[3], "");
  EXPECT_EQ(pieces[6], "\xF0\x9F\x98\x80");
  EXPECT_EQ(concat(pieces), t.decode(ids));
  EXPECT_EQ(concat(stream(t, ids, true)), t.decode(ids, true));
  EXPECT_EQ(concat(stream(t, ids, true)), "a\xC3\xA9\xF0\x9F\x98\x80" "b");
}

TEST(IncrementalDetokenizer, InvalidBytesBecomeReplacementCharactersAsInFullDecode) {
  Tokenizer t = Tokenizer::from_json(test::byte_level_tokenizer({}, json::array()).dump());
  for (Ids ids : {Ids{0xC3, 'a'}, Ids{0xE2, 0x82}, Ids{0xF0, 0x9F, 0xC3, 0xA9}, Ids{0xA9, 0xA9}, Ids{0xED, 0xA0, 0x80}}) {
    auto pieces = stream(t, ids, false);
    EXPECT_EQ(concat(pieces), t.decode(ids));
    for (auto& p : pieces) EXPECT_EQ(tok::utf8_lossy(p), p);  // every piece is whole UTF-8
  }
}

TEST(IncrementalDetokenizer, GenericDecoderChainMatchesFullDecodeForEveryPrefix) {
  auto j = test::char_tokenizer({"\xE2\x96\x81" "a", "b", "\xE2\x96\x81"}, json::array(), true, false);
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  Tokenizer t = Tokenizer::from_json(j.dump());
  Ids ids{259, 3 + 0xC3, 3 + 0xA9, 260, 261, 1, 259, 3 + 0xE2, 260, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 259};
  for (size_t n = 0; n <= ids.size(); ++n) {
    Ids prefix(ids.begin(), ids.begin() + long(n));
    for (bool skip : {false, true}) {
      auto pieces = stream(t, prefix, skip);
      EXPECT_EQ(concat(pieces), t.decode(prefix, skip)) << "prefix " << n;
      for (auto& p : pieces) EXPECT_EQ(tok::utf8_lossy(p), p);
    }
  }
}

TEST(IncrementalDetokenizer, MetaspaceDecoderStripsOnlyTheFirstSpace) {
  auto j = test::char_tokenizer({"\xE2\x96\x81" "a", "b"}, json::array(), false, false);
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  Tokenizer t = Tokenizer::from_json(j.dump());
  Ids ids{259, 260, 259, 259, 260};
  EXPECT_EQ(concat(stream(t, ids, false)), "ab a ab");
  EXPECT_EQ(concat(stream(t, ids, false)), t.decode(ids));
}

}  // namespace
}  // namespace m3
