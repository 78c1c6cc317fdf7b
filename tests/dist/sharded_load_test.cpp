// Sharded loads (issue 17 item 3; model/rank_share.h, model/weight_plan.h rank_weight_plan): each rank reads only
// its tensors and rows. The union of the ranks' shares is the whole model bit for bit (checkpoint and dummy
// weights, fp32 and MXFP8 files, EP / TP over KV heads / vocabulary-parallel), a rank never reads another rank's
// expert bytes (bytes-read counter; a file without them still loads), and its host bytes are its share's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/m3_weights.h"
#include "model/weight_plan.h"
#include "test_model_util.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("m3_sharded_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d.string();
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Scatters every rank's blocks back into whole slots and checks each element of the whole model is covered by at
// least one rank and equal, bit for bit, to the whole model's element wherever it is covered.
void expect_union_is_whole(const M3Config& c, const M3Weights& whole, std::vector<M3Weights> ranks,
                           const std::vector<RankShare>& shares) {
  M3Weights& full = const_cast<M3Weights&>(whole);
  for (const WeightSlot& s : weight_plan(c)) {
    const std::vector<float>& want = host_slot(full, s);
    ASSERT_EQ(int64_t(want.size()), s.numel()) << s.label();
    std::vector<int> covered(want.size(), 0);
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (const SlotShare& ss : rank_weight_plan(c, shares[r])) {
        if (ss.slot.stream_id() != s.stream_id()) continue;
        const std::vector<float>& got = host_slot(ranks[r], s);
        ASSERT_EQ(int64_t(got.size()), ss.numel()) << s.label() << " rank " << r;
        size_t at = 0;
        int64_t offset = 0;
        for (size_t i = 0; i < s.pieces.size(); ++i) {
          const int64_t cols = s.pieces[i].shape.back();
          const PieceBlock& b = ss.blocks[i];
          for (int64_t row = b.row0; row < b.row1; ++row)
            for (int64_t col = b.col0; col < b.col1; ++col, ++at) {
              const size_t k = size_t(offset + row * cols + col);
              ASSERT_EQ(bits(got[at]), bits(want[k])) << s.label() << " rank " << r << " element " << k;
              ++covered[k];
            }
          offset += s.pieces[i].numel();
        }
      }
    }
    for (size_t k = 0; k < covered.size(); ++k) ASSERT_GE(covered[k], 1) << s.label() << " element " << k;
  }
}

// The shares the tests split the tiny MoE model into: EP over P, EP + vocabulary over P, and for P = 2 also TP over
// the 2 KV heads (and index heads) with the vocabulary split in the TP group.
std::vector<std::vector<RankShare>> layouts(int P) {
  std::vector<std::vector<RankShare>> out(2);
  for (int r = 0; r < P; ++r) {
    out[0].push_back(RankShare::ep(r, P));
    out[1].push_back(RankShare{r, P, true, 1, P});
  }
  if (P == 2) {
    out.emplace_back();
    for (int r = 0; r < P; ++r) out.back().push_back(RankShare{r, P, true, 2, 2});
  }
  return out;
}

class ShardedLoad : public ::testing::TestWithParam<int> {};

TEST_P(ShardedLoad, UnionOfTheRanksSharesIsTheWholeCheckpointBitForBit) {
  const int P = GetParam();
  const M3Config c = test::tiny_config();
  const std::string dir = temp_dir("union" + std::to_string(P));
  test::write_checkpoint(c, test::random_weights(c, 5), dir);
  const SafeTensors st = SafeTensors::open(dir);
  const M3Weights whole = M3Weights::load(c, st);
  for (const auto& shares : layouts(P)) {
    std::vector<M3Weights> ranks;
    for (const RankShare& s : shares) ranks.push_back(M3Weights::load(c, SafeTensors::open(dir), s));
    expect_union_is_whole(c, whole, std::move(ranks), shares);
  }
  fs::remove_all(dir);
}

TEST_P(ShardedLoad, UnionOfTheRanksDummySharesIsTheWholeDummyModel) {
  const int P = GetParam();
  const M3Config c = test::tiny_config();
  const M3Weights whole = dummy_weights(c, 77);
  for (const auto& shares : layouts(P)) {
    std::vector<M3Weights> ranks;
    for (const RankShare& s : shares) ranks.push_back(dummy_weights(c, 77, s));
    expect_union_is_whole(c, whole, std::move(ranks), shares);
  }
}

// The bytes a rank reads are exactly its share's (fp32 file: 4 per element), so no byte of another rank's expert is
// read; and a file without those experts loads for the rank, while the whole load of it fails.
TEST_P(ShardedLoad, ARankReadsOnlyItsOwnBytesAndLoadsWithoutOtherRanksExperts) {
  const int P = GetParam();
  const M3Config c = test::tiny_config();
  const M3Weights w = test::random_weights(c, 9);
  const std::string dir = temp_dir("bytes" + std::to_string(P));
  test::write_checkpoint(c, w, dir);
  for (const auto& shares : layouts(P))
    for (const RankShare& s : shares) {
      const SafeTensors st = SafeTensors::open(dir);
      const M3Weights rw = M3Weights::load(c, st, s);
      const auto plan = rank_weight_plan(c, s);
      EXPECT_EQ(st.bytes_read(), share_bytes(plan, WeightBytes::Fp32)) << "rank " << s.rank << " of " << P;
      EXPECT_EQ(rw.bytes(), share_bytes(plan, WeightBytes::Fp32));
      for (size_t l = 0; l < rw.layers.size(); ++l)
        for (size_t e = 0; e < rw.layers[l].experts.size(); ++e)
          EXPECT_EQ(rw.layers[l].experts[e].gate_up.empty(), !s.owns_expert(int64_t(e))) << "layer " << l << " e " << e;
    }
  // Each rank against a file holding only its own experts.
  for (int r = 0; r < P; ++r) {
    const std::string own = temp_dir("own" + std::to_string(P) + "_" + std::to_string(r));
    test::write_checkpoint(c, w, own, [&](int, int e) { return e % P == r; });
    const RankShare s = RankShare::ep(r, P);
    const M3Weights rw = M3Weights::load(c, SafeTensors::open(own), s);
    const M3Weights ref = M3Weights::load(c, SafeTensors::open(dir), s);
    for (size_t l = 0; l < rw.layers.size(); ++l) {
      EXPECT_EQ(rw.layers[l].wqkv, ref.layers[l].wqkv);
      for (size_t e = 0; e < rw.layers[l].experts.size(); ++e) {
        EXPECT_EQ(rw.layers[l].experts[e].gate_up, ref.layers[l].experts[e].gate_up);
        EXPECT_EQ(rw.layers[l].experts[e].down, ref.layers[l].experts[e].down);
      }
    }
    EXPECT_THROW(M3Weights::load(c, SafeTensors::open(own)), Error);  // the whole model needs every expert
    fs::remove_all(own);
  }
  fs::remove_all(dir);
}

// Host bytes per rank: the replicated part on every rank plus 1/P of the routed experts (E = 8 experts, so P = 3
// gives ranks of 3, 3, 2 experts per layer); the ranks together hold the whole model plus P − 1 replicas.
TEST_P(ShardedLoad, MemoryPerRankIsTheReplicatedPartPlusItsExperts) {
  const int P = GetParam();
  const M3Config c = test::tiny_config();
  const M3Weights whole = dummy_weights(c, 3);
  int64_t experts = 0;  // bytes of all routed experts
  for (const auto& L : whole.layers)
    for (const auto& e : L.experts) experts += int64_t(e.gate_up.size() + e.down.size()) * 4;
  const int64_t one_expert = experts / (2 * c.num_experts);  // 2 MoE layers
  const int64_t replicated = whole.bytes() - experts;
  int64_t sum = 0;
  for (int r = 0; r < P; ++r) {
    const M3Weights rw = dummy_weights(c, 3, RankShare::ep(r, P));
    const int64_t owned = (c.num_experts - r + P - 1) / P;  // experts e ≡ r (mod P) in [0, E)
    EXPECT_EQ(rw.bytes(), replicated + 2 * owned * one_expert) << "rank " << r << " of " << P;
    EXPECT_LT(rw.bytes(), whole.bytes());
    sum += rw.bytes();
  }
  EXPECT_EQ(sum, whole.bytes() + (P - 1) * replicated);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedLoad, ::testing::Values(2, 3));

// An MXFP8 checkpoint (the golden fixture: FP8 values + UE8M0 scales): the ranks' blocks of the FP8 file, TP
// column slices of o included, reassemble the whole dequantised model, and a rank reads its e4m3 and scale bytes only.
TEST(ShardedLoadFp8, Mxfp8CheckpointSharesReassembleAndReadOnlyTheirBytes) {
  const std::string dir = "tests/golden/fixtures/tiny_sparse_mxfp8";
  const M3Config c = load_m3_config(dir + "/config.json");
  const M3Weights whole = M3Weights::load(c, SafeTensors::open(dir));
  for (const auto& shares : layouts(2)) {
    std::vector<M3Weights> ranks;
    for (const RankShare& s : shares) {
      const SafeTensors st = SafeTensors::open(dir);
      ranks.push_back(M3Weights::load(c, st, s));
      const SafeTensors all = SafeTensors::open(dir);
      (void)M3Weights::load(c, all);
      EXPECT_LT(st.bytes_read(), all.bytes_read()) << "rank " << s.rank;
    }
    expect_union_is_whole(c, whole, std::move(ranks), shares);
  }
}

TEST(ShardedLoadPlan, SharesThatDoNotFitTheConfigAreErrors) {
  const M3Config c = test::tiny_config();  // 2 KV heads, 97 vocabulary rows
  EXPECT_THROW(rank_weight_plan(c, RankShare{2, 2, true, 1, 1}), Error);  // rank outside the group
  EXPECT_THROW(rank_weight_plan(c, RankShare{0, 4, true, 4, 1}), Error);  // 2 KV heads over 4 TP ranks
  EXPECT_THROW(rank_weight_plan(c, RankShare{0, 3, true, 2, 1}), Error);  // TP 2 does not divide 3 ranks
  EXPECT_THROW(rank_weight_plan(c, RankShare{0, 2, true, 1, 3}), Error);  // 3 vocabulary parts on 2 ranks
}

// The memory line of docs/PARALLEL.md: the full M3 (models/m3-full/config.json) per rank at EP8, from the plan.
TEST(ShardedLoadPlan, FullM3BytesPerRankAtEp8) {
  const M3Config c = load_m3_config("models/m3-full/config.json");
  const auto whole = rank_weight_plan(c, RankShare{});
  auto gb = [](int64_t b) { return double(b) / 1e9; };
  struct Layout {
    const char* name;
    RankShare share;
  };
  const Layout ls[] = {{"EP8 (attention, dense, shared, router, embedding, LM head replicated)", RankShare::ep(0, 8)},
                       {"EP8 + vocabulary-parallel embedding / LM head over 8", RankShare{0, 8, true, 1, 8}},
                       {"EP8 + TP4 over KV heads + vocabulary over 4", RankShare{0, 8, true, 4, 4}}};
  for (const WeightBytes m : {WeightBytes::Bf16, WeightBytes::Fp8Bf16Experts, WeightBytes::Fp8}) {
    const char* mn = m == WeightBytes::Bf16 ? "bf16" : m == WeightBytes::Fp8 ? "fp8 (routed experts fp8)"
                                                                               : "fp8 (routed experts bf16, today)";
    std::printf("whole model %s: %.1f GB\n", mn, gb(share_bytes(whole, m)));
    for (const Layout& l : ls) {
      int64_t mx = 0, sum = 0;
      for (int r = 0; r < 8; ++r) {
        RankShare s = l.share;
        s.rank = r;
        const int64_t b = share_bytes(rank_weight_plan(c, s), m);
        mx = std::max(mx, b), sum += b;
      }
      std::printf("  %s: %.2f GB per rank (max), %.1f GB over 8 ranks\n", l.name, gb(mx), gb(sum));
      // Replicated per rank: everything but the routed experts.
      if (&l == &ls[0]) {
        int64_t experts = 0;
        for (const SlotShare& ss : whole)
          if (ss.slot.expert >= 0) experts += share_bytes({ss}, m);
        std::printf("    (replicated %.2f GB + routed experts %.2f GB per rank)\n", gb(share_bytes(whole, m) - experts),
                    gb(experts / 8));
      }
      EXPECT_LT(mx, share_bytes(whole, m) / 4);
    }
  }
  // Ranks of EP8 hold 16 of the 128 experts of each of the 57 MoE layers.
  EXPECT_EQ(rank_weight_plan(c, RankShare{}).size() - rank_weight_plan(c, RankShare::ep(3, 8)).size(),
            size_t(57 * 112 * 2));
}

}  // namespace
}  // namespace m3
