// HuggingFace tokenizer.json runner: text <-> token ids, id-exact with the Rust `tokenizers` library for the
// components real byte-level BPE tokenizers use (see docs/TEXT_TOKENIZER.md for the list and the proof).
//
// Pipeline of encode (same order as HF):
//   added tokens that are not normalized are cut out of the raw text
//   -> each remaining piece is normalized -> normalized added tokens are cut out
//   -> pre-tokenizers split the pieces into words -> the BPE model turns each word into ids
//   -> the post-processor adds BOS/EOS (only when add_special_tokens).
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode/decode are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

namespace tok {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& tokenizer_json_path);  // throws m3::Error on bad file
  static Tokenizer from_json(const std::string& json_text);

  // Inputs of several hundred KB are split on boundaries where HF would split anyway and encoded on
  // m3::ThreadPool::global(); the ids are identical to the serial result.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Serial encode (what the benchmark measures as single-thread throughput).
  std::vector<int32_t> encode_serial(std::string_view text, bool add_special_tokens = true) const;
  // encode() for texts that share long prefixes with earlier calls (chat prompts of one conversation):
  // resumes at the longest cached prefix anchor (tokenizer_prefix_cache.h). Id-exact with encode(); same
  // as encode() when prefix_cache_enabled() is false (tokenizers where cut points are not provably safe).
  std::vector<int32_t> encode_cached(std::string_view text, bool add_special_tokens = true) const;
  bool prefix_cache_enabled() const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;
  // 1 + the largest id of the model vocabulary and the added tokens.
  size_t vocab_size() const;

  const tok::TokenizerImpl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const tok::TokenizerImpl> impl_;
};

}  // namespace m3
