// Tensor-core union-tile MSA prefill (backend/cuda/msa_prefill_tc.cuh) against the CPU twin attention_sparse on the
// same bf16-rounded q, K and V: ragged multi-sequence steps with random non-contiguous page tables, prefix > 0,
// chunks that start mid-block, rows with fewer than top_k visible blocks (−1 padding), top_k below 16, several KV
// heads, a page stride larger than K + V; outputs poisoned and every element checked written; a selection that
// breaks the contract is reported by check().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/msa_indexer_tc.cuh"
#include "backend/cuda/msa_prefill_kvmajor.cuh"
#include "backend/cuda/msa_prefill_sparse.cuh"
#include "backend/cuda/msa_prefill_tc.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using gpu_test::Dev;
using gpu_test::expect_close;
using gpu_test::rand_vec;
using gpu_test::rng;

constexpr int kG = 16, kD = 128, kB = 128;

struct Seq {
  int prefix, len;
};

// Rounds v to bf16 in place and returns the bit patterns.
std::vector<uint16_t> to_bf16(std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    bits[i] = f32_to_bf16(v[i]);
    v[i] = bf16_to_f32(bits[i]);
  }
  return bits;
}

struct Case {
  std::vector<Seq> seqs;
  int Hkv, top_k;
};

enum class Variant { Union, Dense, KvMajor, Auto };

// Runs one step on the GPU and on the CPU; `bad_row` ≥ 0 plants a block after that row's local block; Dense: the
// dense causal mode (run_dense) against cpu::attention_dense_causal; KvMajor: the KV-block-major kernel.
// shared_prefix: every sequence's first shared_prefix pages are the same physical pages (a cached prefix), so
// queries of different sequences meet in one CSR row of the KV-block-major kernel.
// Auto: the per-tile router (msa_prefill_sparse.cuh) with threshold_pct; route_counts receives how many
// (tile, KV head) pairs went to {union, KV-block-major}.
void run_case(const Case& c, int bad_row = -1, Variant variant = Variant::Union, int shared_prefix = 0,
              int threshold_pct = 26, std::pair<int64_t, int64_t>* route_counts = nullptr) {
  const bool dense = variant == Variant::Dense;
  const int Hkv = c.Hkv, Hq = Hkv * kG, K = c.top_k;
  std::vector<int32_t> pos, row_seq, pt_indptr{0}, pt_pages;
  int total_pages = 0;
  for (const Seq& s : c.seqs) total_pages += (s.prefix + s.len + kB - 1) / kB;
  const int num_pages = total_pages + 1;  // one page nobody owns
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  int next = 0;
  for (size_t si = 0; si < c.seqs.size(); ++si) {
    const Seq& s = c.seqs[si];
    for (int i = 0; i < s.len; ++i) {
      pos.push_back(s.prefix + i);
      row_seq.push_back(int(si));
    }
    const int n = (s.prefix + s.len + kB - 1) / kB;
    for (int b = 0; b < n; ++b)
      pt_pages.push_back(si > 0 && b < shared_prefix && b < s.prefix / kB ? pt_pages[b] : perm[next++]);
    pt_indptr.push_back(int(pt_pages.size()));
  }
  const int T = int(pos.size());

  // Page unit: K [Hkv, B, D], V [Hkv, B, D], 64 elements of padding.
  const int64_t half = int64_t(Hkv) * kB * kD, stride = 2 * half + 64;
  std::vector<float> pool = rand_vec(size_t(stride * num_pages)), q = rand_vec(size_t(T) * Hq * kD);
  const std::vector<uint16_t> pool_bits = to_bf16(pool), q_bits = to_bf16(q);

  // Selection [Hkv, T, K]: history blocks in random order, local last, −1 padding.
  std::vector<int32_t> sel(size_t(Hkv) * T * K, -1);
  for (int h = 0; h < Hkv; ++h)
    for (int t = 0; t < T; ++t) {
      const int local = pos[t] / kB;
      std::vector<int32_t> hist(local);
      std::iota(hist.begin(), hist.end(), 0);
      std::shuffle(hist.begin(), hist.end(), rng());
      const int nh = std::min(K - 1, local);
      int32_t* row = &sel[(size_t(h) * T + t) * K];
      for (int i = 0; i < nh; ++i) row[i] = hist[i];
      row[nh] = local;
    }
  if (bad_row >= 0) sel[size_t(bad_row) * K] = pos[bad_row] / kB + 1;

  std::vector<float> ref(size_t(T) * Hq * kD);
  const float scale = 1.f / std::sqrt(float(kD));
  if (bad_row < 0) {
    const cpu::PagedKV ckv{pool.data(), pool.data() + half, stride, Hkv, kB, kD};
    int row0 = 0;
    for (size_t si = 0; si < c.seqs.size(); ++si) {
      const int Tq = c.seqs[si].len;
      std::vector<int32_t> s_sel(size_t(Hkv) * Tq * K);
      for (int h = 0; h < Hkv; ++h)
        std::copy_n(&sel[(size_t(h) * T + row0) * K], size_t(Tq) * K, &s_sel[size_t(h) * Tq * K]);
      if (dense)
        cpu::attention_dense_causal(&q[size_t(row0) * Hq * kD], Tq, Hq, &pos[row0], ckv, &pt_pages[pt_indptr[si]],
                                    scale, &ref[size_t(row0) * Hq * kD]);
      else
        cpu::attention_sparse(&q[size_t(row0) * Hq * kD], Tq, Hq, &pos[row0], ckv, &pt_pages[pt_indptr[si]],
                              s_sel.data(), K, scale, &ref[size_t(row0) * Hq * kD]);
      row0 += Tq;
    }
  }

  Dev<uint16_t> dpool(pool_bits), dq(q_bits);
  Dev<int32_t> dpos(pos), dseq(row_seq), dind(pt_indptr), dpages(pt_pages), dsel(sel);
  Dev<float> dout(ref.size());
  dout.poison();
  cuda::DevStepRows rows{dpos.p(), dseq.p(), dind.p(), dpages.p(), T};
  const cuda::DevPagedKVBf16 kv{dpool.p(), dpool.p() + half, stride, num_pages, Hkv, kB, kD};
  cuda::MsaPrefillUnion attn;
  cuda::MsaPrefillKvMajor kvm;
  attn.plan(T, Hkv, kG, kD, kB, K);
  cuda::MsaPrefillSparse sparse;
  if (variant == Variant::Auto) {
    sparse.plan(T, Hkv, kG, kD, kB, K, num_pages);
    sparse.set_threshold_pct(threshold_pct);
    sparse.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr);
    if (route_counts) sparse.last_route_counts(nullptr, &route_counts->first, &route_counts->second);
  } else if (variant == Variant::KvMajor) {
    kvm.plan(T, Hkv, kG, kD, kB, K, num_pages);
    kvm.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr);
    // A second run on the same plan must give the same result (the CSR counters are reset per run).
    if (bad_row < 0) {
      kvm.check(nullptr);
      const std::vector<float> first = dout.get();
      dout.poison();
      kvm.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr);
      EXPECT_EQ(dout.get(), first) << "KV-block-major: a second run differs";
      // The tile order (windows of step rows, runs of tiles per CTA) changes only the speed: each partial is one
      // (query, page) product and the combine merges slots in slot order, so the output is the same bits.
      // Likewise the number of consumer warpgroups per CTA (2 or 3) and the partial store (TMA or per lane).
      for (const auto& [window, chunk, cons, tma] : std::vector<std::tuple<int, int, int, bool>>{
               {64, 1, 3, false}, {37, 3, 2, false}, {0, 5, 3, false}, {1, 64, 2, false}, {0, 1, 2, false},
               {0, 4, 3, true}, {37, 1, 2, true}}) {
        kvm.set_order(window, chunk, cons, tma);
        dout.poison();
        kvm.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr);
        kvm.check(nullptr);
        EXPECT_EQ(dout.get(), first) << "KV-block-major: tile order window " << window << " chunk " << chunk
                                     << " consumers " << cons << " tma store " << tma << " changes the output";
      }
      kvm.set_order(0, 1);
    }
  } else if (dense) {
    attn.run_dense(dq.p(), rows, kv, scale, dout.p(), nullptr);
  } else {
    attn.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr);
  }
  if (bad_row >= 0) {
    if (variant == Variant::Auto)
      EXPECT_THROW(sparse.check(nullptr), Error);
    else if (variant == Variant::KvMajor)
      EXPECT_THROW(kvm.check(nullptr), Error);
    else
      EXPECT_THROW(attn.check(nullptr), Error);
    return;
  }
  attn.check(nullptr);
  if (variant == Variant::KvMajor) kvm.check(nullptr);
  if (variant == Variant::Auto) sparse.check(nullptr);
  std::string shape = "T=" + std::to_string(T) + " Hkv=" + std::to_string(Hkv) + " K=" + std::to_string(K) + " seqs";
  for (const Seq& s : c.seqs) shape += " " + std::to_string(s.prefix) + "+" + std::to_string(s.len);
  const char* name = variant == Variant::Dense     ? "dense_prefill_tc bf16"
                     : variant == Variant::KvMajor ? "msa_prefill_kvmajor bf16"
                     : variant == Variant::Auto    ? "msa_prefill_routed bf16"
                                                   : "msa_prefill_union bf16";
  std::vector<float> got = dout.get();
  expect_close(name, shape, got, ref, 1e-2);

  // The bf16 output mode (what the executor feeds the O projection) is the fp32 result rounded to nearest even,
  // bit for bit, with the same routing / kernels.
  Dev<uint16_t> dob(ref.size());
  dob.poison();
  if (variant == Variant::Auto)
    sparse.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr, dob.p());
  else if (variant == Variant::KvMajor)
    kvm.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr, nullptr, nullptr, dob.p());
  else if (dense)
    attn.run_dense(dq.p(), rows, kv, scale, dout.p(), nullptr, dob.p());
  else
    attn.run(dq.p(), dsel.p(), rows, kv, scale, dout.p(), nullptr, nullptr, dob.p());
  EXPECT_EQ(dob.get(), to_bf16(got)) << name << " " << shape << ": bf16 output is not the rounded fp32 output";
}

TEST(GpuMsaPrefillTc, UnionTileMatchesCpuOnRaggedStepsWithPrefixAndPadding) {
  M3_SKIP_WITHOUT_GPU();
  run_case({{{0, 300}}, 4, 16});                             // every row sees ≤ 3 blocks: −1 padding throughout
  run_case({{{5000, 77}, {0, 1}, {2304, 250}}, 2, 16});     // ragged, mid-block start, a 1-row sequence
  run_case({{{20000, 129}}, 1, 8});                          // top_k 8 of 157 blocks
  run_case({{{3 * 128 + 5, 40}, {16 * 128, 300}}, 4, 16});  // rows crossing the 16-block boundary
}

TEST(GpuMsaPrefillTc, DenseCausalModeMatchesCpuOnRaggedStepsWithPrefix) {
  M3_SKIP_WITHOUT_GPU();
  run_case({{{0, 300}}, 4, 16}, -1, Variant::Dense);                          // from position 0, partial last page
  run_case({{{5000, 77}, {0, 1}, {2304, 250}}, 2, 16}, -1, Variant::Dense);  // ragged: tiles that span two sequences
  run_case({{{20000, 129}}, 1, 16}, -1, Variant::Dense);                     // 157 pages per row
}

TEST(GpuMsaPrefillTc, KvBlockMajorMatchesCpuOnRaggedStepsWithPrefixAndPadding) {
  M3_SKIP_WITHOUT_GPU();
  const Variant v = Variant::KvMajor;
  run_case({{{0, 300}}, 4, 16}, -1, v);                             // −1 padding; rows with 1–3 queries per page
  run_case({{{5000, 77}, {0, 1}, {2304, 250}}, 2, 16}, -1, v);     // ragged, mid-block start, a 1-row sequence
  run_case({{{20000, 129}}, 1, 8}, -1, v);                          // top_k 8 of 157 blocks
  run_case({{{3 * 128 + 5, 40}, {16 * 128, 300}}, 4, 16}, -1, v);  // rows crossing the 16-block boundary
  run_case({{{0, 2000}}, 2, 16}, -1, v);                            // hot pages: > 100 queries (many tiles) per row
}

TEST(GpuMsaPrefillTc, KvBlockMajorServesSharedPrefixPagesOfSeveralSequencesInOneRow) {
  M3_SKIP_WITHOUT_GPU();
  run_case({{{1024, 100}, {1024, 60}, {1500, 33}}, 2, 16}, -1, Variant::KvMajor, /*shared_prefix=*/8);
}

TEST(GpuMsaPrefillTc, KvBlockMajorReportsABlockAfterTheLocalBlock) {
  M3_SKIP_WITHOUT_GPU();
  run_case({{{1000, 20}}, 1, 16}, /*bad_row=*/5, Variant::KvMajor);
}

TEST(GpuMsaPrefillTc, RouterSendsWideUnionTilesToKvBlockMajorAndNarrowOnesToUnionTile) {
  M3_SKIP_WITHOUT_GPU();
  // Rows of the short sequence select every block they can see (narrow unions); the 20k-context rows pick 15
  // random history blocks each (wide unions): one step holds both kinds, each kernel writes only its own rows.
  std::pair<int64_t, int64_t> counts{0, 0};
  run_case({{{0, 300}, {20000, 129}}, 2, 16}, -1, Variant::Auto, 0, 26, &counts);
  EXPECT_GT(counts.first, 0) << "no tile routed to the union-tile kernel";
  EXPECT_GT(counts.second, 0) << "no tile routed to the KV-block-major kernel";
  // Threshold 0: every tile whose union exceeds top_k pages goes to KV-block-major; the short sequence's 37 full
  // tiles (unions of ≤ 3 pages) stay union tiles by the rule's absolute term, for each of the 2 KV heads.
  run_case({{{0, 300}, {20000, 129}}, 2, 16}, -1, Variant::Auto, 0, 0, &counts);
  EXPECT_EQ(counts.first, 2 * 37);
  run_case({{{0, 300}, {20000, 129}}, 2, 16}, -1, Variant::Auto, 0, 1 << 20, &counts);  // every tile union
  EXPECT_EQ(counts.second, 0);
  run_case({{{5000, 77}, {0, 1}, {2304, 250}}, 2, 16}, -1, Variant::Auto);  // ragged tiles across sequences
}

// Host side of the router shortcut (MsaPrefillSparse::union_only): only steps whose every row has a fixed
// selection (local + 1 ≤ top_k) and whose tiles' union bound passes the route rule skip the router.
TEST(GpuMsaPrefillTc, StepsOfShortRowsWithNarrowUnionsSkipTheRouter) {
  using S = cuda::MsaPrefillSparse;
  auto iota_pos = [](int from, int n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), from);
    return p;
  };
  // One sequence, positions 0 … 2047: every row's 1 … 16 blocks are all selected, a tile's rows share them.
  EXPECT_TRUE(S::union_only(iota_pos(0, 2048), std::vector<int32_t>(2048, 0), kB, 16, 26));
  // Position 2048 has 17 blocks: the indexer chooses 16 of them, so only the device can route that tile.
  EXPECT_FALSE(S::union_only(iota_pos(0, 2049), std::vector<int32_t>(2049, 0), kB, 16, 26));
  EXPECT_FALSE(S::union_only(iota_pos(1000, 20), std::vector<int32_t>(20, 0), kB, 4, 26));  // top_k 4 < 8 blocks
  // Eight one-row sequences at position 0 in one tile: 8 distinct pages for 8 entries (100 % > 26 %), but a union
  // of ≤ top_k pages stays a union tile; at position 300 (3 blocks each) the bound is 24 pages for 24 entries.
  EXPECT_TRUE(S::union_only(std::vector<int32_t>(8, 0), iota_pos(0, 8), kB, 16, 26));
  EXPECT_FALSE(S::union_only(std::vector<int32_t>(8, 300), iota_pos(0, 8), kB, 16, 26));
  // Two sequences of 4 rows at local 8: union ≤ 18 pages for 72 entries (25 % ≤ 26 %); at threshold 24 not.
  const std::vector<int32_t> two_pos = {1100, 1101, 1102, 1103, 1100, 1101, 1102, 1103};
  const std::vector<int32_t> two_seq = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_TRUE(S::union_only(two_pos, two_seq, kB, 16, 26));
  EXPECT_FALSE(S::union_only(two_pos, two_seq, kB, 16, 24));
  EXPECT_FALSE(S::union_only({5, -1}, {0, 0}, kB, 16, 26));  // a bad position is the device's to report
  EXPECT_TRUE(S::union_only({}, {}, kB, 16, 26));
  // One sequence, rows at blocks 1, 2 and 12: 12 pages (≤ top_k) for 43 entries.
  EXPECT_TRUE(S::union_only({0, 1, 2, 130, 131, 1500, 1501, 1502}, std::vector<int32_t>(8, 0), kB, 16, 26));
}

// The executor's plan with the step's rows: a short step runs the union kernel alone (no route), long ones keep Auto;
// the output is what the routed run gives.
TEST(GpuMsaPrefillTc, ShortStepPlannedWithItsRowsRunsTheUnionKernelAlone) {
  M3_SKIP_WITHOUT_GPU();
  cuda::MsaPrefillSparse sp;
  // Rows at local 11: 12 pages for 96 entries (12.5 %).
  const std::vector<int32_t> short_pos = {1500, 1501, 1502, 1503, 1504, 1505, 1506, 1507}, seq(8, 0);
  sp.plan(8, 4, kG, kD, kB, 16, 64, cuda::MsaPrefillSparse::Mode::Auto, &short_pos, &seq);
  EXPECT_EQ(sp.step_mode(), cuda::MsaPrefillSparse::Mode::Union);
  const std::vector<int32_t> long_pos = {1500, 1501, 1502, 1503, 1504, 1505, 1506, 5000};
  sp.plan(8, 4, kG, kD, kB, 16, 64, cuda::MsaPrefillSparse::Mode::Auto, &long_pos, &seq);
  EXPECT_EQ(sp.step_mode(), cuda::MsaPrefillSparse::Mode::Auto);
  sp.plan(8, 4, kG, kD, kB, 16, 64);  // no rows given: the device routes
  EXPECT_EQ(sp.step_mode(), cuda::MsaPrefillSparse::Mode::Auto);
}

TEST(GpuMsaPrefillTc, RoutedPrefillReportsABlockAfterTheLocalBlock) {
  M3_SKIP_WITHOUT_GPU();
  run_case({{{1000, 20}}, 1, 16}, /*bad_row=*/5, Variant::Auto);
}

// Tensor-core prefill indexer (msa_indexer_tc.cuh) against cpu::msa_block_scores on the same bf16-rounded iq and
// index keys: ragged multi-sequence steps, prefix > 0, tiles cut at sequence boundaries, 4, 2 and 1 index heads, a
// page stride larger than a page. Every score is checked: −inf exactly where the CPU has −inf.
// The fused top-k (run_topk, both pipelines, each top_k in `top_ks`) is checked against cpu::msa_topk:
//  - on the GPU's own score matrix (run()): identical selections, always;
//  - on the CPU twin's scores: identical for IndexData::Ties (values in {−½, 0, ½}: every dot product is exact in
//    fp32, so the scores are bit-identical and most blocks tie — the lower-id rule decides); for Random data a
//    differing row is accepted only where the CPU scores of the differing blocks are within fp32 summation-order
//    noise of the row's (K − 1)-th best score (the tie note of docs/KERNELS.md §8.3).
// nan_rows plants a NaN in that many (token, head) query rows: every score of the row is −inf (fmaxf and std::max
// drop NaN dot products), so the row selects blocks 0 .. K − 2 by the lower-id rule.
enum class IndexData { Random, Ties };
int64_t split_rows_seen = 0;  // (token, head) rows ranked through split tiles + merge, over the cases run

void run_indexer_case(const std::vector<Seq>& seqs, int Hi, std::vector<int> top_ks = {16},
                      IndexData data = IndexData::Random, int nan_rows = 0) {
  constexpr int Di = 128;
  std::vector<int32_t> pos, row_seq, pt_indptr{0}, pt_pages;
  int total_pages = 0;
  for (const Seq& s : seqs) total_pages += (s.prefix + s.len + kB - 1) / kB;
  const int num_pages = total_pages + 2;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  int next = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    for (int i = 0; i < seqs[si].len; ++i) {
      pos.push_back(seqs[si].prefix + i);
      row_seq.push_back(int(si));
    }
    const int n = (seqs[si].prefix + seqs[si].len + kB - 1) / kB;
    for (int b = 0; b < n; ++b) pt_pages.push_back(perm[next++]);
    pt_indptr.push_back(int(pt_pages.size()));
  }
  const int T = int(pos.size());
  const int64_t stride = int64_t(kB) * Di + 256;  // page [B, Di] + padding
  std::vector<float> ik, iq;
  if (data == IndexData::Ties) {
    std::uniform_int_distribution<int> u(-1, 1);
    ik.resize(size_t(stride * num_pages)), iq.resize(size_t(T) * Hi * Di);
    for (float& x : ik) x = 0.5f * float(u(rng()));
    for (float& x : iq) x = 0.5f * float(u(rng()));
  } else {
    ik = rand_vec(size_t(stride * num_pages)), iq = rand_vec(size_t(T) * Hi * Di);
  }
  std::vector<uint16_t> ik_bits = to_bf16(ik), iq_bits = to_bf16(iq);
  for (int i = 0; i < nan_rows; ++i) {
    const size_t r = size_t(rng()() % uint64_t(T * Hi));
    iq[r * Di + 7] = NAN;
    iq_bits[r * Di + 7] = 0x7FC0;
  }

  cuda::MsaIndexerTc idx;
  idx.plan(pos, row_seq, Hi, Di, kB, nullptr);
  const int64_t cols = idx.max_cols();
  std::vector<float> ref(size_t(Hi) * T * cols, -INFINITY);
  int row0 = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const int n = seqs[si].len;
    std::vector<float> one(size_t(Hi) * n * cols);
    cpu::msa_block_scores(&iq[size_t(row0) * Hi * Di], n, Hi, &pos[size_t(row0)], cpu::PagedIndexK{ik.data(), stride, kB, Di},
                          &pt_pages[size_t(pt_indptr[si])], cols, one.data());
    for (int h = 0; h < Hi; ++h)
      std::copy_n(&one[size_t(h) * n * cols], size_t(n) * cols, &ref[(size_t(h) * T + row0) * cols]);
    row0 += n;
  }
  Dev<uint16_t> dik(ik_bits), diq(iq_bits);
  Dev<int32_t> dpos(pos), dseq(row_seq), dind(pt_indptr), dpages(pt_pages);
  Dev<float> dout(ref.size());
  dout.poison();
  const cuda::DevStepRows rows{dpos.p(), dseq.p(), dind.p(), dpages.p(), T};
  idx.run(diq.p(), dik.p(), stride, num_pages, rows, dout.p(), nullptr);
  const std::vector<float> out = dout.get();
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      bad += !(std::isinf(out[i]) && out[i] < 0);
    } else {
      const double e = std::fabs(double(out[i]) - ref[i]) / std::max(1.0, std::fabs(double(ref[i])));
      worst = std::max(worst, e);
      bad += !(e <= 1e-4);
    }
  }
  std::printf("[gpu-op] msa_indexer_tc bf16 T=%d Hi=%d cols=%lld worst rel %.3g bad %zu of %zu\n", T, Hi,
              (long long)cols, worst, bad, ref.size());
  EXPECT_EQ(bad, 0u);
  if (data == IndexData::Ties) {
    EXPECT_EQ(out, ref) << "exact data: scores must be bit-identical";
  }

  // Row-wise CPU top-k: pos is per step row, so run cpu::msa_topk with the step's positions on the whole matrix.
  for (int K : top_ks) {
    std::vector<int32_t> want_gpu(size_t(Hi) * T * K), want_cpu(want_gpu.size());
    cpu::msa_topk(out.data(), T, Hi, pos.data(), kB, cols, K, want_gpu.data());
    cpu::msa_topk(ref.data(), T, Hi, pos.data(), kB, cols, K, want_cpu.data());
    // target 0: the default plan (long tiles of a small step are split, candidates merged); 1: never split.
    for (int v = 0; v < 4; ++v) {
      const int target = v / 2;
      const auto pipe = v % 2 ? cuda::MsaIndexerTc::TopKPipeline::Overlap : cuda::MsaIndexerTc::TopKPipeline::Serial;
      cuda::MsaIndexerTc fidx;
      fidx.set_target_ctas(target);
      fidx.plan(pos, row_seq, Hi, Di, kB, nullptr);
      if (target == 1) {
        EXPECT_EQ(fidx.num_split_rows(), 0);
      }
      if (target == 0) split_rows_seen += fidx.num_split_rows();
      Dev<int32_t> dsel(want_gpu.size());
      dsel.poison(0x7F);
      fidx.run_topk(diq.p(), dik.p(), stride, num_pages, rows, K, dsel.p(), nullptr, pipe);
      const std::vector<int32_t> sel = dsel.get();
      char pname[96];
      std::snprintf(pname, sizeof pname, "%s, %d items, %d split rows",
                    pipe == cuda::MsaIndexerTc::TopKPipeline::Serial ? "serial" : "overlap", fidx.num_items(),
                    fidx.num_split_rows());
      size_t diff_gpu = 0, diff_cpu = 0, unexplained = 0;
      for (int64_t r = 0; r < int64_t(Hi) * T; ++r) {
        const int32_t* a = &sel[size_t(r * K)];
        diff_gpu += !std::equal(a, a + K, &want_gpu[size_t(r * K)]);
        const int32_t* c = &want_cpu[size_t(r * K)];
        if (std::equal(a, a + K, c)) continue;
        ++diff_cpu;
        // Explained only by near-ties at the cut: every block in exactly one of the two lists scores (CPU) within
        // noise of the row's (K − 1)-th best CPU score.
        const float* sr = &ref[size_t(r) * cols];
        const int local = pos[size_t(r % T)] / kB;
        std::vector<float> keys(sr, sr + local);
        std::sort(keys.begin(), keys.end(), std::greater<float>());
        const float cut = keys.size() >= size_t(K - 1) && K > 1 ? keys[size_t(K - 2)] : 0.f;
        std::vector<int32_t> x(a, a + K), y(c, c + K), sd;
        std::sort(x.begin(), x.end()), std::sort(y.begin(), y.end());
        std::set_symmetric_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(sd));
        for (int32_t b : sd)
          if (b < 0 || b >= local || !(std::fabs(sr[b] - cut) <= 2e-4 * std::max(1.f, std::fabs(cut)))) {
            ++unexplained;
            break;
          }
      }
      std::printf("[gpu-op] msa_indexer_tc run_topk (%s) K=%d: rows %lld, differ from topk(gpu scores) %zu, from "
                  "topk(cpu scores) %zu (unexplained %zu)\n",
                  pname, K, (long long)(int64_t(Hi) * T), diff_gpu, diff_cpu, unexplained);
      EXPECT_EQ(diff_gpu, 0u) << pname << " K=" << K;
      if (data == IndexData::Ties) {
        EXPECT_EQ(diff_cpu, 0u) << pname << " K=" << K;
      }
      EXPECT_EQ(unexplained, 0u) << pname << " K=" << K;
    }
  }
}

TEST(GpuMsaPrefillTc, TensorCoreIndexerMatchesCpuBlockScoresOnRaggedSteps) {
  M3_SKIP_WITHOUT_GPU();
  run_indexer_case({{0, 300}}, 4);                              // rows of the first blocks: few or no history columns
  run_indexer_case({{5000, 77}, {0, 1}, {2304, 250}}, 4);       // ragged: tiles cut at sequence boundaries
  run_indexer_case({{20000, 129}}, 2, {16, 8});                 // 156 history pages, 64 tokens per tile
  run_indexer_case({{3 * 128 + 5, 40}, {16 * 128, 300}}, 4);    // rows around n = K (local 15, 16, 17)
  run_indexer_case({{9000, 200}}, 1, {16, 3});                  // one index head: 128 tokens per tile
}

TEST(GpuMsaPrefillTc, FusedTopKMatchesCpuTwinOnTiedScores) {
  M3_SKIP_WITHOUT_GPU();
  // Exact data: most blocks tie, the lower-id rule decides; ragged batch with short rows and a one-token sequence.
  run_indexer_case({{4000, 200}, {1900, 100}, {0, 1}, {0, 50}, {2047, 3}}, 4, {16, 1, 2, 5}, IndexData::Ties);
  run_indexer_case({{30000, 64}}, 2, {16, 15}, IndexData::Ties);  // 234 history pages per row
}

TEST(GpuMsaPrefillTc, FusedTopKSplitsLongTilesOfSmallStepsAndMergesLikeCpuTwin) {
  M3_SKIP_WITHOUT_GPU();
  // Few tokens, long context: one or a few tiles of hundreds of pages are cut into page ranges (candidates + merge).
  split_rows_seen = 0;
  run_indexer_case({{40000, 7}}, 4, {16, 2}, IndexData::Ties);             // one tile, 312 pages
  run_indexer_case({{17000, 40}, {0, 5}, {9000, 33}}, 4, {16}, IndexData::Ties);
  run_indexer_case({{25000, 90}}, 4, {16, 9});                              // random data, 3 tiles
  EXPECT_GT(split_rows_seen, 0) << "no case exercised the split + merge path";
}

TEST(GpuMsaPrefillTc, FusedTopKRanksNanRowsLikeCpuTwin) {
  M3_SKIP_WITHOUT_GPU();
  run_indexer_case({{6000, 96}, {300, 20}}, 4, {16, 4}, IndexData::Ties, /*nan_rows=*/9);
}

TEST(GpuMsaPrefillTc, TensorCoreIndexerRefusesUnsupportedShapes) {
  M3_SKIP_WITHOUT_GPU();
  cuda::MsaIndexerTc idx;
  const std::vector<int32_t> pos{0, 1}, seq{0, 0};
  EXPECT_THROW(idx.plan(pos, seq, 3, 128, 128, nullptr), Error);  // 128 % 3 != 0
  EXPECT_THROW(idx.plan(pos, seq, 4, 64, 128, nullptr), Error);   // index dim 64
  idx.plan(pos, seq, 4, 128, 128, nullptr);
  const cuda::DevStepRows rows{nullptr, nullptr, nullptr, nullptr, 2};
  EXPECT_THROW(idx.run_topk(nullptr, nullptr, 128 * 128, 1, rows, 17, nullptr, nullptr), Error);  // top_k 17
  EXPECT_THROW(idx.run_topk(nullptr, nullptr, 128 * 128, 1, rows, 0, nullptr, nullptr), Error);   // top_k 0
}

TEST(GpuMsaPrefillTc, UnionTileReportsABlockAfterTheLocalBlock) {
  M3_SKIP_WITHOUT_GPU();
  run_case({{{1000, 20}}, 1, 16}, /*bad_row=*/5);
}

TEST(GpuMsaPrefillTc, UnionTileRefusesUnsupportedShapes) {
  M3_SKIP_WITHOUT_GPU();
  cuda::MsaPrefillUnion attn;
  EXPECT_THROW(attn.plan(10, 4, 8, 128, 128, 16), Error);   // group 8
  EXPECT_THROW(attn.plan(10, 4, 16, 64, 128, 16), Error);   // head_dim 64
  EXPECT_THROW(attn.plan(10, 4, 16, 128, 128, 32), Error);  // top_k 32
  cuda::MsaPrefillKvMajor kvm;
  EXPECT_THROW(kvm.plan(10, 4, 8, 128, 128, 16, 100), Error);         // group 8
  EXPECT_THROW(kvm.plan(10, 4, 16, 128, 128, 17, 100), Error);        // top_k 17
  EXPECT_THROW(kvm.plan(int64_t(1) << 24, 4, 16, 128, 128, 16, 100), Error);  // T ≥ 2^24 (packed CSR entries)
}

}  // namespace
}  // namespace m3
