// Unit tests of the tokenizer components on small hand-built tokenizer.json documents. Exactness on real
// files against HuggingFace is in tests/tokenizer/tokenizer_exactness_test.cpp.
#include <gtest/gtest.h>

#include "base/error.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_prefix_cache.h"
#include "tokenizer_test_util.h"

namespace m3 {
namespace {

using test::json;
using Ids = std::vector<int32_t>;

Tokenizer load(const json& j) { return Tokenizer::from_json(j.dump()); }

TEST(TokenizerBpe, MergesApplyInRankOrderWithBothMergeSpellings) {
  for (json merges : {json::array({"a b", "ab c"}), json::array({json::array({"a", "b"}), json::array({"ab", "c"})})}) {
    auto t = load(test::byte_level_tokenizer({"ab", "abc"}, merges));
    EXPECT_EQ(t.encode("abc"), (Ids{257}));
    EXPECT_EQ(t.encode("abab"), (Ids{256, 256}));
    EXPECT_EQ(t.encode("cab"), (Ids{'c', 256}));
  }
}

TEST(TokenizerBpe, LowerRankMergeWinsOverLeftmostPair) {
  // "b c" has rank 0, so "abc" -> a + bc even though "a b" is further left.
  auto t = load(test::byte_level_tokenizer({"bc", "ab"}, json::array({"b c", "a b"})));
  EXPECT_EQ(t.encode("abc"), (Ids{'a', 256}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordFromVocabulary) {
  auto with = load(test::byte_level_tokenizer({"xyz"}, json::array(), true));
  auto without = load(test::byte_level_tokenizer({"xyz"}, json::array(), false));
  EXPECT_EQ(with.encode("xyz"), (Ids{256}));
  EXPECT_EQ(without.encode("xyz"), (Ids{'x', 'y', 'z'}));
}

TEST(TokenizerBpe, LongWordsUseTheHeapPathWithTheSameResult) {
  auto t = load(test::byte_level_tokenizer({"aa", "aaaa"}, json::array({"a a", "aa aa"})));
  std::string word(301, 'a');  // one pre-token (no spaces): 301 symbols
  Ids want(75, 257);
  want.push_back('a');
  EXPECT_EQ(t.encode(word), want);
  EXPECT_EQ(t.encode(std::string(9, 'a')), (Ids{257, 257, 'a'}));
}

TEST(TokenizerBpe, ByteFallbackSpellsUnknownCharsAsBytes) {
  auto t = load(test::char_tokenizer({"a", "b"}, json::array(), true, false));
  // "é" = C3 A9 -> <0xC3> <0xA9> = 3+0xC3, 3+0xA9
  EXPECT_EQ(t.encode("aéb", false), (Ids{259, 3 + 0xC3, 3 + 0xA9, 260}));
}

TEST(TokenizerBpe, UnknownCharsBecomeUnkAndFuseWhenAsked) {
  auto plain = load(test::char_tokenizer({"a"}, json::array(), false, false));
  auto fused = load(test::char_tokenizer({"a"}, json::array(), false, true));
  EXPECT_EQ(plain.encode("aééa", false), (Ids{259, 0, 0, 259}));
  EXPECT_EQ(fused.encode("aééa", false), (Ids{259, 0, 259}));
}

TEST(TokenizerAddedTokens, SpecialTokensAreCutOutOfTheTextAndSkippedOnDecode) {
  auto j = test::byte_level_tokenizer({}, json::array());
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
                                   {{"id", 301}, {"content", "<|end|>x"}, {"special", true}, {"normalized", false}}});
  auto t = load(j);
  EXPECT_EQ(t.encode("a<|end|>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(t.encode("<|end|>x"), (Ids{301}));  // leftmost-longest
  EXPECT_EQ(t.decode(Ids{'a', 300, 'b'}), "a<|end|>b");
  EXPECT_EQ(t.decode(Ids{'a', 300, 'b'}, true), "ab");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special('a'));
  EXPECT_EQ(t.token_to_id("<|end|>"), 300);
  EXPECT_EQ(t.id_to_token(300), "<|end|>");
  EXPECT_EQ(t.vocab_size(), 302u);
}

TEST(TokenizerAddedTokens, LstripRstripAndSingleWord) {
  auto j = test::byte_level_tokenizer({}, json::array());
  j["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<m>"}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}},
      {{"id", 301}, {"content", "cat"}, {"single_word", true}, {"normalized", false}},
  });
  auto t = load(j);
  EXPECT_EQ(t.encode("a  <m>  b"), (Ids{'a', 300, 'b'}));  // the spaces are swallowed by the token
  EXPECT_EQ(t.encode("a cat"), (Ids{'a', ' ', 301}));
  EXPECT_EQ(t.encode("concat"), (Ids{'c', 'o', 'n', 'c', 'a', 't'}));  // not a single word there
}

TEST(TokenizerPostProcessor, TemplateProcessingAddsBosOnlyWithSpecialTokens) {
  auto j = test::char_tokenizer({"a"}, json::array(), false, false);
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                 {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}, {"</s>", {{"id", "</s>"}, {"ids", {2}}}}}}};
  auto t = load(j);
  EXPECT_EQ(t.encode("a", true), (Ids{1, 259, 2}));
  EXPECT_EQ(t.encode("a", false), (Ids{259}));
}

TEST(TokenizerPreTokenizer, SplitBehaviours) {
  auto make = [](const char* behavior, bool invert) {
    auto j = test::char_tokenizer({"a", "b", "-", "ab", "a-", "-b"}, json::array({"a b", "a -", "- b"}), false, false);
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return load(j);
  };
  // ids: a=259 b=260 -=261 ab=262 a-=263 -b=264; merges never cross pre-token boundaries.
  EXPECT_EQ(make("Isolated", false).encode("a-b", false), (Ids{259, 261, 260}));
  EXPECT_EQ(make("Removed", false).encode("a-b", false), (Ids{259, 260}));
  EXPECT_EQ(make("MergedWithPrevious", false).encode("a-b", false), (Ids{263, 260}));
  EXPECT_EQ(make("MergedWithNext", false).encode("a-b", false), (Ids{259, 264}));
  EXPECT_EQ(make("Contiguous", false).encode("a--b", false), (Ids{259, 261, 261, 260}));
}

// The prefix cache resumes at a cached anchor only after re-verifying it on the new text: here "\nE" is a word
// boundary when "f" follows but not when "x" follows (pattern "\n[A-Za-z]x"), so the second text must not reuse
// the first text's anchor there, and both must encode exactly as the serial encoder does.
TEST(TokenizerPrefixCache, CachedAnchorThatIsNoBoundaryInTheNewTextIsNotReused) {
  // Byte-level: 256 = "\nE" (merged first), 257 = "Ex".
  auto j = test::byte_level_tokenizer({"\u010aE", "Ex"}, json::array({"\u010a E", "E x"}));
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\n[A-Za-z]x|\n|[A-Za-z]+"}}}, {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  Tokenizer t = load(j);
  ASSERT_TRUE(t.prefix_cache_enabled());
  std::string first;
  while (first.size() < 60000) first += "Ef gh\n";
  first += "Ef";
  // The anchor after 32 KiB (the rule of tok::anchor_cuts): "\nEf" there in `first`, "\nEx" in `second`.
  const size_t c = first.find('\n', 32 * 1024) + 1;
  const std::string second = first.substr(0, c + 1) + "x tail\nEf gh\nEf";
  ASSERT_EQ(t.encode_serial(second.substr(c - 1, 3), false), (Ids{256, 'x'}));
  EXPECT_EQ(t.encode_cached(first, false), t.encode_serial(first, false));
  const auto& cache = *t.impl().prefix_cache;
  const uint64_t hits = cache.stats().hits;
  EXPECT_EQ(t.encode_cached(second, false), t.encode_serial(second, false));
  // The longest cached anchor fails to verify on this text: the encode resumes at the boundary before it.
  EXPECT_EQ(cache.stats().hits, hits + 1);
  const std::string third = first.substr(0, c + 1) + "f more\nEf";
  EXPECT_EQ(t.encode_cached(third, false), t.encode_serial(third, false));
  EXPECT_EQ(cache.stats().hits, hits + 2);
}

TEST(TokenizerNormalizer, NfcComposesAndLowercaseHandlesFinalSigma) {
  auto j = test::byte_level_tokenizer({}, json::array());
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  auto t = load(j);
  EXPECT_EQ(t.decode(t.encode("E\xCC\x81")), "\xC3\xA9");  // E + combining acute -> é
  EXPECT_EQ(t.decode(t.encode("\xCE\x9F\xCE\xA3")), "\xCE\xBF\xCF\x82");  // ΟΣ -> ος
}

TEST(TokenizerDecoder, ByteFallbackFuseStripAndMetaspace) {
  auto j = test::char_tokenizer({"\xE2\x96\x81" "a", "b"}, json::array(), true, false);
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  auto t = load(j);
  // ▁a <0xC3><0xA9> b -> " aéb" -> strip one leading space
  EXPECT_EQ(t.decode(Ids{259, 3 + 0xC3, 3 + 0xA9, 260}), "aéb");
  // an invalid byte run becomes one U+FFFD per byte
  EXPECT_EQ(t.decode(Ids{259, 3 + 0xC3, 260}), "a\xEF\xBF\xBD" "b");
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(load(j).decode(Ids{259, 260, 259}), "ab a");
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  auto expect_error = [](json j, const std::string& needle) {
    try {
      Tokenizer::from_json(j.dump());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto base = test::byte_level_tokenizer({}, json::array());
  auto j = base;
  j["normalizer"] = {{"type", "BertNormalizer"}};
  expect_error(j, "BertNormalizer");
  j = base;
  j["model"]["type"] = "WordPiece";
  expect_error(j, "WordPiece");
  j = base;
  j["decoder"] = {{"type", "CTC"}};
  expect_error(j, "CTC");
  j = base;
  j["pre_tokenizer"] = {{"type", "Punctuation"}};
  expect_error(j, "Punctuation");
  j = base;
  j["model"]["merges"] = json::array({"a zz"});
  expect_error(j, "merge");
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}

// Token ids in tokenizer.json must be integers in [0, 2^24): a float (fuzz_tokenizer found 4.4e79, whose conversion
// to an integer was undefined), a negative, a too-large or a string id is an Error naming the token.
TEST(TokenizerErrors, TokenIdsMustBeIntegersInRange) {
  auto expect_error = [](const json& j, const std::string& needle) {
    try {
      Tokenizer::from_json(j.dump());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const auto base = test::byte_level_tokenizer({}, json::array());
  const std::string key = base["model"]["vocab"].begin().key();
  for (const json& bad : {json(4.4e79), json(1.5), json(-1), json(int64_t(1) << 24), json("7")}) {
    auto j = base;
    j["model"]["vocab"][key] = bad;
    expect_error(j, "the vocab id of " + json(key).dump());
  }
  auto j = base;
  j["added_tokens"] = json::array({{{"id", 2.0e30}, {"content", "<x>"}, {"special", true}}});
  expect_error(j, "the id of added token \"<x>\"");
  j["added_tokens"][0]["id"] = uint64_t(1) << 63;
  expect_error(j, "the id of added token \"<x>\"");
}

TEST(TokenizerInput, InvalidUtf8IsReplacedNotCrashed) {
  auto t = load(test::byte_level_tokenizer({}, json::array()));
  auto ids = t.encode(std::string("a\xFF\xC3", 3));
  EXPECT_EQ(t.decode(ids), "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace m3
