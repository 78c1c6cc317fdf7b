#include <gtest/gtest.h>

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
