// The consumer side of the toolkit's TMA-fed GEMM mainloop (gemm_wgmma.cu, moe_grouped_wgmma.cu; docs/KERNELS.md
// §7): one consumer warpgroup multiplies its 64 rows of each ring stage's A tile [128, 64] by the stage's B tile
// [256, 64]ᵀ into d [64, 256] (m64n256k16 bf16 → fp32), over num_k stages. One wgmma group stays in flight; a stage
// is handed back on its empty barrier (lane 0 of each warp) once the next stage's group has been issued, the last one
// after the final wait. The first stage overwrites d.
#pragma once

#include <cstdint>

#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/wgmma.cuh"

namespace m3::cuda::hopper {

template <int Stages, uint32_t TileA, uint32_t TileB>
__device__ __forceinline__ void consume_tile_64x256(float (&d)[128], PipeState<Stages>& ps, uint64_t* full,
                                                    uint64_t* empty, uint8_t* tiles_a, uint8_t* tiles_b, int half,
                                                    int num_k, int lane) {
  constexpr int kBK = 64;  // K per stage: 128-byte swizzled rows
  int prev_stage = -1;
  for (int kb = 0; kb < num_k; ++kb) {
    mbar_wait(&full[ps.stage], ps.phase);
    const uint64_t da = smem_desc_sw128(tiles_a + ps.stage * TileA + half * (64 * 128));
    const uint64_t db = smem_desc_sw128(tiles_b + ps.stage * TileB);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBK / 16; ++k)
      Wgmma<bf16_t, 256>::mma_ss(d, desc_advance(da, k * 32), desc_advance(db, k * 32), (kb | k) != 0);
    wgmma_commit();
    wgmma_wait<1>();
    fence_regs(d);
    if (prev_stage >= 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
    prev_stage = ps.stage;
    ps.advance();
  }
  wgmma_wait<0>();
  fence_regs(d);
  if (prev_stage >= 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
}

}  // namespace m3::cuda::hopper
