// Builders of small tokenizer.json documents for the tokenizer unit tests.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer/tokenizer_impl.h"

namespace m3::test {

using nlohmann::json;

// Byte-level BPE: ids 0..255 are the single bytes (GPT-2 chars), then `extra` tokens in order.
inline json byte_level_tokenizer(const std::vector<std::string>& extra, const json& merges, bool ignore_merges = false) {
  const auto& t = tok::ByteLevelTable::get();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[t.byte_to_utf8[b]] = b;
  int id = 256;
  for (auto& e : extra) vocab[e] = id++;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", ignore_merges},
                {"byte_fallback", false}, {"unk_token", nullptr}};
  return j;
}

// Character-level BPE (SentencePiece style): <unk>=0, <s>=1, </s>=2, <0x00>..<0xFF>=3..258, then `chars`.
inline json char_tokenizer(const std::vector<std::string>& chars, const json& merges, bool byte_fallback, bool fuse_unk) {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int id = 259;
  for (auto& c : chars) vocab[c] = id++;
  json j;
  j["added_tokens"] = json::array({
      {{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
      {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}},
  });
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["decoder"] = nullptr;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", byte_fallback},
                {"fuse_unk", fuse_unk}, {"unk_token", "<unk>"}};
  return j;
}

}  // namespace m3::test
