// BPE model: vocab + ranked merges, byte fallback, unk, ignore_merges, and a per-thread word cache.
#include <algorithm>
#include <cstring>
#include <atomic>
#include <queue>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/error.h"
#include "text/tokenizer/tokenizer_impl.h"

namespace m3::tok {

namespace {

std::atomic<uint64_t> g_next_cache_tag{1};

// Word -> ids cache. Open addressing keyed by a 64-bit hash, keys and ids in arenas. Slots carry the
// generation they were written in, so clearing (when full, or when another tokenizer uses this thread's
// cache) is O(1); memory stays bounded for adversarial inputs.
class WordCache {
 public:
  bool get(uint64_t tag, std::string_view w, std::vector<int32_t>& out) {
    if (tag_ != tag) reset(tag);
    uint64_t h = XXH3_64bits_withSeed(w.data(), w.size(), tag);
    size_t i = h & (kSlots - 1);
    for (;;) {
      const Slot& s = slots_[i];
      if (s.gen != gen_) return false;
      if (s.hash == h && s.key_len == w.size() && std::memcmp(keys_.data() + s.key_off, w.data(), w.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
        return true;
      }
      i = (i + 1) & (kSlots - 1);
    }
  }
  void put(uint64_t tag, std::string_view w, const int32_t* ids, size_t n) {
    if (w.size() > 256) return;  // long words are rare and would fill the arena
    if (tag_ != tag || used_ * 2 >= kSlots || keys_.size() > (32u << 20)) reset(tag);
    uint64_t h = XXH3_64bits_withSeed(w.data(), w.size(), tag);
    size_t i = h & (kSlots - 1);
    while (slots_[i].gen == gen_) {
      if (slots_[i].hash == h && slots_[i].key_len == w.size() &&
          std::memcmp(keys_.data() + slots_[i].key_off, w.data(), w.size()) == 0)
        return;
      i = (i + 1) & (kSlots - 1);
    }
    slots_[i] = Slot{h, gen_, uint32_t(keys_.size()), uint32_t(w.size()), uint32_t(ids_.size()), uint32_t(n)};
    keys_.append(w);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }

 private:
  static constexpr size_t kSlots = 1 << 18;
  struct Slot {
    uint64_t hash = 0;
    uint32_t gen = 0;
    uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  void reset(uint64_t tag) {
    if (slots_.empty()) slots_.assign(kSlots, Slot{});
    tag_ = tag;
    if (++gen_ == 0) {  // generation wrapped: really clear
      std::fill(slots_.begin(), slots_.end(), Slot{});
      gen_ = 1;
    }
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }
  uint64_t tag_ = 0;
  uint32_t gen_ = 0;
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
};

WordCache& thread_cache() {
  thread_local WordCache cache;
  return cache;
}

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

std::string opt_string(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "";
  return j[key].get<std::string>();
}

}  // namespace

int32_t json_token_id(const json& v, std::string_view what, std::string_view name) {
  constexpr int64_t kMaxId = int64_t(1) << 24;
  if (v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t(kMaxId)
                             : !v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId)
    fail("tokenizer: {}{}{} must be an integer token id in [0, {}), got {}", what, name.empty() ? "" : " ",
         name.empty() ? std::string() : json(std::string(name)).dump(), kMaxId, v.dump());
  return int32_t(v.get<int64_t>());
}

void FlatStrMap::build(const std::unordered_map<std::string, int32_t>& m) {
  size_t cap = 16;
  while (cap < m.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  keys_.clear();
  for (auto& [k, v] : m) {
    uint64_t h = XXH3_64bits(k.data(), k.size());
    size_t i = h & mask_;
    while (slots_[i].len != ~0u) i = (i + 1) & mask_;
    slots_[i] = Slot{h, uint32_t(keys_.size()), uint32_t(k.size()), v};
    keys_.append(k);
  }
}

const int32_t* FlatStrMap::find(std::string_view key) const {
  if (slots_.empty()) return nullptr;
  uint64_t h = XXH3_64bits(key.data(), key.size());
  size_t i = h & mask_;
  for (;;) {
    const Slot& s = slots_[i];
    if (s.len == ~0u) return nullptr;
    if (s.hash == h && s.len == key.size() && std::memcmp(keys_.data() + s.off, key.data(), key.size()) == 0)
      return &s.value;
    i = (i + 1) & mask_;
  }
}

BpeModel::BpeModel(const json& m, bool byte_level) : byte_level_(byte_level), cache_tag_(g_next_cache_tag++) {
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    fail("tokenizer: BPE dropout is not supported");
  continuing_subword_prefix_ = opt_string(m, "continuing_subword_prefix");
  end_of_word_suffix_ = opt_string(m, "end_of_word_suffix");
  fuse_unk_ = m.value("fuse_unk", false);
  byte_fallback_ = m.value("byte_fallback", false);
  ignore_merges_ = m.value("ignore_merges", false);
  if (byte_level_ && (!continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty()))
    fail("tokenizer: BPE continuing_subword_prefix/end_of_word_suffix with a ByteLevel pre-tokenizer is not supported");

  const json& vocab = m.at("vocab");
  if (!vocab.is_object()) fail("tokenizer: model.vocab must be an object");
  vocab_.reserve(vocab.size() * 2);
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = json_token_id(it.value(), "the vocab id of", it.key());
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(size_t(max_id + 1), std::string());
  for (auto& [k, v] : vocab_) id_to_token_[size_t(v)] = k;

  const auto& table = ByteLevelTable::get();
  if (byte_level_) {
    // Re-key the vocabulary by raw bytes so words never need the printable-char mapping.
    word_vocab_.reserve(vocab_.size() * 2);
    for (auto& [k, v] : vocab_) {
      std::string raw;
      size_t i = 0;
      bool ok = true;
      while (i < k.size()) {
        if (!utf8_valid_len(k, i)) {
          ok = false;
          break;
        }
        auto f = table.cp_to_byte.find(utf8_next(k, i));
        if (f == table.cp_to_byte.end()) {
          ok = false;
          break;
        }
        raw += char(f->second);
      }
      if (ok) word_vocab_[raw] = v;
    }
    for (int b = 0; b < 256; ++b) {
      auto f = vocab_.find(table.byte_to_utf8[b]);
      byte_ids_[b] = f == vocab_.end() ? -1 : f->second;
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto f = vocab_.find(fmt::format("<0x{:02X}>", b));
    fallback_ids_[b] = f == vocab_.end() ? -1 : f->second;
  }
  word_lookup_.build(byte_level_ ? word_vocab_ : vocab_);
  std::string unk = opt_string(m, "unk_token");
  if (!unk.empty()) {
    auto f = vocab_.find(unk);
    if (f == vocab_.end()) fail("tokenizer: unk_token {:?} is not in the vocabulary", unk);
    unk_id_ = f->second;
  }

  // Merges: "a b" strings or [a, b] pairs; rank = position. A later duplicate overrides (HashMap collect).
  const json& merges = m.at("merges");
  size_t cap = 1;
  while (cap < merges.size() * 2 + 16) cap <<= 1;
  merges_.assign(cap, MergeEntry{~0ULL, 0, 0});
  merge_mask_ = cap - 1;
  int32_t rank = 0;
  for (auto& mj : merges) {
    std::string a, b;
    if (mj.is_string()) {
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) fail("tokenizer: bad merge {:?}", s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      fail("tokenizer: bad merge entry {}", mj.dump());
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end()) fail("tokenizer: merge {:?} {:?} uses a token not in the vocabulary", a, b);
    size_t plen = continuing_subword_prefix_.size();
    std::string merged = a + (b.compare(0, plen, continuing_subword_prefix_) == 0 ? b.substr(plen) : b);
    auto im = vocab_.find(merged);
    if (im == vocab_.end()) fail("tokenizer: merge result {:?} is not in the vocabulary", merged);
    uint64_t key = pair_key(ia->second, ib->second);
    size_t i = mix(key) & merge_mask_;
    while (merges_[i].key != ~0ULL && merges_[i].key != key) i = (i + 1) & merge_mask_;
    merges_[i] = MergeEntry{key, rank, im->second};
    ++rank;
  }
}

const BpeModel::MergeEntry* BpeModel::find_merge(int32_t left, int32_t right) const {
  uint64_t key = pair_key(left, right);
  size_t i = mix(key) & merge_mask_;
  for (;;) {
    const MergeEntry& e = merges_[i];
    if (e.key == key) return &e;
    if (e.key == ~0ULL) return nullptr;
    i = (i + 1) & merge_mask_;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || id_to_token_[size_t(id)].empty()) return nullptr;
  return &id_to_token_[size_t(id)];
}

void BpeModel::initial_symbols(std::string_view w, std::vector<int32_t>& syms) const {
  if (byte_level_) {
    for (unsigned char c : w) {
      int32_t id = byte_ids_[c];
      if (id >= 0) syms.push_back(id);
      else if (unk_id_) syms.push_back(*unk_id_);  // a byte missing from the vocabulary
    }
    return;
  }
  // Character mode (HF merge_word): prefix/suffix decorations, byte fallback, then unk (optionally fused).
  bool have_unk = false;
  size_t i = 0;
  std::string s;
  while (i < w.size()) {
    size_t st = i;
    size_t len = utf8_valid_len(w, i);
    i += len ? len : 1;
    bool first = st == 0, last = i >= w.size();
    s.clear();
    if (!first) s += continuing_subword_prefix_;
    s.append(w.data() + st, i - st);
    if (last) s += end_of_word_suffix_;
    if (const int32_t* f = word_lookup_.find(s)) {
      have_unk = false;
      syms.push_back(*f);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && fallback_ids_[c] >= 0;
      if (all) {
        have_unk = false;
        for (unsigned char c : s) syms.push_back(fallback_ids_[c]);
        continue;
      }
    }
    if (unk_id_) {
      if (!(have_unk && fuse_unk_)) syms.push_back(*unk_id_);
      have_unk = true;
    }
  }
}

void BpeModel::merge_symbols(std::vector<int32_t>& syms) const {
  size_t n = syms.size();
  if (n < 2) return;
  constexpr int32_t kNone = INT32_MAX;
  if (n <= 128) {
    // Small words: keep the rank of every adjacent pair and repeatedly merge the leftmost lowest rank.
    int32_t ranks[128];
    int32_t targets[128];
    for (size_t i = 0; i + 1 < n; ++i) {
      const MergeEntry* e = find_merge(syms[i], syms[i + 1]);
      ranks[i] = e ? e->rank : kNone;
      targets[i] = e ? e->new_id : -1;
    }
    for (;;) {
      int32_t best = kNone;
      size_t bi = 0;
      for (size_t i = 0; i + 1 < n; ++i)
        if (ranks[i] < best) {
          best = ranks[i];
          bi = i;
        }
      if (best == kNone) break;
      syms[bi] = targets[bi];
      // Remove symbol bi+1 and the pair (bi+1, bi+2).
      for (size_t k = bi + 1; k + 1 < n; ++k) syms[k] = syms[k + 1];
      for (size_t k = bi + 1; k + 2 < n; ++k) {
        ranks[k] = ranks[k + 1];
        targets[k] = targets[k + 1];
      }
      --n;
      auto refresh = [&](size_t i) {
        const MergeEntry* e = find_merge(syms[i], syms[i + 1]);
        ranks[i] = e ? e->rank : kNone;
        targets[i] = e ? e->new_id : -1;
      };
      if (bi > 0) refresh(bi - 1);
      if (bi + 1 < n) refresh(bi);
    }
    syms.resize(n);
    return;
  }
  // Long words: doubly linked symbols + a min-heap of (rank, position), stale entries skipped (HF word.rs).
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  }
  using Item = std::tuple<int32_t, int32_t, int32_t>;  // rank, pos, new_id
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (size_t i = 0; i + 1 < n; ++i)
    if (const MergeEntry* e = find_merge(syms[i], syms[i + 1])) heap.emplace(e->rank, int32_t(i), e->new_id);
  while (!heap.empty()) {
    auto [rank, pos, new_id] = heap.top();
    heap.pop();
    if (!alive[size_t(pos)] || next[size_t(pos)] < 0) continue;
    int32_t r = next[size_t(pos)];
    const MergeEntry* e = find_merge(syms[size_t(pos)], syms[size_t(r)]);
    if (!e || e->new_id != new_id) continue;
    syms[size_t(pos)] = new_id;
    alive[size_t(r)] = false;
    next[size_t(pos)] = next[size_t(r)];
    if (next[size_t(r)] >= 0) prev[size_t(next[size_t(r)])] = pos;
    if (prev[size_t(pos)] >= 0) {
      int32_t p = prev[size_t(pos)];
      if (const MergeEntry* pe = find_merge(syms[size_t(p)], syms[size_t(pos)])) heap.emplace(pe->rank, p, pe->new_id);
    }
    if (next[size_t(pos)] >= 0) {
      int32_t q = next[size_t(pos)];
      if (const MergeEntry* ne = find_merge(syms[size_t(pos)], syms[size_t(q)])) heap.emplace(ne->rank, pos, ne->new_id);
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) syms[k++] = syms[i];
  syms.resize(k);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (byte_level_ && word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  auto& cache = thread_cache();
  if (cache.get(cache_tag_, word, out)) return;
  if (ignore_merges_) {
    if (const int32_t* id = word_lookup_.find(word)) {
      out.push_back(*id);
      cache.put(cache_tag_, word, id, 1);
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  syms.clear();
  initial_symbols(word, syms);
  merge_symbols(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  cache.put(cache_tag_, word, syms.data(), syms.size());
}

}  // namespace m3::tok
