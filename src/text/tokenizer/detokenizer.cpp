// Streaming detokenizer. Full decode cuts the ids into chunks at (non-skipped) added tokens, runs each
// chunk of model tokens through the decoder and inserts added tokens verbatim; the stream does the same
// incrementally and only holds back text that a later id could still change.
#include "text/tokenizer/detokenizer.h"

#include "text/tokenizer/tokenizer_impl.h"

namespace m3 {

namespace {

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens), byte_level_(tokenizer.impl().decoder_is_byte_level) {}

std::string IncrementalDetokenizer::push(int32_t id) { return byte_level_ ? push_byte_level(id) : push_generic(id); }

std::string IncrementalDetokenizer::push_byte_level(int32_t id) {
  const auto& t = tok_.impl();
  const std::string* tok = t.token_string(id, skip_special_);
  if (!tok) return "";
  tok::append_byte_level_bytes(*tok, pending_bytes_);
  // Lossy UTF-8 decoding is left to right, so everything before an unfinished (still completable)
  // sequence at the end is final.
  size_t keep = tok::utf8_incomplete_tail(pending_bytes_);
  std::string out = tok::utf8_lossy(std::string_view(pending_bytes_).substr(0, pending_bytes_.size() - keep));
  pending_bytes_.erase(0, pending_bytes_.size() - keep);
  return out;
}

std::string IncrementalDetokenizer::decode_window() const {
  const auto& t = tok_.impl();
  std::vector<std::string> toks;
  toks.reserve(window_.size());
  for (int32_t x : window_) toks.push_back(*t.token_string(x, false));
  return t.decode_chunk(toks);
}

std::string IncrementalDetokenizer::push_generic(int32_t id) {
  const auto& t = tok_.impl();
  const std::string* tokstr = t.token_string(id, skip_special_);
  if (!tokstr) return "";
  window_.push_back(id);
  // A byte-fallback run is decoded as a whole (all U+FFFD if invalid), so nothing is final inside it;
  // a trailing U+FFFD may still turn into a character.
  if (is_byte_token(*tokstr)) return "";
  std::string text = decode_window();
  if (ends_with_replacement(text) || text.size() < window_emitted_) return "";
  std::string out = text.substr(window_emitted_);
  window_emitted_ = text.size();
  // Keep only the last token as context: decoders treat the first token specially (Metaspace, Strip),
  // so the rest of the stream must not look like the start. Valid only if that token decodes to the
  // same text on its own.
  if (window_.size() > 1) {
    std::vector<int32_t> saved;
    saved.swap(window_);
    window_.push_back(saved.back());
    std::string ctx_text = decode_window();
    if (!ends_with_replacement(ctx_text) && text.size() >= ctx_text.size() &&
        text.compare(text.size() - ctx_text.size(), ctx_text.size(), ctx_text) == 0) {
      window_emitted_ = ctx_text.size();
    } else {
      window_.swap(saved);
    }
  }
  return out;
}

std::string IncrementalDetokenizer::flush() {
  if (byte_level_) {
    std::string out = tok::utf8_lossy(pending_bytes_);
    pending_bytes_.clear();
    return out;
  }
  std::string out;
  if (!window_.empty()) {
    std::string text = decode_window();
    if (text.size() > window_emitted_) out = text.substr(window_emitted_);
  }
  window_.clear();
  window_emitted_ = 0;
  return out;
}

}  // namespace m3
