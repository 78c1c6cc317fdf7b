// Hopper tensor-core GEMM on the hopper/ toolkit: y[M, N] = x[M, K] · W[N, K]ᵀ, bf16 operands, fp32 accumulate,
// bf16 or fp32 output, row-major everything (K contiguous in x and W). The proof of the toolkit
// (docs/KERNELS.md §7): TMA ring + mbarriers, one producer warpgroup and two consumer warpgroups issuing wgmma,
// persistent CTAs over 128×256 output tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace m3::cuda {

enum class GemmOut : uint8_t { F32, BF16 };

// x: [M, K] bf16, W: [N, K] bf16 (uint16_t bit patterns), y: [M, N] of `out`. Any M ≥ 0; N and K must be multiples
// of 8 (16-byte rows for TMA and paired stores) and every pointer 16-byte aligned, else m3::Error. M = 0 is a no-op.
// `pdl` launches with programmatic stream serialization (the kernel waits on its predecessor's completion before
// touching memory, so it is always safe to request).
void gemm_bf16_nt_wgmma(const uint16_t* x, const uint16_t* W, int64_t M, int64_t N, int64_t K, void* y, GemmOut out,
                        cudaStream_t s, bool pdl = false);

}  // namespace m3::cuda
