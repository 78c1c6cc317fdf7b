// RankWorkers (base/rank_workers.h): the persistent rank threads of a data-parallel engine step.
#include "base/rank_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/error.h"

namespace m3 {
namespace {

TEST(RankWorkers, EveryRankRunsExactlyOncePerCallOnItsOwnThread) {
  RankWorkers w(4);
  EXPECT_EQ(w.ranks(), 4);
  std::vector<std::thread::id> first(4);
  for (int call = 0; call < 200; ++call) {
    std::vector<std::atomic<int>> hits(4);
    std::vector<std::thread::id> ids(4);
    w.run([&](int r) {
      hits[size_t(r)]++;
      ids[size_t(r)] = std::this_thread::get_id();
    });
    for (int r = 0; r < 4; ++r) EXPECT_EQ(hits[size_t(r)].load(), 1) << "call " << call << " rank " << r;
    EXPECT_EQ(ids[0], std::this_thread::get_id());                     // rank 0 on the caller
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), 4u);  // one thread per rank
    if (call == 0) first = ids;
    EXPECT_EQ(ids, first) << "the same threads every call, not new ones";
  }
}

TEST(RankWorkers, RunReturnsOnlyWhenEveryRankHasFinished) {
  RankWorkers w(3);
  std::atomic<int> done{0};
  w.run([&](int r) {
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    done++;
  });
  EXPECT_EQ(done.load(), 3);
}

TEST(RankWorkers, AnExceptionIsRethrownAfterAllRanksFinishAndTheWorkersStayUsable) {
  RankWorkers w(3);
  std::atomic<int> finished{0};
  try {
    w.run([&](int r) {
      if (r == 1) throw Error("rank 1 failed");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      finished++;
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 failed");
  }
  EXPECT_EQ(finished.load(), 2);  // ranks 0 and 2 ran to the end before run() rethrew
  std::atomic<int> again{0};
  w.run([&](int) { again++; });
  EXPECT_EQ(again.load(), 3);
}

TEST(RankWorkers, OneRankRunsOnTheCallerWithNoThreads) {
  RankWorkers w(1);
  int calls = 0;
  w.run([&](int r) {
    EXPECT_EQ(r, 0);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(RankWorkers(0), Error);
}

}  // namespace
}  // namespace m3
