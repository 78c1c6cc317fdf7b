// The FP8 KV prefill staging copy (issue 15 item 4; docs/FP8.md §8.2): cuda::kv_dequantize_pages_e4m3 writes, for
// each listed page, bf16(e4m3(code) · scale) at the same page of the staging pool — compared bit for bit with its
// CPU twin (cpu::kv_dequantize_e4m3, then f32_to_bf16) over every finite code, and pages not listed stay untouched.
// (The NaN codes 0x7f / 0xff are left out: the writer saturates finite values to ±448, and the staging copy, like
// the e4m3 decode kernels' register conversion, has no NaN path.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/fp8.h"
#include "backend/cuda/kv_fp8.cuh"
#include "base/dtype.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using cuda::DeviceBuffer;

void expect_staging_matches_cpu(int64_t page_elems, float scale) {
  const int64_t P = 9;
  std::mt19937 g(uint32_t(page_elems) ^ 77u);
  std::vector<uint8_t> codes(size_t(P * page_elems));
  for (size_t i = 0; i < codes.size(); ++i) {  // every code, then random ones; no NaN codes
    const uint8_t c = uint8_t(i < 256 ? i : g());
    codes[i] = (c & 0x7f) == 0x7f ? uint8_t(c - 1) : c;
  }
  // Page list: out of order, with a repeat (shared prefix pages of two sequences); pages 2, 5, 8 not listed.
  const std::vector<int32_t> pages{7, 0, 3, 1, 6, 4, 0};
  const uint16_t poison = 0x7FC1;  // a bf16 NaN no conversion produces
  DeviceBuffer<uint8_t> dq(codes.size());
  DeviceBuffer<uint16_t> dout(codes.size());
  DeviceBuffer<int32_t> dp(pages.size());
  std::vector<uint16_t> out(codes.size(), poison);
  ASSERT_EQ(cudaMemcpy(dq.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dp.get(), pages.data(), pages.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dout.get(), out.data(), out.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cuda::kv_dequantize_pages_e4m3(reinterpret_cast<const cuda::e4m3_t*>(dq.get()), page_elems, dp.get(),
                                 int64_t(pages.size()), scale, reinterpret_cast<__nv_bfloat16*>(dout.get()), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), dout.get(), out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> ref(codes.size());
  cpu::kv_dequantize_e4m3(codes.data(), int64_t(codes.size()), scale, ref.data());
  int64_t mismatches = 0, untouched_written = 0;
  for (int64_t p = 0; p < P; ++p) {
    const bool listed = std::find(pages.begin(), pages.end(), int32_t(p)) != pages.end();
    for (int64_t i = p * page_elems; i < (p + 1) * page_elems; ++i) {
      if (!listed) {
        untouched_written += out[size_t(i)] != poison;
        continue;
      }
      mismatches += out[size_t(i)] != f32_to_bf16(ref[size_t(i)]);
    }
  }
  std::printf("[gpu-kv-fp8] staging page_elems %lld scale %g: %lld mismatches, %lld writes outside the list\n",
              (long long)page_elems, double(scale), (long long)mismatches, (long long)untouched_written);
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(untouched_written, 0);
}

TEST(GpuKvFp8, StagingCopyEqualsTheCpuTwinOnListedPagesOnly) {
  M3_SKIP_WITHOUT_GPU();
  expect_staging_matches_cpu(2 * 128 * 128, 1.f);      // K/V pages of 2 KV heads, unscaled (exact in bf16)
  expect_staging_matches_cpu(128 * 128, 0.0271f);      // index-K page, a non-power-of-two scale (one bf16 rounding)
  expect_staging_matches_cpu(16 * 33, 3.f);            // the smallest legal granularity, odd chunk count
}

TEST(GpuKvFp8, StagingCopyRefusesBadShapesWithAnError) {
  M3_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> q(64);
  DeviceBuffer<uint16_t> o(64);
  DeviceBuffer<int32_t> p(1);
  auto run = [&](int64_t elems, float scale) {
    cuda::kv_dequantize_pages_e4m3(reinterpret_cast<const cuda::e4m3_t*>(q.get()), elems, p.get(), 1, scale,
                                   reinterpret_cast<__nv_bfloat16*>(o.get()), nullptr);
  };
  EXPECT_ANY_THROW(run(24, 1.f));  // not a multiple of 16
  EXPECT_ANY_THROW(run(32, 0.f));  // scale must be > 0
}

}  // namespace
}  // namespace m3
