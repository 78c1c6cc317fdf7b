// Vision-encoder outputs by media content hash (issue 12): an image sent again — in every turn of an agentic
// conversation, say — is encoded once. The gateway's own cache (gateway.h) keeps the pixels; this one the features
// the vision tower made of them ([tokens, text hidden] floats per item), which cost far more to remake (M3, 1080p:
// 14.5 ms of H200 time, 14 MiB). Keyed by PreparedItem::content_hash, which covers everything the pixels depend on
// for a given server (the bytes, a video's fps). On the CPU reference an item's features do not depend on the items
// batched with it (VisionModel::encode_batch), so a cached item is exact; CudaVisionModel's GEMMs run over all rows
// of a call, so there a cached item holds what its first batch gave (rounding may differ from another batch's).
// LRU by bytes; shared by the threads that encode (m3serve serve: the encoder's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/byte_lru.h"

namespace m3::media {

using Features = std::shared_ptr<const std::vector<float>>;

class FeatureCache : public ByteLru<std::vector<float>> {
 public:
  explicit FeatureCache(int64_t max_bytes)
      : ByteLru(max_bytes, [](const std::vector<float>& f) { return int64_t(f.size() * sizeof(float)); }) {}
};

// The features of n items in order, concatenated (item i: rows[i] rows of `width` floats): cached items from `cache`
// (null: none), the rest from ONE call encode(misses) — the indices of the first item of each missing key, in order —
// which returns those items' rows concatenated in that order; they are cached. An item repeated inside the request is
// encoded once. Throws m3::Error when encode returns the wrong number of floats.
std::vector<float> features_with_cache(FeatureCache* cache, std::span<const uint64_t> keys,
                                       std::span<const int64_t> rows, int64_t width,
                                       const std::function<std::vector<float>(std::span<const size_t>)>& encode);

}  // namespace m3::media
