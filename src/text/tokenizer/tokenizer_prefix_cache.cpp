#include "text/tokenizer/tokenizer_prefix_cache.h"

#include <algorithm>
#include <cstring>

namespace m3::tok {

namespace {

inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

}  // namespace

std::vector<uint64_t> PrefixCache::prefix_hashes(std::string_view text, const std::vector<size_t>& cuts) {
  // 8-byte words at absolute offsets, so the hash of text[0, c) does not depend on the other cuts.
  std::vector<uint64_t> out;
  out.reserve(cuts.size());
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  size_t pos = 0;
  for (size_t c : cuts) {
    for (; pos + 8 <= c; pos += 8) {
      uint64_t w;
      std::memcpy(&w, text.data() + pos, 8);
      h = (h ^ w) * 0x100000001b3ULL + 0x632be59bd9b4e019ULL;
      h = (h << 29) | (h >> 35);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, text.data() + pos, c - pos);
    out.push_back(mix(h ^ mix(tail ^ (uint64_t(c) << 3))));
  }
  return out;
}

void PrefixCache::encode(const TokenizerImpl& t, std::string_view text, std::vector<int32_t>& out) {
  std::vector<size_t> cuts = anchor_cuts(text, kAnchorSpacing);
  if (cuts.empty()) {
    t.encode_into(text, out);
    return;
  }
  std::vector<uint64_t> hashes = prefix_hashes(text, cuts);
  std::shared_ptr<const Entry> hit;
  size_t hit_anchor = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = cuts.size(); i-- > 0;) {
      auto it = index_.find(hashes[i]);
      if (it == index_.end()) continue;
      const Entry& e = *it->second.entry;
      // The hash picks the candidate; only the byte comparison below makes it a hit.
      if (e.anchors[it->second.anchor].pos != cuts[i]) continue;
      hit = it->second.entry;
      hit_anchor = it->second.anchor;
      for (auto l = lru_.begin(); l != lru_.end(); ++l)
        if (*l == hit) {
          lru_.splice(lru_.begin(), lru_, l);
          break;
        }
      break;
    }
  }
  const size_t base = out.size();
  std::vector<PieceAnchor> anchors;
  bool done = false;
  if (hit && std::memcmp(hit->text.data(), text.data(), hit->anchors[hit_anchor].pos) == 0) {
    const PieceAnchor& a = hit->anchors[hit_anchor];
    out.insert(out.end(), hit->ids.begin(), hit->ids.begin() + ptrdiff_t(a.prev_ntok));
    anchors.assign(hit->anchors.begin(), hit->anchors.begin() + ptrdiff_t(hit_anchor));
    // Anchor token counts are relative to the start of this text's ids.
    std::vector<int32_t> rest(out.begin() + ptrdiff_t(base), out.end());
    done = encode_pieces(t, text, cuts, &a, rest, anchors);
    if (done) {
      out.resize(base);
      out.insert(out.end(), rest.begin(), rest.end());
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (done) {
      ++stats_.hits;
      stats_.reused_tokens += a.prev_ntok;
    }
  } else {
    hit.reset();
  }
  if (!done) {
    out.resize(base);
    anchors.clear();
    std::vector<int32_t> ids;
    if (!encode_pieces(t, text, cuts, nullptr, ids, anchors)) {
      t.encode_into(text, out);
      return;
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.misses;
    hit.reset();
  }
  if (anchors.empty() || (hit && anchors.size() <= hit_anchor + 1)) return;  // nothing new to remember
  auto e = std::make_shared<Entry>();
  const PieceAnchor& last = anchors.back();
  e->text.assign(text.substr(0, last.pos));
  e->ids.assign(out.begin() + ptrdiff_t(base), out.begin() + ptrdiff_t(base + last.ntok));
  e->anchors = std::move(anchors);
  e->bytes = e->text.size() + e->ids.size() * sizeof(int32_t) + e->anchors.size() * sizeof(PieceAnchor) + 128;
  if (e->bytes > budget_) return;
  // Only verified cuts became anchors: map each anchor to its own hash.
  std::vector<uint64_t> anchor_hashes;
  anchor_hashes.reserve(e->anchors.size());
  for (auto& a : e->anchors) {
    size_t k = size_t(std::lower_bound(cuts.begin(), cuts.end(), a.pos) - cuts.begin());
    if (k == cuts.size() || cuts[k] != a.pos) return;  // cannot happen: anchors are a subset of cuts
    anchor_hashes.push_back(hashes[k]);
  }
  insert(std::move(e), anchor_hashes);
}

void PrefixCache::insert(std::shared_ptr<Entry> e, const std::vector<uint64_t>& hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<const Entry> ce = e;
  for (size_t i = 0; i < hashes.size(); ++i) index_[hashes[i]] = Slot{ce, i};
  lru_.push_front(ce);
  bytes_ += ce->bytes;
  while (bytes_ > budget_ && !lru_.empty()) {
    std::shared_ptr<const Entry> old = lru_.back();
    lru_.pop_back();
    bytes_ -= old->bytes;
    for (auto it = index_.begin(); it != index_.end();) {
      if (it->second.entry == old) it = index_.erase(it);
      else ++it;
    }
  }
  stats_.entries = lru_.size();
  stats_.bytes = bytes_;
}

PrefixCache::Stats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace m3::tok
