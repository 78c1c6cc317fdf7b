// The bf16 and e4m3 tensor-core decode kernels (issues 11, 15) against their CPU twins: paged decode attention (sparse and dense
// page lists, G 16 and 8, with and without split-K, ragged and mixed contexts) and the decode index scorer fused with
// top-k and the page-list emit, and the multi-query decode (PagedDecodeMq: Q rows of a request over the union of their
// pages) against the CPU twin and the per-row kernel. Checks live in decode_tc_checks.h (tools/bench_decode runs them too).
#include <gtest/gtest.h>

#include "decode_tc_checks.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using decode_check::Result;

uint64_t seed() { return gpu_test::rng()(); }

void expect_ok(const Result& r, const char* name) {
  std::printf("[gpu-op] %s: max|err| %.3g / max|ref| %.3g (vs per-row kernel %.3g), %lld bad\n", name, r.max_err,
              r.max_ref, r.max_err_rowwise, (long long)r.bad);
  EXPECT_EQ(r.bad, 0) << r.what;
}

// Mixed contexts: short rows (fewer than 16 blocks, partial last page), exact page multiples, long rows.
const std::vector<int32_t> kMixed = {0, 5, 127, 128, 1000, 2047, 2048, 5000, 16383, 70000};

TEST(GpuDecode, PagedDecodeSparseG16MatchesCpuWithSplits) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_paged_decode(seed(), kMixed, 4, 16, true, true), "paged_decode_tc sparse G16 split");
}

TEST(GpuDecode, PagedDecodeSparseG16MatchesCpuWithoutSplits) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_paged_decode(seed(), kMixed, 4, 16, true, false), "paged_decode_tc sparse G16");
}

TEST(GpuDecode, PagedDecodeWidePipelineMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  // 40 rows × 4 KV heads = 160 requests > #SMs: the wide pipeline. Histories ≤ 6.8k tokens (1,100 pages): the CPU side
  // draws every page of every row, and 67k-token rows (1.4·10^9 values) outran a device time limit.
  std::vector<int32_t> pos;
  for (int i = 0; i < 40; ++i) pos.push_back(97 + 173 * i);
  expect_ok(decode_check::check_paged_decode(seed(), pos, 4, 16, true, true), "paged_decode_tc sparse G16 wide");
}

// 24 rows × 4 KV heads = 96 requests (#SMs / 2 < R ≤ #SMs on an H200): the deep pipeline (with M3_DECODE_PAIR=1 its
// pair loop, two chunks per iteration), rows of an odd chunk count (a zero-filled last stage) and 1-token last pages.
TEST(GpuDecode, PagedDecodeDeepPipelineMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  std::vector<int32_t> pos;
  for (int i = 0; i < 24; ++i)
    pos.push_back(i % 3 == 0 ? 64 * (2 * i + 1) - 1 : i % 3 == 1 ? 128 * (i + 1) : 1 + 97 * i);
  expect_ok(decode_check::check_paged_decode(seed(), pos, 4, 16, true, false), "paged_decode_tc sparse G16 deep");
}

TEST(GpuDecode, PagedDecodeSparseG8MatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_paged_decode(seed(), kMixed, 1, 8, true, true), "paged_decode_tc sparse G8 (TP8)");
}

TEST(GpuDecode, PagedDecodeDenseHistoryMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_paged_decode(seed(), {3, 300, 4000, 9000}, 4, 16, false, true),
            "paged_decode_tc dense");
}

// A few long requests (dense decode at B = 1–2): R·16 ≤ #SMs and ≥ 64 chunks take deep CTAs in non-portable
// clusters of 16 splits; the second case has a 6-token row whose splits are nearly all empty (LSE −inf merges).
TEST(GpuDecode, PagedDecodeDenseFewLongRequestsSplitSixteenWaysMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_paged_decode(seed(), {9000}, 4, 16, false, true), "paged_decode_tc dense R=4");
  expect_ok(decode_check::check_paged_decode(seed(), {20000, 5}, 2, 16, false, true), "paged_decode_tc dense R=4 ragged");
}

// The two schedules of PagedDecodeTc forced where the plan would pick the other (the plan takes balanced for ≥ 32
// requests): balanced over 10 requests (G 8, one KV head) and over 16 dense lists of 1–71 pages (requests cut into
// many parts, a CTA range holding whole requests between two cut ones, last pages with ≤ 64 tokens so a range can
// start on an empty half page), and the cluster schedule with splits over the mixed rows (40 requests).
TEST(GpuDecode, PagedDecodeBalancedScheduleMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  constexpr int kBalanced = 2;
  expect_ok(decode_check::check_paged_decode(seed(), kMixed, 1, 8, true, true, 16, kBalanced),
            "paged_decode_tc balanced G8, 10 requests");
  expect_ok(decode_check::check_paged_decode(seed(), {3, 300, 4000, 9000}, 4, 16, false, true, 16, kBalanced),
            "paged_decode_tc balanced dense");
  expect_ok(decode_check::check_paged_decode(seed(), kMixed, 4, 16, true, true, 16, kBalanced),
            "paged_decode_tc balanced sparse G16");
}

TEST(GpuDecode, PagedDecodeClusterScheduleWithSplitsMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  constexpr int kCluster = 1;
  expect_ok(decode_check::check_paged_decode(seed(), kMixed, 4, 16, true, true, 16, kCluster),
            "paged_decode_tc cluster split");
}

// Multi-query requests: last positions (short rows, rows straddling a page boundary so their last pages differ,
// long rows) and a Q per request cycling through 1, 2, 4, 8, 3.
const std::vector<int32_t> kMqLast = {3, 129, 130, 1000, 2050, 5000, 16383, 16385, 70000, 128 * 40 + 1};
std::vector<int> mq_qs(size_t n, std::vector<int> cycle = {1, 2, 4, 8, 3}) {
  std::vector<int> q;
  for (size_t i = 0; i < n; ++i) q.push_back(cycle[i % cycle.size()]);
  return q;
}

TEST(GpuDecode, MultiQueryOverlappingSelectionsMatchCpuAndPerRowKernel) {
  M3_SKIP_WITHOUT_GPU();
  using decode_check::MqSelection;
  expect_ok(decode_check::check_paged_decode_mq(seed(), kMqLast, mq_qs(kMqLast.size()), 4, 16, MqSelection::kOverlap,
                                                true),
            "paged_decode_mq overlap split");
  expect_ok(decode_check::check_paged_decode_mq(seed(), kMqLast, mq_qs(kMqLast.size(), {8, 4, 2, 1}), 4, 16,
                                                MqSelection::kOverlap, false),
            "paged_decode_mq overlap nosplit");
}

TEST(GpuDecode, MultiQueryRandomSelectionsMatchCpuAndPerRowKernel) {
  M3_SKIP_WITHOUT_GPU();
  using decode_check::MqSelection;
  expect_ok(decode_check::check_paged_decode_mq(seed(), kMqLast, mq_qs(kMqLast.size()), 4, 16, MqSelection::kRandom,
                                                true),
            "paged_decode_mq random split");
  expect_ok(decode_check::check_paged_decode_mq(seed(), kMqLast, mq_qs(kMqLast.size(), {8}), 1, 8,
                                                MqSelection::kRandom, true),
            "paged_decode_mq random G8 Q8");
}

TEST(GpuDecode, MultiQueryManyRequestsAndDenseListsMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  using decode_check::MqSelection;
  std::vector<int32_t> last;  // 40 requests × 4 KV heads = 160 CTAs > #SMs: no split, a second wave
  for (int i = 0; i < 40; ++i) last.push_back(2100 + 1733 * i);
  expect_ok(decode_check::check_paged_decode_mq(seed(), last, mq_qs(last.size(), {4, 8}), 4, 16,
                                                MqSelection::kOverlap, true),
            "paged_decode_mq overlap 40 requests");
  // Dense lists (all blocks 0..local): Q · (local + 1) ≤ 128 entries.
  expect_ok(decode_check::check_paged_decode_mq(seed(), {5, 200, 1000, 1900}, {8, 8, 2, 8}, 4, 16,
                                                MqSelection::kDense, true),
            "paged_decode_mq dense Q8");
  expect_ok(decode_check::check_paged_decode_mq(seed(), {100, 3000, 4000}, {4, 4, 4}, 4, 16, MqSelection::kDense,
                                                false),
            "paged_decode_mq dense Q4 32 pages");
}

TEST(GpuDecode, DecodeIndexScoresTopkAndPageListMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_decode_index(seed(), kMixed, 4), "msa_decode_index H4");
}

// The work split at the benchmark's small batch (8 rows × 127 history pages over 2 CTAs per SM: 3–4 pages per CTA,
// rows cut across CTAs) and many short rows (several rows per CTA, 16–40 history pages each).
TEST(GpuDecode, DecodeIndexSmallBatchAndManyShortRowsMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_decode_index(seed(), std::vector<int32_t>(8, 16383), 4), "msa_decode_index B8 16k");
  std::vector<int32_t> many;
  for (int i = 0; i < 300; ++i) many.push_back(2048 + 11 * i);
  expect_ok(decode_check::check_decode_index(seed(), many, 4), "msa_decode_index 300 short rows");
}

TEST(GpuDecode, DecodeIndexBreaksExactTiesByLowerBlock) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_decode_index_ties(seed(), {16383, 2100, 5000, 70000}, 4, 5), "ties period 5");
  expect_ok(decode_check::check_decode_index_ties(seed(), {16383, 40000}, 1, 1), "ties period 1 (all equal)");
}

// The top-k takes a radix select for short rows (≤ 128 history blocks by default; up to 512 with the wider register
// variant, set_radix_max) and an insertion network above: rows at each side of both boundaries, with distinct scores,
// with ties every 3 blocks, and with fewer picks (top_k 2, 9) — the ballot order writes ascending ids and breaks ties
// by the lower block. Run with the default limit and with 512 (both radix widths).
TEST(GpuDecode, DecodeIndexTopkAtTheRadixRowLengthBoundariesMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> edges = {128 * 128 + 127, 128 * 129, 128 * 512 + 127, 128 * 513, 128 * 16 + 3};
  for (const int rmax : {-1, 512}) {
    const std::string w = rmax < 0 ? " (default radix limit)" : " (radix up to 512 blocks)";
    expect_ok(decode_check::check_decode_index(seed(), edges, 4, 16, 4, rmax), ("radix edges H4" + w).c_str());
    expect_ok(decode_check::check_decode_index_ties(seed(), edges, 4, 3, rmax), ("radix edges ties period 3" + w).c_str());
    expect_ok(decode_check::check_decode_index(seed(), edges, 2, 2, 4, rmax), ("radix edges top_k 2" + w).c_str());
    expect_ok(decode_check::check_decode_index(seed(), edges, 3, 9, 2, rmax), ("radix edges top_k 9" + w).c_str());
  }
}

TEST(GpuDecode, DecodeIndexOneHeadMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_decode_index(seed(), {2100, 40000, 130000}, 1, 16, 1), "msa_decode_index H1");
}

// FP8 (e4m3) caches (issue 15 item 4): the quantiser bit for bit against its CPU twin, the kernels' e4m3
// instantiations against the CPU twins on the dequantised values, and the accuracy cost against the bf16 cache.
TEST(GpuDecode, PagedDecodeFp8MatchesCpuOnDequantisedValues) {
  M3_SKIP_WITHOUT_GPU();
  for (bool split : {true, false}) {
    decode_check::Fp8Accuracy acc;
    expect_ok(decode_check::check_paged_decode_fp8(seed(), kMixed, 4, 16, true, split, &acc),
              split ? "paged_decode_tc e4m3 sparse G16 split" : "paged_decode_tc e4m3 sparse G16 nosplit");
    std::printf("[gpu-op] e4m3 attention rel. L2 vs fp32 over bf16 values: %.3g (bf16 cache %.3g); vs bf16 cache "
                "output %.3g; vs own twin %.3g\n",
                acc.attn_rel_l2_fp8, acc.attn_rel_l2_bf16, acc.attn_rel_l2_fp8_vs_bf16, acc.attn_rel_l2_vs_twin);
    EXPECT_LT(acc.attn_rel_l2_fp8_vs_bf16, 0.1);  // e4m3 rounding: ≈ 2^−4 per value at worst, averaged
  }
  expect_ok(decode_check::check_paged_decode_fp8(seed(), kMixed, 1, 8, true, true), "paged_decode_tc e4m3 G8");
  expect_ok(decode_check::check_paged_decode_fp8(seed(), {3, 300, 4000, 9000}, 4, 16, false, true),
            "paged_decode_tc e4m3 dense");
  std::vector<int32_t> wide;  // 160 requests > #SMs: the wide pipeline
  for (int i = 0; i < 40; ++i) wide.push_back(97 + 173 * i);
  expect_ok(decode_check::check_paged_decode_fp8(seed(), wide, 4, 16, true, true), "paged_decode_tc e4m3 wide");
  // 96 requests (#SMs / 2 < R ≤ #SMs on an H200): the deep pipeline, one CTA per request; lengths with an odd chunk
  // count (the e4m3 pair loop's zero-filled last stage) and a last page of 1 token.
  std::vector<int32_t> deep;
  for (int i = 0; i < 24; ++i)
    deep.push_back(i % 3 == 0 ? 64 * (2 * i + 1) - 1 : i % 3 == 1 ? 128 * (i + 1) : 1 + 97 * i);
  expect_ok(decode_check::check_paged_decode_fp8(seed(), deep, 4, 16, true, false), "paged_decode_tc e4m3 deep");
}

TEST(GpuDecode, DecodeIndexFp8MatchesCpuOnDequantisedValues) {
  M3_SKIP_WITHOUT_GPU();
  decode_check::Fp8Accuracy acc;
  expect_ok(decode_check::check_decode_index_fp8(seed(), kMixed, 4, &acc), "msa_decode_index e4m3 H4");
  std::printf("[gpu-op] e4m3 index-K: %.1f %% of %lld ranked (row, head) selections identical to bf16's, %.1f %% of "
              "blocks shared\n",
              100 * acc.sel_identical, (long long)acc.sel_rows, 100 * acc.sel_blocks_shared);
  expect_ok(decode_check::check_decode_index_fp8(seed(), {2100, 40000, 130000}, 1, nullptr, 0.f, 16, 1),
            "msa_decode_index e4m3 H1");
  expect_ok(decode_check::check_decode_index_fp8(seed(), {3000, 9000}, 4, nullptr, 1.f),
            "msa_decode_index e4m3 unscaled");
}

}  // namespace
}  // namespace m3
