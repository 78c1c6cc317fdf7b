// Ranks as threads (dist/inprocess_communicator.h): the collectives' definitions, and the data-parallel attention +
// expert-parallel MoE forward of the CPU model (model/expert_parallel.h) against a one-rank forward, bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <functional>
#include <thread>
#include <vector>

#include "base/error.h"
#include "dist/inprocess_communicator.h"
#include "kv/kv_cache.h"
#include "model/expert_parallel.h"
#include "model/m3_model.h"
#include "model/weight_plan.h"
#include "test_model_util.h"

namespace m3 {
namespace {

// Runs fn(rank) on one thread per rank and rethrows the first failure.
void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        err[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

TEST(InProcessCollectives, AllGatherReduceScatterAndAllReduceFollowTheirDefinitions) {
  const int P = 3;
  const size_t n = 5;
  dist::InProcessGroup g(P);
  std::vector<std::vector<int32_t>> gathered(P);
  std::vector<std::vector<float>> scattered(P), reduced(P);
  run_ranks(P, [&](int r) {
    dist::Communicator& c = g.rank(r);
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), P);
    for (int rep = 0; rep < 3; ++rep) {  // the same buffers reused: the closing barrier must hold
      std::vector<int32_t> mine{r, 10 * r + rep};
      gathered[size_t(r)].assign(2 * P, -1);
      c.all_gather(mine.data(), mine.size() * 4, gathered[size_t(r)].data());
      std::vector<float> send(P * n);
      for (size_t i = 0; i < send.size(); ++i) send[i] = float(100 * r + i + rep);
      scattered[size_t(r)].assign(n, -1.f);
      c.reduce_scatter_sum(send.data(), scattered[size_t(r)].data(), n);
      reduced[size_t(r)].assign(n, 0.f);
      for (size_t i = 0; i < n; ++i) reduced[size_t(r)][i] = float(r + 1) * float(i + rep);
      c.all_reduce_sum(reduced[size_t(r)].data(), n);
      c.barrier();
    }
  });
  for (int r = 0; r < P; ++r) {
    for (int q = 0; q < P; ++q) {
      EXPECT_EQ(gathered[size_t(r)][size_t(2 * q)], q);
      EXPECT_EQ(gathered[size_t(r)][size_t(2 * q + 1)], 10 * q + 2);
    }
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q = 0; q < P; ++q) want += float(100 * q + size_t(r) * n + i + 2);
      EXPECT_EQ(scattered[size_t(r)][i], want) << "rank " << r << " element " << i;
      EXPECT_EQ(reduced[size_t(r)][i], float(1 + 2 + 3) * float(i + 2));
    }
  }
}

// The full weights with every routed expert rank r does not own poisoned (NaN): a rank that ran another rank's
// expert would put NaN into some logits.
M3Weights shard_for(const M3Weights& w, int r, int P) {
  M3Weights s = w;
  for (auto& L : s.layers)
    for (size_t e = 0; e < L.experts.size(); ++e)
      if (int(e % size_t(P)) != r) {
        std::fill(L.experts[e].gate_up.begin(), L.experts[e].gate_up.end(), std::nanf(""));
        std::fill(L.experts[e].down.begin(), L.experts[e].down.end(), std::nanf(""));
      }
  return s;
}

int32_t argmax_row(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// Each rank owns some sequences (data-parallel attention, its own KV cache) and E / P experts. Steps: prefills of
// different lengths, then lockstep greedy decode in which one rank sits out a step (idle_step). Every logit equals
// the one-rank forward of the same sequences.
// `rank_weights(w, r)`: rank r's weights made from the whole model w (poisoned copies, or a sharded load).
using RankWeights = std::function<M3Weights(const M3Weights&, int r)>;
// The whole model: random weights, or the dummy weights of `dummy_seed` when it is not 0.
void expect_expert_parallel_equals_one_rank(int P, const RankWeights& rank_weights, uint64_t dummy_seed = 0) {
  const M3Config c = test::tiny_config();  // 2 MoE layers, 8 experts top-2, shared expert, MSA layers
  const M3Weights w = dummy_seed ? dummy_weights(c, dummy_seed) : test::random_weights(c, 21);
  const M3Model one(c, w);
  dist::InProcessGroup g(P);
  std::vector<std::unique_ptr<M3Model>> models;
  for (int r = 0; r < P; ++r) models.push_back(std::make_unique<M3Model>(c, rank_weights(w, r)));
  struct Seq {
    std::vector<int32_t> ids, pages;
  };
  // Rank r: r + 1 sequences, 30 + 23·k + 7·r tokens (past several 16-token blocks, so MSA selects).
  std::vector<std::vector<Seq>> seqs(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    for (int k = 0; k <= r; ++k) {
      Seq s;
      s.ids = test::random_ids(30 + 23 * k + 7 * r, int(c.vocab_size), uint64_t(100 * r + k));
      for (int p = 0; p < 12; ++p) s.pages.push_back(12 * k + p);
      seqs[size_t(r)].push_back(s);
    }
  const int steps = 5;
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(P)), want(static_cast<size_t>(P));  // [rank][step·seq] logits
  run_ranks(P, [&](int r) {
    KVCache cache(c, 64), ref_cache(c, 64);
    ExpertParallel ep{&g.rank(r), 256};
    auto& mine = seqs[size_t(r)];
    for (int step = 0; step <= steps; ++step) {
      const bool idle = step == 3 && r == P - 1;  // the last rank has nothing to do in step 3
      if (idle) {
        models[size_t(r)]->idle_step(ep);
        continue;
      }
      std::vector<SeqInput> in;
      for (auto& s : mine) {
        const int64_t start = step == 0 ? 0 : int64_t(s.ids.size()) - 1;
        in.push_back(SeqInput{std::span<const int32_t>(s.ids.data() + start, s.ids.size() - size_t(start)), start,
                              s.pages, step == 0});
      }
      auto a = models[size_t(r)]->forward(in, cache, nullptr, &ep);
      auto b = one.forward(in, ref_cache);
      for (size_t i = 0; i < in.size(); ++i) {
        got[size_t(r)].push_back(a[i]);
        want[size_t(r)].push_back(b[i]);
        // Greedy continuation from the one-rank logits (both must agree anyway).
        const std::vector<float> last(b[i].end() - int64_t(c.vocab_size), b[i].end());
        mine[i].ids.push_back(argmax_row(last));
      }
    }
  });
  for (int r = 0; r < P; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), want[size_t(r)].size());
    for (size_t i = 0; i < got[size_t(r)].size(); ++i)
      EXPECT_EQ(got[size_t(r)][i], want[size_t(r)][i]) << P << " ranks, rank " << r << " output " << i;
  }
}

RankWeights poisoned(int P) {
  return [P](const M3Weights& w, int r) { return shard_for(w, r, P); };
}

// Rank r loads its share of `layout` (model/rank_share.h; its rank field is set to r) from a checkpoint of w that
// holds only rank r's routed experts when they are split: the rank cannot have read another rank's expert, and its
// other experts are empty arrays. With the vocabulary split (vocab_parts > 1) rank r reads only its vocabulary rows,
// and the forward exchanges embedding rows and logits (model/vocab_parallel.h).
RankWeights sharded_share_load(const RankShare& layout) {
  return [layout](const M3Weights& w, int r) {
    const M3Config c = test::tiny_config();
    RankShare share = layout;
    share.rank = r;
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("m3_dist_shard_" + std::to_string(::getpid()) + "_" + std::to_string(share.world) + "_" +
                              std::to_string(r))).string();
    test::write_checkpoint(c, w, dir, [&](int, int e) { return share.owns_expert(e); });
    M3Weights rw = M3Weights::load(c, SafeTensors::open(dir), share);
    std::filesystem::remove_all(dir);
    const auto [v0, v1] = share.vocab_rows(c.vocab_size);
    EXPECT_EQ(int64_t(rw.embed.size()), (v1 - v0) * c.hidden_size) << "rank " << r << " holds only its vocabulary rows";
    return rw;
  };
}
// The expert-parallel layout of P ranks (and the vocabulary split over them with `split_vocab`).
RankWeights sharded_load(int P, bool split_vocab = false) {
  return sharded_share_load(RankShare{0, P, true, 1, split_vocab ? P : 1});
}

// Attention split over the KV heads of P ranks (one TP group: each rank holds Hq/P query, Hkv/P KV and Hidx/P index
// heads, its cache only its KV heads) with the experts and vocabulary as `rank_weights` gives them: every rank runs
// the same two sequences — a prefill over several MSA blocks, then greedy decode — and its logits equal the
// one-rank forward's up to the order of the o-projection sum (two partial products all-reduced), so within 1e-5 of
// the largest logit, and the greedy tokens are the same.
void expect_kv_head_split_equals_one_rank(int P, const RankWeights& rank_weights, uint64_t dummy_seed = 0) {
  const M3Config c = test::tiny_config();  // 4 query, 2 KV, 2 index heads
  ASSERT_EQ(c.num_kv_heads % P, 0);
  const M3Weights w = dummy_seed ? dummy_weights(c, dummy_seed) : test::random_weights(c, 21);
  const M3Model one(c, w);
  dist::InProcessGroup g(P);
  std::vector<std::unique_ptr<M3Model>> models;
  for (int r = 0; r < P; ++r) models.push_back(std::make_unique<M3Model>(c, rank_weights(w, r)));
  const int steps = 5;
  std::vector<double> worst(size_t(P), 0.0);
  std::vector<int> token_mismatches(size_t(P), 0), outputs(size_t(P), 0);
  run_ranks(P, [&](int r) {
    RankShare split;  // (the cache depends only on the KV-head split)
    split.attn_tp = P;
    KVCache cache(split.kv_config(c), 64), ref_cache(c, 64);
    ExpertParallel ep{&g.rank(r), 256};
    std::vector<std::vector<int32_t>> ids{test::random_ids(70, int(c.vocab_size), 31),
                                          test::random_ids(45, int(c.vocab_size), 32)};
    std::vector<std::vector<int32_t>> pages(2);
    for (int p = 0; p < 12; ++p) pages[0].push_back(p), pages[1].push_back(12 + p);
    for (int step = 0; step <= steps; ++step) {
      std::vector<SeqInput> in;
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t start = step == 0 ? 0 : int64_t(ids[i].size()) - 1;
        in.push_back(SeqInput{std::span<const int32_t>(ids[i].data() + start, ids[i].size() - size_t(start)), start,
                              pages[i], step == 0});
      }
      const auto a = models[size_t(r)]->forward(in, cache, nullptr, &ep);
      const auto b = one.forward(in, ref_cache);
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_EQ(a[i].size(), b[i].size());
        double mx = 1e-30, err = 0;
        for (size_t k = 0; k < b[i].size(); ++k)
          mx = std::max(mx, double(std::fabs(b[i][k]))), err = std::max(err, double(std::fabs(a[i][k] - b[i][k])));
        worst[size_t(r)] = std::max(worst[size_t(r)], err / mx);
        const std::vector<float> la(a[i].end() - int64_t(c.vocab_size), a[i].end());
        const std::vector<float> lb(b[i].end() - int64_t(c.vocab_size), b[i].end());
        token_mismatches[size_t(r)] += argmax_row(la) != argmax_row(lb);
        ++outputs[size_t(r)];
        ids[i].push_back(argmax_row(lb));
      }
    }
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(outputs[size_t(r)], 2 * (steps + 1)) << "rank " << r;
    EXPECT_LE(worst[size_t(r)], 1e-5) << P << " ranks, rank " << r << ": max |logit − one rank| / max |logit|";
    EXPECT_EQ(token_mismatches[size_t(r)], 0) << "rank " << r << " greedy tokens";
  }
}

// A rank that fails before its collective must not leave the others waiting forever: abort() wakes them with an
// error naming the cause, later collectives fail at once, and after reset() the same group works again.
TEST(InProcessCollectives, AbortWakesRanksWaitingInACollectiveAndResetReusesTheGroup) {
  const int P = 3;
  dist::InProcessGroup g(P);
  std::vector<std::string> errors(P);
  std::vector<std::thread> th;
  for (int r = 0; r < P; ++r)
    th.emplace_back([&, r] {
      try {
        if (r == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are inside all_reduce by now
          g.abort("rank 0 failed: out of memory");
          throw Error("rank 0 failed: out of memory");
        }
        std::vector<float> buf(4, float(r));
        g.rank(r).all_reduce_sum(buf.data(), buf.size());
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : th) t.join();  // a regression hangs here (ctest's timeout)
  for (int r = 1; r < P; ++r)
    EXPECT_NE(errors[size_t(r)].find("parallel group aborted: rank 0 failed: out of memory"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
  EXPECT_THROW(g.rank(1).barrier(), dist::GroupAborted);  // still aborted: fails at once instead of waiting

  g.reset();
  std::vector<std::vector<float>> out(P);
  run_ranks(P, [&](int r) {
    out[size_t(r)].assign(4, float(r + 1));
    g.rank(r).all_reduce_sum(out[size_t(r)].data(), 4);
  });
  for (int r = 0; r < P; ++r) EXPECT_EQ(out[size_t(r)], std::vector<float>(4, 6.f)) << r;
}

TEST(ExpertParallel, TwoRanksGiveTheOneRankLogitsBitForBit) { expect_expert_parallel_equals_one_rank(2, poisoned(2)); }
TEST(ExpertParallel, ThreeRanksWithExpertsNotDividingEvenly) { expect_expert_parallel_equals_one_rank(3, poisoned(3)); }
TEST(ExpertParallel, ShardedLoadsOfTwoRanksGiveTheOneRankLogits) {
  expect_expert_parallel_equals_one_rank(2, sharded_load(2));
}
TEST(ExpertParallel, ShardedLoadsOfThreeRanksGiveTheOneRankLogits) {
  expect_expert_parallel_equals_one_rank(3, sharded_load(3));
}
TEST(VocabParallel, TwoRanksWithTheVocabularySplitGiveTheOneRankLogitsBitForBit) {
  expect_expert_parallel_equals_one_rank(2, sharded_load(2, /*split_vocab=*/true));
}
TEST(VocabParallel, ThreeRanksWithAVocabularyNotDividingEvenly) {
  ASSERT_NE(test::tiny_config().vocab_size % 3, 0);
  expect_expert_parallel_equals_one_rank(3, sharded_load(3, /*split_vocab=*/true));
}
TEST(VocabParallel, DummySharesWithTheVocabularySplitGiveTheOneRankDummyLogits) {
  const M3Config c = test::tiny_config();
  expect_expert_parallel_equals_one_rank(2, [&](const M3Weights&, int r) {
    return dummy_weights(c, 5, RankShare{r, 2, true, 1, 2});
  }, 5);
}
// Split vocabulary rows run only with the exchange of their own rank: alone, the forward refuses.
TEST(VocabParallel, SplitVocabularyRefusesToRunWithoutItsExchange) {
  const M3Config c = test::tiny_config();
  const M3Model m(c, dummy_weights(c, 5, RankShare{0, 2, true, 1, 2}));
  KVCache cache(c, 8);
  const std::vector<int32_t> ids{1, 2, 3};
  const std::vector<int32_t> pages{0};
  const SeqInput in{std::span<const int32_t>(ids), 0, pages, false};
  EXPECT_THROW(m.forward(std::span<const SeqInput>(&in, 1), cache), Error);
}

TEST(ExpertParallel, DummySharesOfTwoRanksGiveTheOneRankDummyLogits) {
  // --load-format dummy for a rank: its share of the whole model's dummy values.
  const M3Config c = test::tiny_config();
  expect_expert_parallel_equals_one_rank(2, [&](const M3Weights&, int r) {
    return dummy_weights(c, 5, RankShare::ep(r, 2));
  }, 5);
}

// A rank's share runs only with that rank's exchange: without it (or with another rank's) the forward refuses
// instead of indexing experts it does not hold.
TEST(ExpertParallel, ShardedWeightsRefuseToRunWithoutTheirExchange) {
  const M3Config c = test::tiny_config();
  const M3Model m(c, dummy_weights(c, 5, RankShare::ep(1, 2)));
  KVCache cache(c, 8);
  const std::vector<int32_t> ids{1, 2, 3};
  const std::vector<int32_t> pages{0};
  const SeqInput in{std::span<const int32_t>(ids), 0, pages, true};
  EXPECT_THROW(m.forward(std::span<const SeqInput>(&in, 1), cache), Error);
  dist::InProcessGroup g(1);
  EXPECT_THROW(m.idle_step(ExpertParallel{&g.rank(0), 4}), Error);
  const M3Model tp(c, dummy_weights(c, 5, RankShare{0, 2, true, 2, 2}));
  EXPECT_THROW(tp.forward(std::span<const SeqInput>(&in, 1), cache), Error);
}

TEST(KvHeadParallel, TwoRanksSplittingTheKvHeadsGiveTheOneRankLogits) {
  expect_kv_head_split_equals_one_rank(2, sharded_share_load(RankShare{0, 2, false, 2, 1}));
}
TEST(KvHeadParallel, KvHeadsExpertsAndVocabularySplitOverTwoRanks) {
  expect_kv_head_split_equals_one_rank(2, sharded_share_load(RankShare{0, 2, true, 2, 2}));
}
TEST(KvHeadParallel, DummySharesOfAKvHeadSplitGiveTheOneRankDummyLogits) {
  const M3Config c = test::tiny_config();
  expect_kv_head_split_equals_one_rank(2, [&](const M3Weights&, int r) {
    return dummy_weights(c, 5, RankShare{r, 2, true, 2, 2});
  }, 5);
}
// A KV-head share refuses a cache of every KV head, and cannot sit out a step (its group all-reduces every layer).
TEST(KvHeadParallel, RefusesAWholeHeadCacheAndAnIdleStep) {
  const M3Config c = test::tiny_config();
  dist::InProcessGroup g(2);
  std::vector<int> threw(2, 0);
  run_ranks(2, [&](int r) {
    const M3Model tp(c, dummy_weights(c, 5, RankShare{r, 2, false, 2, 1}));
    KVCache whole(c, 8);
    const std::vector<int32_t> ids{1, 2, 3};
    const std::vector<int32_t> pages{0};
    const SeqInput in{std::span<const int32_t>(ids), 0, pages, false};
    ExpertParallel ep{&g.rank(r), 4};
    try {
      tp.forward(std::span<const SeqInput>(&in, 1), whole, nullptr, &ep);
    } catch (const Error& e) {
      threw[size_t(r)] += std::string(e.what()).find("kv_config") != std::string::npos;
    }
    try {
      tp.idle_step(ep);
    } catch (const Error&) {
      threw[size_t(r)] += 1;
    }
  });
  EXPECT_EQ(threw, std::vector<int>({2, 2}));
}

TEST(ExpertParallel, MoreTokensThanTheExchangeCapacityIsAnError) {
  dist::InProcessGroup g(1);
  ExpertParallel ep{&g.rank(0), 2};
  std::vector<float> x(3 * 4), out(3 * 2 * 4);
  std::vector<int32_t> ids(6, 0);
  EXPECT_THROW(moe_slots_expert_parallel(ep, 4, 2, 4, x.data(), 3, ids.data(),
                                         [](int64_t, const float* p, int64_t n) {
                                           return std::vector<float>(p, p + n * 4);
                                         },
                                         out.data()),
               Error);
}

}  // namespace
}  // namespace m3
