// libFuzzer target for the tokenizer: arbitrary bytes as text to encode, as ids to decode and stream,
// and as a tokenizer.json to load. Only m3::Error may escape the library; sanitizers catch the rest.
// The tokenizer under test is a small byte-level BPE with added tokens and a Split regex, or the file
// named by M3_FUZZ_TOKENIZER (e.g. a real tokenizer.json from tests/npm).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/tokenizer/detokenizer.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_impl.h"

namespace {

using nlohmann::json;

std::string builtin_tokenizer_json() {
  const auto& t = m3::tok::ByteLevelTable::get();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[t.byte_to_utf8[b]] = b;
  json merges = json::array();
  int id = 256;
  // A few merges over common ASCII pairs, so words merge at several depths.
  const char* pairs[][2] = {{"t", "h"}, {"th", "e"}, {"Ġ", "t"}, {"Ġt", "h"}, {"Ġth", "e"}, {"i", "n"}, {"in", "g"}, {"a", "a"}, {"aa", "aa"}};
  for (auto& p : pairs) {
    merges.push_back(std::string(p[0]) + " " + p[1]);
    vocab[std::string(p[0]) + p[1]] = id++;
  }
  json j;
  j["added_tokens"] = json::array({
      {{"id", 1000}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
      {{"id", 1001}, {"content", "<t>"}, {"special", false}, {"normalized", true}, {"lstrip", true}, {"rstrip", true}},
      {{"id", 1002}, {"content", "word"}, {"special", false}, {"normalized", false}, {"single_word", true}},
  });
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  return j.dump();
}

const m3::Tokenizer& tokenizer() {
  static const m3::Tokenizer tok = [] {
    if (const char* p = std::getenv("M3_FUZZ_TOKENIZER")) return m3::Tokenizer::from_file(p);
    return m3::Tokenizer::from_json(builtin_tokenizer_json());
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& tok = tokenizer();
  uint8_t mode = data[0] % 4;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 0 || mode == 1) {
    // Encode (possibly invalid UTF-8); the round trip must not crash and decode must be valid UTF-8.
    auto ids = tok.encode(rest, mode == 1);
    std::string back = tok.decode(ids);
    if (m3::tok::utf8_lossy(back) != back) std::abort();
  } else if (mode == 2) {
    // Ids (little-endian 16-bit, spread over the vocab and beyond): decode == streamed pieces.
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < rest.size(); i += 2)
      ids.push_back(int32_t(uint8_t(rest[i]) | (uint8_t(rest[i + 1]) << 8)) % 1100);
    for (bool skip : {false, true}) {
      m3::IncrementalDetokenizer d(tok, skip);
      std::string all;
      for (int32_t id : ids) {
        std::string piece = d.push(id);
        if (m3::tok::utf8_lossy(piece) != piece) std::abort();
        all += piece;
      }
      all += d.flush();
      if (all != tok.decode(ids, skip)) std::abort();
    }
  } else {
    // The bytes as a tokenizer.json: either loads or throws m3::Error.
    try {
      auto t = m3::Tokenizer::from_json(std::string(rest));
      auto ids = t.encode("Hello, world! 123 <|end|> héllo");
      (void)t.decode(ids, true);
    } catch (const m3::Error&) {
    }
  }
  return 0;
}
