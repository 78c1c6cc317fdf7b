// Hopper toolkit (src/backend/cuda/hopper/) proven through the wgmma GEMM: y = x·Wᵀ on bf16 inputs against the CPU
// matmul_nt on the same bf16-rounded values, fp32 and bf16 outputs, shapes that are not multiples of the
// 128×256×64 tile, more tiles than SMs (the persistent loop), and clear refusals of unsupported shapes.
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/gemm_wgmma.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using gpu_test::Dev;
using gpu_test::expect_close;
using gpu_test::rand_vec;

struct Bf16Input {
  std::vector<uint16_t> bits;  // device copy
  std::vector<float> value;    // the same numbers in fp32 for the CPU reference
};

Bf16Input bf16_input(size_t n) {
  Bf16Input in{std::vector<uint16_t>(n), rand_vec(n)};
  for (size_t i = 0; i < n; ++i) {
    in.bits[i] = f32_to_bf16(in.value[i]);
    in.value[i] = bf16_to_f32(in.bits[i]);
  }
  return in;
}

std::string shape_str(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

TEST(GpuHopper, WgmmaGemmMatchesCpuOnBf16InputsWithRaggedAndPersistentShapes) {
  M3_SKIP_WITHOUT_GPU();
  struct S {
    int64_t M, N, K;
  };
  // 1×8×8: a single partial tile; 129×264×72: one row / 8 columns / 8 K past a tile; 2048×4096×256: 256 tiles on
  // fewer SMs; 200×1032×4096: long K through the 4-stage ring many times.
  for (S s : {S{1, 8, 8}, S{129, 264, 72}, S{300, 520, 200}, S{2048, 4096, 256}, S{200, 1032, 4096}}) {
    const Bf16Input x = bf16_input(size_t(s.M * s.K)), W = bf16_input(size_t(s.N * s.K));
    std::vector<float> ref(size_t(s.M * s.N));
    cpu::matmul_nt(x.value.data(), s.M, s.K, W.value.data(), s.N, ref.data());
    Dev<uint16_t> dx(x.bits), dW(W.bits);

    Dev<float> y32(ref.size());
    y32.poison();
    cuda::gemm_bf16_nt_wgmma(dx.p(), dW.p(), s.M, s.N, s.K, y32.p(), cuda::GemmOut::F32, nullptr);
    M3_CUDA_CHECK(cudaGetLastError());
    expect_close("gemm_wgmma f32 out", shape_str(s.M, s.N, s.K), y32.get(), ref, 1e-4);

    Dev<uint16_t> y16(ref.size());
    y16.poison();
    cuda::gemm_bf16_nt_wgmma(dx.p(), dW.p(), s.M, s.N, s.K, y16.p(), cuda::GemmOut::BF16, nullptr, /*pdl=*/true);
    const std::vector<uint16_t> got16 = y16.get();
    std::vector<float> got(got16.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(got16[i]);
    expect_close("gemm_wgmma bf16 out", shape_str(s.M, s.N, s.K), got, ref, 8e-3);
  }
}

TEST(GpuHopper, WgmmaGemmRefusesUnsupportedShapes) {
  M3_SKIP_WITHOUT_GPU();
  Dev<uint16_t> x(size_t(64 * 64)), W(size_t(64 * 64));
  Dev<float> y(size_t(64 * 64 + 4));
  EXPECT_THROW(cuda::gemm_bf16_nt_wgmma(x.p(), W.p(), 8, 12, 64, y.p(), cuda::GemmOut::F32, nullptr), Error);
  EXPECT_THROW(cuda::gemm_bf16_nt_wgmma(x.p(), W.p(), 8, 64, 20, y.p(), cuda::GemmOut::F32, nullptr), Error);
  EXPECT_THROW(cuda::gemm_bf16_nt_wgmma(x.p(), W.p(), 8, 64, 64, y.p() + 1, cuda::GemmOut::F32, nullptr), Error);
  EXPECT_THROW(cuda::gemm_bf16_nt_wgmma(x.p() + 1, W.p(), 8, 64, 64, y.p(), cuda::GemmOut::F32, nullptr), Error);
  cuda::gemm_bf16_nt_wgmma(x.p(), W.p(), 0, 64, 64, y.p(), cuda::GemmOut::F32, nullptr);  // M = 0: no-op
}

}  // namespace
}  // namespace m3
