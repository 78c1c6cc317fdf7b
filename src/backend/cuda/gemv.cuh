// Weight-streaming GEMV for decode rows: y[T, N] (+)= x[T, K] · Wᵀ for T ≤ 8 token rows, W bf16 or e4m3 with
// Row128 / Blk128 scales (docs/KERNELS.md §13).
// Why: a decode step's projections read every weight byte once for 1–8 tokens, so they are pure HBM streams. The
// engine's bf16 projections through cuBLASLt ran at ≈ 1.2–1.4 TB/s in the decode step (bench/results/2026-12-02e-
// gpu-h200.md: 0.8–0.9 ms for ≈ 1.1 GB), and the mma-based W8A16 kernel at 32–45 % of copy because each warp load
// is 64-byte pieces of 8 rows (docs/FP8.md §5). Two kernels (gemv.cu):
//  - CUDA cores (bf16, and e4m3 GemvKernel::Fma): each warp streams whole 512-byte runs of ONE weight row (lane l
//    reads 16 contiguous bytes at l·16), several runs in flight per lane, and does the ≤ 8 FMAs per weight in fp32
//    (e4m3 via cvt.rn.f16x2.e4m3x2, exact; the block scale applied once per 16-weight run);
//  - tensor cores (e4m3 GemvKernel::Mma): 16 weight rows per CTA as the mma M, tokens as N, x in f16 (saturating).
// Shapes: x [T, K] bf16, W [N, K], y [T, N] fp32 or bf16 (GemmOut). K % 256 (bf16) / K % 512 (e4m3) == 0, 16-byte
// aligned x and W, 1 ≤ T ≤ kGemvMaxRows; otherwise gemv_supported is false (use the GEMM). Deterministic: each
// output is a fixed-order sum. CPU twin: the fp32 GEMM of backend/cpu (tests/gpu/gpu_gemv_test.cpp checks against an
// fp64 product of the same bf16 / dequantised values). The executor's policy (model/cuda_executor.cpp): e4m3 at
// T ≤ 4, bf16 at T = 1; M3_GEMV=0 off, =1 every T ≤ 8.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/fp8_gemm.cuh"      // Fp8Weight
#include "backend/cuda/gemm_wgmma.cuh"    // GemmOut

namespace m3::cuda {

inline constexpr int64_t kGemvMaxRows = 8;

// True when gemv_bf16 / gemv_e4m3 take this call.
bool gemv_supported(int64_t T, int64_t K, bool e4m3);

// bf16 weights W [N, K].
void gemv_bf16(const uint16_t* x, int64_t T, int64_t K, const uint16_t* W, int64_t N, void* y, GemmOut out,
               bool accumulate, cudaStream_t s);
// e4m3 weights with Row128 or Blk128 scales (the formats the executor's FP8 projections hold). Two kernels: Fma
// (CUDA cores, fp32 products of exact weights and bf16 x) and Mma (tensor cores, f16 x: see gemv.cu for the exact
// range); Auto takes gemv_e4m3_kernel_for's choice.
enum class GemvKernel : uint8_t { Auto, Fma, Mma };
GemvKernel gemv_e4m3_kernel_for(int64_t T, int64_t N, int64_t K);
bool gemv_e4m3_mma_supported(int64_t T, int64_t K);  // x [T, K] as f16 fits beside the tensor-core kernel's ring
void gemv_e4m3(const uint16_t* x, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
               cudaStream_t s, GemvKernel kernel = GemvKernel::Auto);

}  // namespace m3::cuda
