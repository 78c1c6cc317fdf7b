#include <gtest/gtest.h>

#include "kv/page_pool.h"
#include "kv/prefix_cache.h"

namespace m3 {
namespace {

std::vector<int32_t> seq(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(PrefixCache, MatchesOnlyFullPagesAndLeavesTheLastTokenToCompute) {
  PagePool pool(8);
  PrefixCache pc(pool, 4, true);
  auto toks = seq(12);
  std::vector<int32_t> pages;
  for (int i = 0; i < 3; ++i) {
    pages.push_back(*pc.alloc());
    pc.insert(toks, i, pages.back());
  }
  // 12 tokens = 3 full pages, but one token must be recomputed: only 2 pages match.
  EXPECT_EQ(pc.match(toks), (std::vector<int32_t>{pages[0], pages[1]}));
  auto longer = seq(13);
  EXPECT_EQ(pc.match(longer).size(), 3u);
  auto diverge = toks;
  diverge[5] = 99;
  EXPECT_EQ(pc.match(diverge), (std::vector<int32_t>{pages[0]}));
  // A different extra key (e.g. another image behind the same text) shares nothing.
  EXPECT_TRUE(pc.match(longer, /*extra_key=*/42).empty());
}

TEST(PrefixCache, EvictsLeastRecentlyUsedUnreferencedPagesOnlyWhenThePoolIsEmpty) {
  PagePool pool(3);
  PrefixCache pc(pool, 2, true);
  auto a = seq(6), b = seq(6, 100);
  int32_t pa = *pc.alloc(), pb = *pc.alloc();
  pc.insert(a, 0, pa);
  pc.insert(b, 0, pb);
  pool.release(pa);  // owners gone: only the cache holds them now
  pool.release(pb);
  EXPECT_EQ(pc.num_evictable(), 2);
  auto hit = pc.match(seq(3));  // touch a's page: b's becomes the LRU one
  ASSERT_EQ(hit.size(), 1u);
  pool.release(hit[0]);
  int32_t p1 = *pc.alloc();  // the free page first, no eviction
  EXPECT_EQ(pc.num_cached(), 2);
  int32_t p2 = *pc.alloc();  // now evicts b's page
  EXPECT_EQ(p2, pb);
  EXPECT_EQ(pc.num_cached(), 1);
  EXPECT_TRUE(pc.match(seq(3, 100)).empty());
  EXPECT_NE(p1, pa);
  EXPECT_EQ(*pc.alloc(), pa);  // a's page, used more recently, goes last
  EXPECT_EQ(pc.num_cached(), 0);
  EXPECT_FALSE(pc.alloc().has_value());
}

TEST(PrefixCache, ReferencedPagesAreNeverEvicted) {
  PagePool pool(1);
  PrefixCache pc(pool, 2, true);
  int32_t p = *pc.alloc();
  pc.insert(seq(2), 0, p);
  EXPECT_FALSE(pc.alloc().has_value());  // still owned by its sequence
  pool.release(p);
  EXPECT_TRUE(pc.alloc().has_value());
}

// Pages of B tokens built from single-token "blocks": page(7) = {7, 7, 7, 7}.
std::vector<int32_t> pages_of(std::initializer_list<int32_t> blocks, int B, int tail = 0) {
  std::vector<int32_t> v;
  for (int32_t b : blocks) v.insert(v.end(), size_t(B), b);
  for (int i = 0; i < tail; ++i) v.push_back(1000 + i);
  return v;
}

// Caches every full page of `toks` in a freshly allocated page; returns the pages in order.
std::vector<int32_t> cache_all(PrefixCache& pc, const std::vector<int32_t>& toks, int B) {
  std::vector<int32_t> pages;
  for (int i = 0; i < int(toks.size()) / B; ++i) {
    pages.push_back(*pc.alloc());
    pc.insert(toks, i, pages.back());
  }
  return pages;
}

TEST(PrefixCache, RepeatedContentIsCachedOncePerPositionAndMatchesInOrder) {
  // Four identical pages are four different cache entries (their parents differ): all four match, in order.
  PagePool pool(16);
  PrefixCache pc(pool, 4, true);
  auto toks = pages_of({5, 5, 5, 5}, 4);
  auto pages = cache_all(pc, toks, 4);
  EXPECT_EQ(pc.num_cached(), 4);
  EXPECT_EQ(pc.match(pages_of({5, 5, 5, 5}, 4, 1)), pages);
  EXPECT_EQ(pc.match(pages_of({5, 5, 9}, 4, 1)), (std::vector<int32_t>{pages[0], pages[1]}));
}

TEST(PrefixCache, EqualPagesUnderDifferentParentsNeverMatch) {
  // Page "5" cached after page "7" holds KV computed under prefix 7: a query starting with 5, or reaching 5 after
  // another prefix, must not get it.
  PagePool pool(16);
  PrefixCache pc(pool, 4, true);
  auto a = cache_all(pc, pages_of({7, 5, 5}, 4), 4);
  EXPECT_TRUE(pc.match(pages_of({5, 5}, 4, 1)).empty());
  // Two sequences share page 2 ("8") but not page 1: [1, 8, 9] after caching [1, 2, 3] and [4, 8, 9] gets page 0
  // only — page 2 of [4, 8, 9] was computed under prefix [4, 8].
  auto b = cache_all(pc, pages_of({1, 8, 3}, 4), 4);
  auto c = cache_all(pc, pages_of({4, 8, 9}, 4), 4);
  EXPECT_EQ(pc.match(pages_of({1, 8, 9}, 4, 1)), (std::vector<int32_t>{b[0], b[1]}));
  EXPECT_EQ(pc.match(pages_of({4, 8, 3}, 4, 1)), (std::vector<int32_t>{c[0], c[1]}));
  EXPECT_EQ(pc.match(pages_of({7, 5, 5}, 4, 1)), a);
}

}  // namespace
}  // namespace m3
