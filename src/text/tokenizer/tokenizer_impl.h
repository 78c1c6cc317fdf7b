// Internals of m3::Tokenizer (not part of the public API): the components of a tokenizer.json and the
// UTF-8 helpers they share. Every component mirrors the HF `tokenizers` (Rust, v0.22) behaviour.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::tok {

using json = nlohmann::json;

// A token id read from tokenizer.json: an integer in [0, 2^24). Anything else — a float, a string, a number out of
// range — throws Error naming `what` (and the token `name`, when given; formatted only then); never a float-to-integer
// conversion (undefined for values beyond the type, found by fuzz_tokenizer).
int32_t json_token_id(const json& v, std::string_view what, std::string_view name = {});

// ---------------------------------------------------------------- UTF-8
// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when it is invalid/incomplete there.
size_t utf8_valid_len(std::string_view s, size_t i);
// Decodes one code point at s[i] (input must be valid UTF-8); advances i.
uint32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, uint32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Bytes at the end of `s` that form an incomplete but still possibly valid sequence (0..3).
size_t utf8_incomplete_tail(std::string_view s);
bool is_unicode_whitespace(uint32_t cp);  // Unicode White_Space (Rust char::is_whitespace)
bool is_unicode_alnum_word(uint32_t cp);  // Rust regex \w

// GPT-2 byte <-> printable char table used by ByteLevel.
struct ByteLevelTable {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelTable();
  static const ByteLevelTable& get();
};

// ---------------------------------------------------------------- Regex (PCRE2 + JIT)
class Regex {
 public:
  // `onig_compat` rewrites \s and \S to Oniguruma's Unicode White_Space set (PCRE2's \s lacks U+0085).
  explicit Regex(const std::string& pattern, bool onig_compat = true);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls fn(start, end) for every non-overlapping match of the pattern in s (find_iter semantics:
  // an empty match advances by one character).
  template <typename Fn>
  void find_iter(std::string_view s, Fn&& fn) const {
    size_t pos = 0, m_start = 0, m_end = 0;
    while (pos <= s.size() && match(s, pos, m_start, m_end)) {
      fn(m_start, m_end);
      if (m_end == m_start) {
        if (m_end >= s.size()) break;
        pos = m_end + utf8_char_len(s, m_end);
      } else {
        pos = m_end;
      }
    }
  }
  bool match(std::string_view s, size_t start, size_t& m_start, size_t& m_end) const;
  const std::string& pattern() const { return pattern_; }

 private:
  static size_t utf8_char_len(std::string_view s, size_t i);
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// ---------------------------------------------------------------- Normalizers
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
  // True when normalizing two halves split before a '\n' gives the same as normalizing the whole
  // (needed for parallel encode).
  virtual bool is_local() const { return false; }
};
std::unique_ptr<Normalizer> make_normalizer(const json& j);

// ---------------------------------------------------------------- Pre-tokenizers
// A list of words; views point into the caller's text or into `storage` for rewritten words.
struct Words {
  std::vector<std::string_view> views;
  std::deque<std::string>* storage;  // shared by all stages of one encode (stable addresses)
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every word of `in` and appends the results to `out`. `text_start` points at the first byte
  // of the input text when this segment starts there (else nullptr): a word whose data() equals it is
  // at original offset 0 (used by Metaspace prepend_scheme "first").
  virtual void apply(const Words& in, Words& out, const char* text_start) const = 0;
  virtual const char* name() const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j);

// Split-like pre-tokenizers expose how they cut a single string (for the parallel boundary check).
class RegexSplit : public PreTokenizer {
 public:
  RegexSplit(std::unique_ptr<Regex> re, std::string literal, SplitBehavior behavior, bool invert);
  void apply(const Words& in, Words& out, const char* text_start) const override;
  const char* name() const override { return "Split"; }
  void split_one(std::string_view s, std::vector<std::string_view>& out) const;
  const Regex* regex() const { return re_.get(); }
  bool isolated_not_inverted() const { return behavior_ == SplitBehavior::Isolated && !invert_; }

 private:
  std::unique_ptr<Regex> re_;
  std::string literal_;  // used when re_ is null (pattern {"String": ...})
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex);
  void apply(const Words& in, Words& out, const char* text_start) const override;
  const char* name() const override { return "ByteLevel"; }
  bool add_prefix_space() const { return add_prefix_space_; }
  bool use_regex() const { return use_regex_; }
  const Regex* regex() const { return re_.get(); }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> re_;
};

// Read-only string -> id map with open addressing and string_view lookups (no allocation per lookup).
class FlatStrMap {
 public:
  void build(const std::unordered_map<std::string, int32_t>& m);
  const int32_t* find(std::string_view key) const;

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = ~0u;
    int32_t value = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  uint64_t mask_ = 0;
};

// ---------------------------------------------------------------- BPE model
// Symbols are token ids. In byte-level mode words are raw bytes (the ByteLevel char mapping is folded
// into the vocabulary at load time), otherwise words are UTF-8 text split into characters.
class BpeModel {
 public:
  BpeModel(const json& model, bool byte_level);
  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;  // token in tokenizer.json spelling
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct MergeEntry {
    uint64_t key;  // (left << 32) | right, ~0 for empty slot
    int32_t rank;
    int32_t new_id;
  };
  const MergeEntry* find_merge(int32_t left, int32_t right) const;
  void merge_symbols(std::vector<int32_t>& syms) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;

  bool byte_level_;
  std::unordered_map<std::string, int32_t> vocab_;       // tokenizer.json spelling
  std::unordered_map<std::string, int32_t> word_vocab_;  // spelling of words as the model sees them
  FlatStrMap word_lookup_;  // word_vocab_ (byte level) or vocab_ (char level), for the hot path
  std::vector<std::string> id_to_token_;
  std::vector<MergeEntry> merges_;  // open addressing, power-of-two size
  uint64_t merge_mask_ = 0;
  std::array<int32_t, 256> byte_ids_{};  // byte-level: id of each single byte; -1 when absent
  std::array<int32_t, 256> fallback_ids_{};  // byte_fallback: id of "<0xXX>"; -1 when absent
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  uint64_t cache_tag_;  // identifies this model in the per-thread word cache
};

// ---------------------------------------------------------------- Decoders
class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF decode_chain: tokens in, tokens out.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  virtual const char* name() const = 0;
};
std::unique_ptr<Decoder> make_decoder(const json& j);

// ---------------------------------------------------------------- Added tokens
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest matcher over a set of literal strings (the AhoCorasick of HF).
class LiteralMatcher {
 public:
  void build(const std::vector<std::pair<std::string, int32_t>>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  // Finds the leftmost-longest match starting at or after `from`; returns false if none.
  bool find(std::string_view s, size_t from, size_t& start, size_t& end, int32_t& id) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t id = -1;
  };
  int32_t child(int32_t node, uint8_t b) const;
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_byte_{};
};

// Post-processor: only what add_special_tokens changes for a single sequence.
struct PostProcessor {
  std::vector<int32_t> prefix, suffix;
};

class PrefixCache;  // tokenizer_prefix_cache.h

// A verified cut of a piece-by-piece encode: text[0, pos) encodes to the first `ntok` ids, and the piece
// before it started at the verified boundary prev_pos (after prev_ntok ids).
struct PieceAnchor {
  size_t pos, ntok, prev_pos, prev_ntok;
};

// First cut (just after a '\n' followed by an ASCII letter) at or after `target`; npos if none.
size_t cut_after(std::string_view s, size_t target);
// The first cut after every multiple of `spacing`: depends only on the text up to the cut, so texts with a
// common prefix share their anchors in it.
std::vector<size_t> anchor_cuts(std::string_view s, size_t spacing);

struct TokenizerImpl;
// Encodes valid UTF-8 `text` (no post-processor) piece by piece at `cuts`, appending the verified ones to
// `anchors`. With `resume`, `out` already holds the ids of text[0, resume->prev_pos) and the encode goes on
// from there (resume->pos is re-verified on this text like any cut). Needs TokenizerImpl::prefix_cache_ok.
// False: use encode_into instead.
bool encode_pieces(const TokenizerImpl& t, std::string_view text, const std::vector<size_t>& cuts,
                   const PieceAnchor* resume, std::vector<int32_t>& out, std::vector<PieceAnchor>& anchors);

struct TokenizerImpl {
  std::unique_ptr<Normalizer> normalizer;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;
  PostProcessor post;
  std::vector<AddedToken> added;  // in file order
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  LiteralMatcher raw_matcher, normalized_matcher;
  bool byte_level = false;           // pre-tokenizer pipeline ends in ByteLevel
  bool decoder_is_byte_level = false;  // decoder is exactly ByteLevel
  bool parallel_ok = false;          // encode may split large inputs on '\n' boundaries
  // encode_pieces is valid (parallel_ok, no normalizer, startup self-check passed); prefix_cache is then set.
  bool prefix_cache_ok = false;
  std::shared_ptr<PrefixCache> prefix_cache;
  int32_t max_id = -1;

  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  // Splits on added tokens (raw, then normalized) and encodes every remaining piece.
  void encode_segment(std::string_view piece, bool first_piece, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view normalized, bool first_piece, std::vector<int32_t>& out) const;
  std::string decode_chunk(std::vector<std::string>& tokens) const;
  const AddedToken* added_token(int32_t id) const {
    auto it = added_by_id.find(id);
    return it == added_by_id.end() ? nullptr : &added[it->second];
  }
  // Token string of an id for decoding: added-token content or model token; nullptr when the id is
  // unknown or is a special token being skipped.
  const std::string* token_string(int32_t id, bool skip_special) const;
};

// Appends what the ByteLevel decoder makes of one token string (bytes, before UTF-8 repair).
void append_byte_level_bytes(const std::string& token, std::string& out);

}  // namespace m3::tok
