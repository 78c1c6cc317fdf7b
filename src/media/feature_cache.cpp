#include "media/feature_cache.h"

#include <cstring>
#include <unordered_map>

#include "base/error.h"

namespace m3::media {

std::vector<float> features_with_cache(FeatureCache* cache, std::span<const uint64_t> keys,
                                       std::span<const int64_t> rows, int64_t width,
                                       const std::function<std::vector<float>(std::span<const size_t>)>& encode) {
  M3_CHECK(keys.size() == rows.size() && width > 0, "media features: {} keys for {} items (width {})", keys.size(),
           rows.size(), width);
  const size_t n = keys.size();
  std::vector<Features> got(n);
  std::vector<size_t> misses;                       // the first item of each missing key
  std::unordered_map<uint64_t, size_t> miss_slot;  // key → its position in misses
  for (size_t i = 0; i < n; ++i) {
    if (miss_slot.count(keys[i])) continue;
    if (cache && (got[i] = cache->get(keys[i]))) {
      M3_CHECK(int64_t(got[i]->size()) == rows[i] * width,
               "media features: item {} has {} cached floats for {} rows of {}", i, got[i]->size(), rows[i], width);
      continue;
    }
    miss_slot.emplace(keys[i], misses.size());
    misses.push_back(i);
  }
  if (!misses.empty()) {
    std::vector<float> enc = encode(std::span<const size_t>(misses));
    int64_t want = 0;
    for (size_t m : misses) want += rows[m] * width;
    M3_CHECK(int64_t(enc.size()) == want, "vision encoder returned {} floats for {} expected", enc.size(), want);
    int64_t at = 0;
    for (size_t m : misses) {
      auto f = std::make_shared<const std::vector<float>>(enc.begin() + at, enc.begin() + at + rows[m] * width);
      at += rows[m] * width;
      if (cache) cache->put(keys[m], f);
      got[m] = std::move(f);
    }
  }
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += rows[i] * width;
  std::vector<float> out(static_cast<size_t>(total));
  int64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    const Features& f = got[i] ? got[i] : got[misses[miss_slot.at(keys[i])]];  // a repeat of an item encoded now
    M3_CHECK(int64_t(f->size()) == rows[i] * width, "media features: item {} repeats a key with {} rows, not {}", i,
             f->size() / size_t(width), rows[i]);
    std::memcpy(out.data() + at, f->data(), f->size() * sizeof(float));
    at += rows[i] * width;
  }
  return out;
}

}  // namespace m3::media
