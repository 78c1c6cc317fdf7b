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

// The data-parallel engine's placement asks every rank's cache: peek counts what match would return and changes
// nothing (no reference taken, LRU order kept).
TEST(PrefixCache, PeekCountsTheMatchWithoutRetainingOrTouchingTheLruOrder) {
  PagePool pool(3);
  PrefixCache pc(pool, 2, true);
  auto a = seq(6), b = seq(6, 100);
  int32_t pa = *pc.alloc(), pb = *pc.alloc();
  pc.insert(a, 0, pa);
  pc.insert(b, 0, pb);
  pool.release(pa);
  pool.release(pb);
  auto hit = pc.match(seq(3, 100));  // b's page used last: a's is the LRU one
  ASSERT_EQ(hit.size(), 1u);
  pool.release(hit[0]);
  EXPECT_EQ(pc.peek(seq(3)), 1);  // would touch a's page if it were a match
  EXPECT_EQ(pc.peek(seq(2)), 0);  // the last token is always recomputed
  EXPECT_EQ(pc.peek(seq(3), 42), 0);
  EXPECT_EQ(pc.num_evictable(), 2);  // no reference taken
  (void)*pc.alloc();                 // the free page
  EXPECT_EQ(*pc.alloc(), pa);        // a's page is still the LRU one
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

// Issue 12 item 6: placeholder tokens are the same ids for every image, so the image's content hash decides.
// Layout (block 4): text [0,6), image placeholder [6,14), text [14,20): pages 0 (text), 1 (text+image),
// 2 (image), 3 (image+text), 4 (text).
TEST(PrefixCacheMedia, RepeatedImageHitsAndADifferentImageWithTheSameIdsDoesNot) {
  PagePool pool(32);
  PrefixCache pc(pool, 4, true);
  std::vector<int32_t> toks = seq(6);
  for (int i = 0; i < 8; ++i) toks.push_back(777);  // placeholder id
  for (int i = 0; i < 6; ++i) toks.push_back(500 + i);
  const std::vector<MediaSpan> cat = {{6, 8, 0xCA7}}, dog = {{6, 8, 0xD06}};
  for (int i = 0; i < 5; ++i) pc.insert(toks, i, *pc.alloc(), 0, cat);
  EXPECT_EQ(pc.match(toks, 0, cat).size(), 4u) << "same image: every full page but the last token's";
  // Another image, same token ids: only the text page before the image is shared.
  EXPECT_EQ(pc.match(toks, 0, dog).size(), 1u);
  // No media information at all (e.g. a text-only lookup of the same ids) must not reuse the image pages either.
  EXPECT_EQ(pc.match(toks, 0, {}).size(), 1u);
  // The same image one token later is a different K/V layout even when the ids happen to match.
  const std::vector<MediaSpan> shifted = {{7, 7, 0xCA7}};
  EXPECT_EQ(pc.match(toks, 0, shifted).size(), 1u);
  // Two images: the key does not depend on the order the spans are listed in.
  std::vector<MediaSpan> two = {{6, 4, 1}, {10, 4, 2}}, two_rev = {{10, 4, 2}, {6, 4, 1}};
  for (int i = 0; i < 5; ++i) pc.insert(toks, i, *pc.alloc(), 0, two);
  EXPECT_EQ(pc.match(toks, 0, two_rev).size(), 4u);
  std::vector<MediaSpan> two_swapped = {{6, 4, 2}, {10, 4, 1}};
  EXPECT_EQ(pc.match(toks, 0, two_swapped).size(), 1u);
}

TEST(PrefixCacheMedia, PageKeyCoversExactlyTheOverlappingPages) {
  const std::vector<MediaSpan> m = {{6, 8, 42}};
  EXPECT_EQ(media_page_key(m, 0, 4), 0u);
  EXPECT_NE(media_page_key(m, 4, 4), 0u);
  EXPECT_NE(media_page_key(m, 12, 4), 0u);
  EXPECT_EQ(media_page_key(m, 16, 4), 0u);
  EXPECT_NE(media_page_key(m, 4, 4), media_page_key(m, 8, 4)) << "placement within the page counts";
  EXPECT_EQ(media_page_key({}, 4, 4), 0u) << "text-only keys are unchanged";
}

}  // namespace
}  // namespace m3
