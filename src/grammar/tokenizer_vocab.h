// A TokenVocab (grammar/grammar.h) from a tokenizer: the bytes each id decodes to (byte-level BPE: the raw bytes of
// the token, even when they are part of a UTF-8 character), special and added tokens marked unusable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "text/tokenizer/tokenizer.h"

namespace m3::grammar {

// size: the logits width (the model's vocab_size, ≥ the tokenizer's); eos: the model's EOS id (−1: none).
// text_added: added tokens that stand for their text and may be generated where the grammar wants that text (M3's
// namespace marker `]<]minimax[>[`, if the tokenizer has it as one token); other added / special tokens never.
std::shared_ptr<const TokenVocab> vocab_from_tokenizer(const Tokenizer& tok, int32_t size, int32_t eos,
                                                       const std::vector<std::string>& text_added = {});

}  // namespace m3::grammar
