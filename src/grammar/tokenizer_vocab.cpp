#include "grammar/tokenizer_vocab.h"

#include <algorithm>

#include "text/tokenizer/tokenizer_impl.h"

namespace m3::grammar {

std::shared_ptr<const TokenVocab> vocab_from_tokenizer(const Tokenizer& tok, int32_t size, int32_t eos,
                                                       const std::vector<std::string>& text_added) {
  const size_t n = std::min<size_t>(tok.vocab_size(), size_t(size));
  std::vector<std::string> bytes(n);
  std::vector<uint8_t> usable(n, 0);
  const bool byte_level = tok.impl().decoder_is_byte_level;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    const std::string piece = tok.id_to_token(id);
    if (piece.empty()) continue;
    if (tok.is_added(id) || tok.is_special(id)) {
      bytes[i] = piece;  // kept for reasoning-marker detection; allowed only when it stands for its text
      usable[i] = std::find(text_added.begin(), text_added.end(), piece) != text_added.end();
      continue;
    }
    if (byte_level) {
      tok::append_byte_level_bytes(piece, bytes[i]);
    } else {
      const int32_t one[1] = {id};
      bytes[i] = tok.decode(one, false);  // generic decoders: the token's text (partial characters are lost)
    }
    usable[i] = !bytes[i].empty();
  }
  return std::make_shared<const TokenVocab>(std::move(bytes), std::move(usable), eos, size);
}

}  // namespace m3::grammar
