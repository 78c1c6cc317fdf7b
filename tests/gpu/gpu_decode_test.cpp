// The bf16 tensor-core decode kernels (issue 11) against their CPU twins: paged decode attention (sparse and dense
// page lists, G 16 and 8, with and without split-K, ragged and mixed contexts) and the decode index scorer fused with
// top-k and the page-list emit. Checks live in decode_tc_checks.h (tools/bench_decode runs them too).
#include <gtest/gtest.h>

#include "decode_tc_checks.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using decode_check::Result;

uint64_t seed() { return gpu_test::rng()(); }

void expect_ok(const Result& r, const char* name) {
  std::printf("[gpu-op] %s: max|err| %.3g / max|ref| %.3g, %lld bad\n", name, r.max_err, r.max_ref,
              (long long)r.bad);
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
  std::vector<int32_t> pos;  // 40 rows × 4 KV heads = 160 requests > #SMs: the 3-stage, 2-CTA-per-SM pipeline
  for (int i = 0; i < 40; ++i) pos.push_back(97 + 1733 * i);
  expect_ok(decode_check::check_paged_decode(seed(), pos, 4, 16, true, true), "paged_decode_tc sparse G16 wide");
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

TEST(GpuDecode, DecodeIndexScoresTopkAndPageListMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_decode_index(seed(), kMixed, 4), "msa_decode_index H4");
}

TEST(GpuDecode, DecodeIndexOneHeadMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  expect_ok(decode_check::check_decode_index(seed(), {2100, 40000, 130000}, 1, 16, 1), "msa_decode_index H1");
}

}  // namespace
}  // namespace m3
