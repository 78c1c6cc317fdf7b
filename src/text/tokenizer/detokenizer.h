// Streaming detokenizer: feed generated ids one at a time, get the text that became final.
// Guarantees: the concatenation of every push() and the final flush() equals
// Tokenizer::decode(all ids, skip_special_tokens), and no piece ever ends inside a UTF-8 sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace m3 {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string push(int32_t id);  // text that became final with this id (may be "")
  std::string flush();           // at end of stream: whatever is still held back

 private:
  std::string push_byte_level(int32_t id);
  std::string push_generic(int32_t id);
  std::string decode_window() const;

  Tokenizer tok_;
  bool skip_special_;
  bool byte_level_;            // decoder is exactly ByteLevel: stream raw bytes
  std::string pending_bytes_;  // byte-level path: bytes not yet emitted (an unfinished UTF-8 sequence)
  std::vector<int32_t> window_;  // generic path: ids of the current chunk still needed as context
  size_t window_emitted_ = 0;    // generic path: bytes of decode(window_) already emitted
};

}  // namespace m3
