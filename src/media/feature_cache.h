// Vision-encoder outputs by media content hash (issue 12): an image sent again — in every turn of an agentic
// conversation, say — is encoded once. The gateway's own cache (gateway.h) keeps the pixels; this one the features
// the vision tower made of them ([tokens, text hidden] floats per item), which cost far more to remake (M3, 1080p:
// 14.5 ms of H200 time, 14 MiB). Keyed by PreparedItem::content_hash, which covers everything the pixels depend on
// for a given server (the bytes, a video's fps). An item's features do not depend on the items batched with it
// (VisionModel::encode_batch), so a cached item is exact. LRU by bytes; shared by the prepare pool's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

namespace m3::media {

using Features = std::shared_ptr<const std::vector<float>>;

class FeatureCache {
 public:
  explicit FeatureCache(int64_t max_bytes) : max_bytes_(max_bytes) {}
  Features get(uint64_t key);                 // null on a miss; a hit becomes the newest entry
  void put(uint64_t key, Features features);  // evicts the oldest entries past max_bytes; an item over it stays out
  struct Stats {
    int64_t hits = 0, misses = 0, items = 0, bytes = 0;
  };
  Stats stats() const;

 private:
  int64_t max_bytes_;
  mutable std::mutex mu_;
  std::list<std::pair<uint64_t, Features>> lru_;  // front = newest
  std::unordered_map<uint64_t, decltype(lru_)::iterator> index_;
  int64_t bytes_ = 0, hits_ = 0, misses_ = 0;
};

// The features of n items in order, concatenated (item i: rows[i] rows of `width` floats): cached items from `cache`
// (null: none), the rest from ONE call encode(misses) — the indices of the first item of each missing key, in order —
// which returns those items' rows concatenated in that order; they are cached. An item repeated inside the request is
// encoded once. Throws m3::Error when encode returns the wrong number of floats.
std::vector<float> features_with_cache(FeatureCache* cache, std::span<const uint64_t> keys,
                                       std::span<const int64_t> rows, int64_t width,
                                       const std::function<std::vector<float>(std::span<const size_t>)>& encode);

}  // namespace m3::media
