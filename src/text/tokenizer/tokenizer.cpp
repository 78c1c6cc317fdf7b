// Tokenizer: loads tokenizer.json, runs the encode pipeline (added tokens, normalizer, pre-tokenizers,
// BPE, post-processor) and decode (added tokens verbatim, model tokens through the decoder).
#include "text/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>

#include "base/error.h"
#include "base/thread_pool.h"
#include "text/tokenizer/tokenizer_impl.h"
#include "text/tokenizer/tokenizer_prefix_cache.h"

namespace m3 {

namespace tok {

// ------------------------------------------------------------------ literal matcher (added tokens)

int32_t LiteralMatcher::child(int32_t node, uint8_t b) const {
  const auto& nx = nodes_[size_t(node)].next;
  auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(b, INT32_MIN));
  return it != nx.end() && it->first == b ? it->second : -1;
}

void LiteralMatcher::build(const std::vector<std::pair<std::string, int32_t>>& patterns) {
  nodes_.assign(1, Node{});
  first_byte_.fill(false);
  for (auto& [s, id] : patterns) {
    if (s.empty()) continue;
    int32_t cur = 0;
    for (unsigned char c : s) {
      int32_t nx = child(cur, c);
      if (nx < 0) {
        nx = int32_t(nodes_.size());
        nodes_.emplace_back();
        auto& v = nodes_[size_t(cur)].next;
        v.insert(std::lower_bound(v.begin(), v.end(), std::make_pair(c, INT32_MIN)), {c, nx});
      }
      cur = nx;
    }
    // First pattern with a given content wins (HF keeps one id per content).
    if (nodes_[size_t(cur)].id < 0) nodes_[size_t(cur)].id = id;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
  }
}

bool LiteralMatcher::find(std::string_view s, size_t from, size_t& start, size_t& end, int32_t& id) const {
  if (empty()) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = from; i < s.size(); ++i) {
    if (!first_byte_[p[i]]) continue;
    int32_t cur = 0;
    int32_t best_id = -1;
    size_t best_end = 0;
    for (size_t j = i; j < s.size(); ++j) {
      cur = child(cur, p[j]);
      if (cur < 0) break;
      if (nodes_[size_t(cur)].id >= 0) {
        best_id = nodes_[size_t(cur)].id;
        best_end = j + 1;
      }
    }
    if (best_id >= 0) {
      start = i;
      end = best_end;
      id = best_id;
      return true;
    }
  }
  return false;
}

namespace {

struct Split {
  size_t a, b;
  int32_t id;  // -1: plain text
};

uint32_t last_cp(std::string_view s) {
  size_t st = s.size() - 1;
  while (st > 0 && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
  return utf8_next(s, st);
}

// HF AddedVocabulary::find_matches: cuts `s` on added tokens, honouring single_word/lstrip/rstrip.
void find_added(const TokenizerImpl& t, const LiteralMatcher& m, std::string_view s, std::vector<Split>& out) {
  size_t start_offset = 0, pos = 0, a, b;
  int32_t id;
  while (pos < s.size() && m.find(s, pos, a, b, id)) {
    pos = b;
    const AddedToken* tok = t.added_token(id);
    size_t start = a, stop = b;
    if (tok->single_word) {
      bool start_space = start == 0 || !is_unicode_alnum_word(last_cp(s.substr(0, start)));
      size_t k = stop;
      bool stop_space = stop == s.size() || !is_unicode_alnum_word(utf8_next(s, k));
      if (!start_space || !stop_space) continue;
    }
    if (tok->lstrip) {
      size_t ns = start;
      while (ns > 0) {
        std::string_view pre = s.substr(0, ns);
        uint32_t cp = last_cp(pre);
        if (!is_unicode_whitespace(cp)) break;
        size_t st = ns - 1;
        while (st > 0 && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
        ns = st;
      }
      start = std::max(ns, start_offset);
    }
    if (tok->rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!is_unicode_whitespace(utf8_next(s, k))) break;
        stop = k;
      }
    }
    start = std::max(start, start_offset);
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("tokenizer: cannot open {:?}", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void parse_post_processor(const json& j, const TokenizerImpl& t, PostProcessor& post) {
  if (j.is_null()) return;
  std::string type = j.at("type").get<std::string>();
  auto id_of = [&](const std::string& tok) -> int32_t {
    auto it = t.added_by_content.find(tok);
    if (it != t.added_by_content.end()) return it->second;
    if (auto id = t.model->token_to_id(tok)) return *id;
    fail("tokenizer: post_processor token {:?} is not in the vocabulary", tok);
  };
  if (type == "ByteLevel") return;  // only trims offsets
  if (type == "Sequence") {
    for (auto& p : j.at("processors")) parse_post_processor(p, t, post);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = j.at("single");
    const json& specials = j.value("special_tokens", json::object());
    bool seen_seq = false;
    for (auto& piece : single) {
      if (piece.contains("Sequence")) {
        seen_seq = true;
        continue;
      }
      std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      std::vector<int32_t> ids;
      if (specials.contains(name)) {
        for (auto& x : specials[name].at("ids")) ids.push_back(json_token_id(x, "the post_processor id of", name));
      } else {
        ids.push_back(id_of(name));
      }
      auto& dst = seen_seq ? post.suffix : post.prefix;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    post.prefix.push_back(json_token_id(j.at("cls").at(1), "post_processor.cls's id"));
    post.suffix.push_back(json_token_id(j.at("sep").at(1), "post_processor.sep's id"));
    return;
  }
  fail("tokenizer: unsupported post_processor type \"{}\"", type);
}

void flatten_pre(const json& j, std::vector<std::unique_ptr<PreTokenizer>>& out) {
  if (j.is_null()) return;
  if (j.is_object() && j.value("type", "") == "Sequence") {
    for (auto& p : j.at("pretokenizers")) flatten_pre(p, out);
    return;
  }
  out.push_back(make_pre_tokenizer(j));
}

}  // namespace

// ------------------------------------------------------------------ encode

void TokenizerImpl::encode_normalized(std::string_view s, bool first_piece, std::vector<int32_t>& out) const {
  if (s.empty()) return;
  std::deque<std::string> storage;
  Words a{{s}, &storage}, b{{}, &storage};
  for (auto& p : pre_tokenizers) {
    b.views.clear();
    p->apply(a, b, first_piece ? s.data() : nullptr);
    std::swap(a.views, b.views);
  }
  for (auto w : a.views) model->encode_word(w, out);
}

void TokenizerImpl::encode_segment(std::string_view piece, bool first_piece, std::vector<int32_t>& out) const {
  std::string norm;
  std::string_view s = piece;
  if (normalizer) {
    norm.assign(piece);
    normalizer->apply(norm);
    s = norm;
  }
  if (normalized_matcher.empty()) {
    encode_normalized(s, first_piece, out);
    return;
  }
  std::vector<Split> splits;
  find_added(*this, normalized_matcher, s, splits);
  for (auto& sp : splits) {
    if (sp.id >= 0) out.push_back(sp.id);
    else encode_normalized(s.substr(sp.a, sp.b - sp.a), first_piece && sp.a == 0, out);
  }
}

void TokenizerImpl::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  if (raw_matcher.empty()) {
    encode_segment(text, true, out);
    return;
  }
  std::vector<Split> splits;
  find_added(*this, raw_matcher, text, splits);
  for (auto& sp : splits) {
    if (sp.id >= 0) out.push_back(sp.id);
    else encode_segment(text.substr(sp.a, sp.b - sp.a), sp.a == 0, out);
  }
}

// ------------------------------------------------------------------ decode

std::string TokenizerImpl::decode_chunk(std::vector<std::string>& tokens) const {
  if (tokens.empty()) return "";
  if (!decoder) {
    std::string s;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) s += ' ';
      s += tokens[i];
    }
    return s;
  }
  decoder->decode_chain(tokens);
  std::string s;
  for (auto& t : tokens) s += t;
  return s;
}

const std::string* TokenizerImpl::token_string(int32_t id, bool skip_special) const {
  if (const AddedToken* a = added_token(id)) return skip_special && a->special ? nullptr : &a->content;
  return model->id_to_token(id);
}

void append_byte_level_bytes(const std::string& token, std::string& out) {
  // ByteLevel decoder: chars map back to bytes; a token with any char outside the table keeps its UTF-8.
  const auto& table = ByteLevelTable::get();
  size_t start = out.size(), i = 0;
  while (i < token.size()) {
    auto it = table.cp_to_byte.find(utf8_next(token, i));
    if (it == table.cp_to_byte.end()) {
      out.resize(start);
      out += token;
      return;
    }
    out += char(it->second);
  }
}

// ------------------------------------------------------------------ parallel encode

namespace {

// Cut points for parallel encoding: just after a '\n' that is followed by an ASCII letter, near evenly
// spaced targets. Whether HF really splits there is verified afterwards with the first pre-tokenizer.
std::vector<size_t> candidate_cuts(std::string_view s, size_t parts) {
  std::vector<size_t> cuts{0};
  for (size_t k = 1; k < parts; ++k) {
    size_t target = s.size() * k / parts;
    if (target <= cuts.back()) continue;
    size_t c = cut_after(s, target);
    if (c == std::string_view::npos) break;
    cuts.push_back(c);
  }
  cuts.push_back(s.size());
  return cuts;
}

}  // namespace

size_t cut_after(std::string_view s, size_t target) {
  size_t p = s.find('\n', target);
  while (p != std::string_view::npos && p + 1 < s.size()) {
    char c = s[p + 1];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return p + 1;
    p = s.find('\n', p + 1);
  }
  return std::string_view::npos;
}

std::vector<size_t> anchor_cuts(std::string_view s, size_t spacing) {
  std::vector<size_t> cuts;
  for (size_t k = 1; k * spacing < s.size();) {
    size_t c = cut_after(s, k * spacing);
    if (c == std::string_view::npos) break;
    cuts.push_back(c);
    k = (c - 1) / spacing + 1;  // every target in [k*spacing, c-1] finds this same cut
  }
  return cuts;
}

}  // namespace tok

using tok::json;
using tok::TokenizerImpl;

namespace {

const tok::Regex* first_stage_regex(const TokenizerImpl& t) {
  if (t.pre_tokenizers.empty()) return nullptr;
  if (auto* rs = dynamic_cast<const tok::RegexSplit*>(t.pre_tokenizers[0].get())) return rs->regex();
  if (auto* bl = dynamic_cast<const tok::ByteLevelPre*>(t.pre_tokenizers[0].get())) return bl->regex();
  return nullptr;
}

// Encodes [cut_a, cut_b) of the normalized text `s` assuming cut_a is a word boundary of the serial
// first-stage split; returns false if cut_b turns out not to be one (the caller then goes serial).
bool encode_range(const TokenizerImpl& t, std::string_view s, size_t cut_a, size_t cut_b, std::vector<int32_t>& out) {
  const tok::Regex* re = first_stage_regex(t);
  std::deque<std::string> storage;
  tok::Words a{{}, &storage}, b{{}, &storage};
  // The serial split has a boundary at cut_b iff a match ends or starts exactly there.
  size_t prev = cut_a, pos = cut_a, ms = 0, me = 0;
  bool found_next = false;
  while (pos < s.size() && re->match(s, pos, ms, me)) {
    if (ms >= cut_b) {
      found_next = true;
      break;
    }
    if (me > cut_b) return false;  // a match straddles the cut
    if (prev < ms) a.views.push_back(s.substr(prev, ms - prev));
    if (me > ms) a.views.push_back(s.substr(ms, me - ms));
    prev = me;
    if (me == ms) {
      if (me >= s.size()) break;
      size_t k = me;
      tok::utf8_next(s, k);
      pos = k;
    } else {
      pos = me;
    }
  }
  if (prev < cut_b) {
    // A gap runs up to the cut: fine only when the next match starts at the cut or the text ends there.
    bool ends_at_cut = cut_b == s.size() || (found_next && ms == cut_b);
    if (!ends_at_cut) return false;
    a.views.push_back(s.substr(prev, cut_b - prev));
  }
  for (size_t i = 1; i < t.pre_tokenizers.size(); ++i) {
    b.views.clear();
    t.pre_tokenizers[i]->apply(a, b, nullptr);
    std::swap(a.views, b.views);
  }
  for (auto w : a.views) t.model->encode_word(w, out);
  return true;
}

}  // namespace

namespace tok {

bool encode_pieces(const TokenizerImpl& t, std::string_view text, const std::vector<size_t>& cuts,
                   const PieceAnchor* resume, std::vector<int32_t>& out, std::vector<PieceAnchor>& anchors) {
  // Same structure as encode_into for a tokenizer without a normalizer
  // (prefix_cache_ok): added tokens are cut out, every text split is encoded range by range with
  // encode_range, which proves each anchor is a word boundary of the serial split.
  std::vector<Split> raw, splits;
  if (t.raw_matcher.empty()) raw.push_back({0, text.size(), -1});
  else find_added(t, t.raw_matcher, text, raw);
  // Without a normalizer, the normalized added tokens are cut out of each raw text split in place
  // (encode_segment's second cut), so one flat list of splits in text offsets describes the encode.
  for (const Split& r : raw) {
    if (r.id >= 0 || t.normalized_matcher.empty()) {
      splits.push_back(r);
      continue;
    }
    std::vector<Split> sub;
    find_added(t, t.normalized_matcher, text.substr(r.a, r.b - r.a), sub);
    for (const Split& x : sub) splits.push_back({x.a + r.a, x.b + r.a, x.id});
  }
  size_t si = 0, ci = 0;
  if (resume) {
    while (si < splits.size() && splits[si].b <= resume->pos) ++si;
    if (si == splits.size() || splits[si].id >= 0 || splits[si].a > resume->prev_pos) return false;
    ci = size_t(std::lower_bound(cuts.begin(), cuts.end(), resume->pos) - cuts.begin());
    if (ci == cuts.size() || cuts[ci] != resume->pos) return false;
  }
  for (; si < splits.size(); ++si) {
    const Split& sp = splits[si];
    if (sp.id >= 0) {
      out.push_back(sp.id);
      continue;
    }
    std::string_view seg = text.substr(sp.a, sp.b - sp.a);
    size_t b0 = resume && resume->pos > sp.a && resume->pos < sp.b ? resume->prev_pos : sp.a;
    while (ci < cuts.size() && cuts[ci] <= b0) ++ci;
    for (; ci < cuts.size() && cuts[ci] < sp.b; ++ci) {
      size_t c = cuts[ci], mark = out.size();
      if (encode_range(t, seg, b0 - sp.a, c - sp.a, out)) {
        anchors.push_back({c, out.size(), b0, mark});
        b0 = c;
      }
      // else: not a boundary of this text (for the resume anchor: the new continuation changed the split);
      // the piece simply extends from the last verified boundary b0.
    }
    if (!encode_range(t, seg, b0 - sp.a, seg.size(), out)) return false;
  }
  return true;
}

}  // namespace tok

namespace {

// Encodes one normalized segment (no added tokens inside) on the thread pool; false -> do it serially.
bool encode_parallel_segment(const TokenizerImpl& t, std::string_view s, std::vector<int32_t>& out) {
  // ThreadPool::parallel_for runs one job at a time and is not safe for concurrent callers: a second
  // encode arriving while one is on the pool runs serially instead.
  static std::mutex pool_mu;
  std::unique_lock<std::mutex> lock(pool_mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  auto& pool = ThreadPool::global();
  auto cuts = tok::candidate_cuts(s, size_t(pool.size()) * 8);  // small parts balance uneven text
  size_t parts = cuts.size() - 1;
  if (parts < 2) return false;
  std::vector<std::vector<int32_t>> results(parts);
  std::vector<char> ok(parts, 0);
  pool.parallel_for(int64_t(parts), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) ok[size_t(k)] = encode_range(t, s, cuts[size_t(k)], cuts[size_t(k) + 1], results[size_t(k)]);
  });
  if (!std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; })) return false;
  for (auto& r : results) out.insert(out.end(), r.begin(), r.end());
  return true;
}

void encode_segment_maybe_parallel(const TokenizerImpl& t, std::string_view piece, bool first_piece,
                                   std::vector<int32_t>& out) {
  constexpr size_t kParallelMin = 128 * 1024;
  if (piece.size() < kParallelMin) {
    t.encode_segment(piece, first_piece, out);
    return;
  }
  std::string norm;
  std::string_view s = piece;
  if (t.normalizer) {
    norm.assign(piece);
    t.normalizer->apply(norm);
    s = norm;
  }
  std::vector<tok::Split> splits;
  if (t.normalized_matcher.empty()) splits.push_back({0, s.size(), -1});
  else tok::find_added(t, t.normalized_matcher, s, splits);
  for (auto& sp : splits) {
    if (sp.id >= 0) {
      out.push_back(sp.id);
      continue;
    }
    std::string_view sub = s.substr(sp.a, sp.b - sp.a);
    size_t mark = out.size();
    if (sub.size() >= kParallelMin && encode_parallel_segment(t, sub, out)) continue;
    out.resize(mark);
    t.encode_normalized(sub, first_piece && sp.a == 0, out);
  }
}

// Startup check of piece-by-piece encoding on a text dense in cut points next to added tokens, digits,
// whitespace runs and non-ASCII letters: the full encode, and a resume from every anchor into a changed
// suffix, must give the serial ids. Any difference (or no verified anchor) disables the prefix cache.
bool prefix_self_check(const TokenizerImpl& t) {
  std::string text = "Hello world\nThe  quick\n\nbrown fox's\n  jumps\r\nOver 12345\nlazy\tdogs\n"
                     "caf\xc3\xa9\n\xc3\xa9t\xc3\xa9\nZebra \xe4\xb8\xad\xe6\x96\x87\nx\n";
  size_t n_added = 0;
  for (auto& a : t.added) {
    if (n_added++ >= 8) break;
    text += a.content + "\nA " + a.content + "B\n" + a.content + "\n\nc ";
  }
  text += "\nend\n";
  try {
    std::vector<int32_t> want;
    t.encode_into(text, want);
    auto cuts = tok::anchor_cuts(text, 5);
    std::vector<int32_t> got;
    std::vector<tok::PieceAnchor> anchors;
    if (!tok::encode_pieces(t, text, cuts, nullptr, got, anchors) || got != want) return false;
    // No verified anchor: the first pre-tokenizer never splits at "\n"+letter (DeepSeek-V3 splits
    // digits first), so the cache could never resume and would only cost the extra scans.
    if (anchors.empty()) return false;
    for (auto& a : anchors) {
      std::string other = text.substr(0, a.pos) + "Different tail\n  x";
      std::vector<int32_t> want2, got2(want.begin(), want.begin() + ptrdiff_t(a.prev_ntok));
      t.encode_into(other, want2);
      auto cuts2 = tok::anchor_cuts(other, 5);
      std::vector<tok::PieceAnchor> anchors2;
      if (tok::encode_pieces(t, other, cuts2, &a, got2, anchors2) && got2 != want2) return false;
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// Input text must be valid UTF-8 for the regex engine; invalid bytes become U+FFFD (HF only accepts str).
std::string_view valid_utf8(std::string_view text, std::string& storage) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = tok::utf8_valid_len(text, i);
    if (!n) {
      storage = tok::utf8_lossy(text);
      return storage;
    }
    i += n;
  }
  return text;
}

}  // namespace

// ------------------------------------------------------------------ loading

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string text = tok::read_file(path);
  try {
    return from_json(text);
  } catch (const Error& e) {
    fail("{} (in {})", e.what(), path);
  }
}

Tokenizer Tokenizer::from_json(const std::string& json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("tokenizer: invalid JSON: {}", e.what());
  }
  auto impl = std::make_shared<TokenizerImpl>();
  try {
    if (!j.is_object()) fail("tokenizer: top level must be an object");
    const json& model = j.at("model");
    std::string mtype = model.value("type", std::string("BPE"));
    if (mtype != "BPE") fail("tokenizer: unsupported model type \"{}\" (only BPE)", mtype);

    impl->normalizer = tok::make_normalizer(j.value("normalizer", json()));
    tok::flatten_pre(j.value("pre_tokenizer", json()), impl->pre_tokenizers);
    for (size_t i = 0; i < impl->pre_tokenizers.size(); ++i) {
      if (dynamic_cast<const tok::ByteLevelPre*>(impl->pre_tokenizers[i].get())) {
        if (i + 1 != impl->pre_tokenizers.size())
          fail("tokenizer: a ByteLevel pre-tokenizer followed by {} is not supported", impl->pre_tokenizers[i + 1]->name());
        impl->byte_level = true;
      }
    }
    impl->model = std::make_unique<tok::BpeModel>(model, impl->byte_level);
    impl->decoder = tok::make_decoder(j.value("decoder", json()));
    impl->decoder_is_byte_level = impl->decoder && std::string(impl->decoder->name()) == "ByteLevel";
    impl->max_id = impl->model->max_id();

    for (auto& a : j.value("added_tokens", json::array())) {
      tok::AddedToken t;
      t.content = a.at("content").get<std::string>();
      t.id = tok::json_token_id(a.at("id"), "the id of added token", t.content);
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", !a.value("special", false));
      t.special = a.value("special", false);
      if (t.content.empty()) continue;
      impl->added_by_id[t.id] = impl->added.size();
      impl->added_by_content.emplace(t.content, t.id);
      impl->max_id = std::max(impl->max_id, t.id);
      impl->added.push_back(std::move(t));
    }
    // HF orders the matchers: special tokens first, then the others, each in file order.
    std::vector<std::pair<std::string, int32_t>> raw, norm;
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& t : impl->added) {
        if (t.special != (pass == 0)) continue;
        if (t.normalized) {
          std::string c = t.content;
          if (impl->normalizer) impl->normalizer->apply(c);
          norm.emplace_back(c, t.id);
        } else {
          raw.emplace_back(t.content, t.id);
        }
      }
    }
    impl->raw_matcher.build(raw);
    impl->normalized_matcher.build(norm);
    tok::parse_post_processor(j.value("post_processor", json()), *impl, impl->post);

    // Parallel encode needs a first pre-tokenizer that splits with a regex (verified cut points), a
    // normalizer that is local, and no component that depends on being at the start of the text.
    bool ok = first_stage_regex(*impl) != nullptr && (!impl->normalizer || impl->normalizer->is_local());
    if (auto* rs = impl->pre_tokenizers.empty() ? nullptr : dynamic_cast<const tok::RegexSplit*>(impl->pre_tokenizers[0].get()))
      ok = ok && rs->isolated_not_inverted();
    if (auto* bl = impl->pre_tokenizers.empty() ? nullptr : dynamic_cast<const tok::ByteLevelPre*>(impl->pre_tokenizers[0].get()))
      ok = ok && !bl->add_prefix_space();
    for (auto& p : impl->pre_tokenizers) ok = ok && std::string(p->name()) != "Metaspace";
    impl->parallel_ok = ok;
    impl->prefix_cache_ok = ok && !impl->normalizer && prefix_self_check(*impl);
    if (impl->prefix_cache_ok) impl->prefix_cache = std::make_shared<tok::PrefixCache>(size_t(256) << 20);
  } catch (const json::exception& e) {
    fail("tokenizer: malformed tokenizer.json: {}", e.what());
  }
  return Tokenizer(std::move(impl));
}

// ------------------------------------------------------------------ public API

std::vector<int32_t> Tokenizer::encode_serial(std::string_view text, bool add_special_tokens) const {
  std::string fixed;
  text = valid_utf8(text, fixed);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), impl_->post.prefix.begin(), impl_->post.prefix.end());
  impl_->encode_into(text, out);
  if (add_special_tokens) out.insert(out.end(), impl_->post.suffix.begin(), impl_->post.suffix.end());
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  constexpr size_t kParallelMin = 256 * 1024;
  if (text.size() < kParallelMin || !impl_->parallel_ok || ThreadPool::global().size() < 2)
    return encode_serial(text, add_special_tokens);
  std::string fixed;
  text = valid_utf8(text, fixed);
  const TokenizerImpl& t = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), t.post.prefix.begin(), t.post.prefix.end());
  std::vector<tok::Split> splits;
  if (t.raw_matcher.empty()) splits.push_back({0, text.size(), -1});
  else tok::find_added(t, t.raw_matcher, text, splits);
  for (auto& sp : splits) {
    if (sp.id >= 0) out.push_back(sp.id);
    else encode_segment_maybe_parallel(t, text.substr(sp.a, sp.b - sp.a), sp.a == 0, out);
  }
  if (add_special_tokens) out.insert(out.end(), t.post.suffix.begin(), t.post.suffix.end());
  return out;
}

bool Tokenizer::prefix_cache_enabled() const { return impl_->prefix_cache_ok; }

std::vector<int32_t> Tokenizer::encode_cached(std::string_view text, bool add_special_tokens) const {
  // Short texts have no anchor (and nothing worth caching).
  if (!impl_->prefix_cache_ok || text.size() < 2 * tok::PrefixCache::kAnchorSpacing)
    return encode(text, add_special_tokens);
  std::string fixed;
  text = valid_utf8(text, fixed);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out.insert(out.end(), impl_->post.prefix.begin(), impl_->post.prefix.end());
  impl_->prefix_cache->encode(*impl_, text, out);
  if (add_special_tokens) out.insert(out.end(), impl_->post.suffix.begin(), impl_->post.suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  // HF: every id becomes its token string (added tokens: their content; skipped: special tokens when
  // asked; unknown ids: dropped) and the whole list goes through the decoder.
  const TokenizerImpl& t = *impl_;
  if (t.decoder_is_byte_level) {
    std::string bytes;
    for (int32_t id : ids)
      if (const std::string* s = t.token_string(id, skip_special_tokens)) tok::append_byte_level_bytes(*s, bytes);
    return tok::utf8_lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids)
    if (const std::string* s = t.token_string(id, skip_special_tokens)) tokens.push_back(*s);
  return t.decode_chunk(tokens);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const tok::AddedToken* a = impl_->added_token(id)) return a->content;
  const std::string* s = impl_->model->id_to_token(id);
  return s ? *s : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  const tok::AddedToken* a = impl_->added_token(id);
  return a && a->special;
}

bool Tokenizer::is_added(int32_t id) const { return impl_->added_token(id) != nullptr; }

size_t Tokenizer::vocab_size() const { return size_t(impl_->max_id + 1); }

}  // namespace m3
