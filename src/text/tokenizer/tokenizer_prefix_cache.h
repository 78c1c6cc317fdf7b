// Incremental tokenisation of shared prompt prefixes (docs/TEXT_TOKENIZER.md, "Prefix cache").
// Chat prompts of one conversation (agentic loops) repeat a long prefix; re-encoding it costs ~20 ms per
// 60k tokens. The cache keeps the ids of earlier texts at anchors (tok::anchor_cuts) and resumes the
// piece-by-piece encode (tok::encode_pieces) at the longest cached anchor that this text shares.
// Thread-safe; bounded by bytes with LRU eviction; entries are immutable once inserted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer/tokenizer_impl.h"

namespace m3::tok {

class PrefixCache {
 public:
  static constexpr size_t kAnchorSpacing = 16 * 1024;

  explicit PrefixCache(size_t budget_bytes) : budget_(budget_bytes) {}
  // Appends the ids of valid UTF-8 `text` (no post-processor) to `out`; id-exact with t.encode_into.
  void encode(const TokenizerImpl& t, std::string_view text, std::vector<int32_t>& out);

  struct Stats {
    uint64_t hits = 0, misses = 0, reused_tokens = 0, entries = 0, bytes = 0;
  };
  Stats stats() const;

  // Hash of each prefix text[0, cuts[i]) (length mixed in): the lookup key of an anchor.
  static std::vector<uint64_t> prefix_hashes(std::string_view text, const std::vector<size_t>& cuts);

 private:
  struct Entry {
    std::string text;             // text up to the last anchor
    std::vector<int32_t> ids;     // ids of `text`
    std::vector<PieceAnchor> anchors;
    size_t bytes = 0;
  };
  struct Slot {
    std::shared_ptr<const Entry> entry;
    size_t anchor = 0;
  };
  void insert(std::shared_ptr<Entry> e, const std::vector<uint64_t>& hashes);

  size_t budget_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<const Entry>> lru_;  // front: most recently used
  std::unordered_map<uint64_t, Slot> index_;     // prefix hash -> anchor (text is compared on a hit)
  size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace m3::tok
