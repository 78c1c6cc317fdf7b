// The vision-feature cache (media/feature_cache.h): a repeated image is not encoded again, misses go to the encoder
// in one call, an item repeated within a request is encoded once, LRU eviction by bytes, and bad encoder output is an
// error. The "encoder" here writes item-derived values so every float can be checked.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "media/feature_cache.h"

namespace m3::media {
namespace {

constexpr int64_t kWidth = 3;

// Features of an item with key k: row r, column c = k·100 + r·10 + c.
std::vector<float> item_features(uint64_t k, int64_t rows) {
  std::vector<float> f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kWidth; ++c) f.push_back(float(k * 100 + uint64_t(r) * 10 + uint64_t(c)));
  return f;
}

struct Encoder {
  std::vector<std::vector<size_t>> calls;
  std::vector<uint64_t> keys;
  std::vector<int64_t> rows;
  std::vector<float> operator()(std::span<const size_t> misses) {
    calls.emplace_back(misses.begin(), misses.end());
    std::vector<float> out;
    for (size_t m : misses) {
      const auto f = item_features(keys[m], rows[m]);
      out.insert(out.end(), f.begin(), f.end());
    }
    return out;
  }
};

std::vector<float> run(FeatureCache* cache, Encoder& enc, std::vector<uint64_t> keys, std::vector<int64_t> rows) {
  enc.keys = keys, enc.rows = rows;
  return features_with_cache(cache, keys, rows, kWidth, [&](std::span<const size_t> m) { return enc(m); });
}

std::vector<float> expected(const std::vector<uint64_t>& keys, const std::vector<int64_t>& rows) {
  std::vector<float> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto f = item_features(keys[i], rows[i]);
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

TEST(FeatureCache, ARepeatedImageIsNotEncodedAgainAndMissesGoInOneCall) {
  FeatureCache cache(1 << 20);
  Encoder enc;
  EXPECT_EQ(run(&cache, enc, {7, 8}, {2, 4}), expected({7, 8}, {2, 4}));
  ASSERT_EQ(enc.calls.size(), 1u);
  EXPECT_EQ(enc.calls[0], (std::vector<size_t>{0, 1}));
  // The next turn: both images again plus a new one in the middle — only the new one is encoded.
  EXPECT_EQ(run(&cache, enc, {7, 9, 8}, {2, 1, 4}), expected({7, 9, 8}, {2, 1, 4}));
  ASSERT_EQ(enc.calls.size(), 2u);
  EXPECT_EQ(enc.calls[1], (std::vector<size_t>{1}));
  EXPECT_EQ(run(&cache, enc, {9, 8, 7}, {1, 4, 2}), expected({9, 8, 7}, {1, 4, 2}));
  EXPECT_EQ(enc.calls.size(), 2u) << "all three cached";
  const auto s = cache.stats();
  EXPECT_EQ(s.items, 3);
  EXPECT_EQ(s.bytes, (2 + 4 + 1) * kWidth * 4);
  EXPECT_EQ(s.hits, 2 + 3);
}

TEST(FeatureCache, AnItemRepeatedInOneRequestIsEncodedOnce) {
  for (bool with_cache : {true, false}) {
    FeatureCache cache(1 << 20);
    Encoder enc;
    EXPECT_EQ(run(with_cache ? &cache : nullptr, enc, {5, 6, 5, 5}, {3, 1, 3, 3}), expected({5, 6, 5, 5}, {3, 1, 3, 3}));
    ASSERT_EQ(enc.calls.size(), 1u);
    EXPECT_EQ(enc.calls[0], (std::vector<size_t>{0, 1}));
  }
}

TEST(FeatureCache, EvictsTheLeastRecentlyUsedItemsPastItsBytesAndKeepsOversizedItemsOut) {
  const int64_t item = 2 * kWidth * 4;  // bytes of a 2-row item
  FeatureCache cache(2 * item);
  Encoder enc;
  run(&cache, enc, {1}, {2});
  run(&cache, enc, {2}, {2});
  run(&cache, enc, {1}, {2});  // 1 is now the newest
  run(&cache, enc, {3}, {2});  // evicts 2
  EXPECT_EQ(enc.calls.size(), 3u);
  run(&cache, enc, {1, 3}, {2, 2});
  EXPECT_EQ(enc.calls.size(), 3u) << "1 and 3 still cached";
  run(&cache, enc, {2}, {2});
  EXPECT_EQ(enc.calls.size(), 4u) << "2 was evicted";
  EXPECT_LE(cache.stats().bytes, 2 * item);
  FeatureCache small(item - 1);
  Encoder e2;
  run(&small, e2, {4}, {2});
  run(&small, e2, {4}, {2});
  EXPECT_EQ(e2.calls.size(), 2u) << "an item larger than the cache is never kept";
  EXPECT_EQ(small.stats().items, 0);
}

TEST(FeatureCache, AnEncoderReturningTheWrongSizeIsAnError) {
  FeatureCache cache(1 << 20);
  const std::vector<uint64_t> keys{1};
  const std::vector<int64_t> rows{2};
  EXPECT_THROW(features_with_cache(&cache, keys, rows, kWidth,
                                   [](std::span<const size_t>) { return std::vector<float>(5, 0.f); }),
               Error);
  EXPECT_EQ(cache.stats().items, 0);
}

}  // namespace
}  // namespace m3::media
