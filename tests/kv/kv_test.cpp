#include <gtest/gtest.h>

#include "backend/cpu/fp8.h"
#include "base/dtype.h"
#include "base/error.h"
#include "kv/sequence_kv.h"
#include "kv/kv_cache.h"
#include "kv/page_pool.h"
#include "test_model_util.h"

namespace m3 {
namespace {

TEST(PagePool, EveryPageReturnsWhenAllOwnersRelease) {
  PagePool pool(4);
  auto a = pool.alloc(), b = pool.alloc();
  ASSERT_TRUE(a && b);
  pool.retain(*a);
  EXPECT_EQ(pool.num_used(), 2);
  pool.release(*a);
  EXPECT_EQ(pool.num_used(), 2);  // still shared
  pool.release(*a);
  pool.release(*b);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_THROW(pool.release(*b), Error);  // double free is caught, not silent
}

TEST(PagePool, AllocFailsCleanlyWhenEmpty) {
  PagePool pool(1);
  ASSERT_TRUE(pool.alloc());
  EXPECT_FALSE(pool.alloc());
}

TEST(KVCache, PageHoldsKVAndIndexKOfEveryLayerAsOneUnit) {
  M3Config c = test::tiny_config();
  KVCache cache(c, 3);
  const int64_t kv = int64_t(c.num_kv_heads) * c.sparse_block_size * c.head_dim;
  EXPECT_EQ(KVCache::page_floats(c), c.num_layers * 2 * kv + c.num_sparse_layers() * c.sparse_block_size * c.index_head_dim);
  // Regions of one page are disjoint and inside the page; the next page starts right after.
  float* base = cache.k(0, 0);
  EXPECT_EQ(cache.k(1, 0) - base, KVCache::page_floats(c));
  EXPECT_EQ(cache.v(0, 0) - cache.k(0, 0), kv);
  EXPECT_EQ(cache.index_k(0, 3) + c.sparse_block_size * c.index_head_dim, cache.index_k(0, 4));
  EXPECT_THROW(cache.index_k(0, 0), Error);  // dense layers have no index keys
}

// KvStorage (issue 15 item 5): a write stores what the device cache of that element type holds.
TEST(KVCache, WritesRoundAsTheStorageSaysAndRecordAmaxAndSaturation) {
  M3Config c = test::tiny_config();
  KVCache cache(c, 2);
  const float src[6] = {1.0f / 3, -2.7182817f, 1e-7f, 5000.0f, -0.0123f, 300.0f};
  float out[6];
  cache.write(KvTensor::K, 0, out, src, 6);  // default fp32: exact
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], src[i]);
  EXPECT_EQ(cache.write_stats(KvTensor::K, 0).amax, 5000.0f);

  cache.set_storage(KvStorage::all(KvDtype::BF16));
  EXPECT_EQ(cache.write_stats(KvTensor::K, 0).written, 0);  // statistics restart with the storage
  cache.write(KvTensor::V, 1, out, src, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], round_to_bf16(src[i]));

  KvStorage st = KvStorage::all(KvDtype::E4M3);
  st.k_scale.assign(size_t(c.num_layers), 0.5f);
  st.v_scale.assign(size_t(c.num_layers), 3.0f);
  st.index_dtype = KvDtype::BF16;  // index-K rounded independently of K/V
  cache.set_storage(st);
  cache.write(KvTensor::V, 2, out, src, 6);
  uint8_t q[6];
  float ref[6];
  cpu::kv_quantize_e4m3(src, 6, 3.0f, q);
  cpu::kv_dequantize_e4m3(q, 6, 3.0f, ref);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], ref[i]) << i;
  EXPECT_EQ(out[3], 448.0f * 3.0f);  // 5000 / 3 saturates
  EXPECT_EQ(cache.write_stats(KvTensor::V, 2).saturated, 1);
  EXPECT_EQ(cache.write_stats(KvTensor::V, 2).written, 6);
  cache.write(KvTensor::IndexK, 3, out, src, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], round_to_bf16(src[i]));

  st.v_scale[1] = 0.f;
  EXPECT_THROW(cache.set_storage(st), Error);
}

TEST(SequenceKV, ReturnsItsPagesWhenDestroyedAndReportsAFullCache) {
  M3Config c = test::tiny_config();
  KVCache cache(c, 4);
  {
    SequenceKV s(cache);
    s.reserve(40);  // 3 pages of 16
    EXPECT_EQ(s.pages().size(), 3u);
    EXPECT_THROW(s.reserve(80), Error);
  }
  EXPECT_EQ(cache.pool().num_free(), 4);
}

}  // namespace
}  // namespace m3
