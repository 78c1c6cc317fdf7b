// Device pieces shared by the grouped wgmma MoE kernels (bf16: moe_grouped_wgmma.cu; FP8: moe_grouped_wgmma_fp8.cu):
// the work-item order over (row tile, column tile) and the SwiGLU-OAI epilogue.
#pragma once

#include <cstdint>

#include "backend/cuda/moe_grouped_wgmma.cuh"

namespace m3::cuda::moe_wgmma {

// Work item w → (group, first grouped row, column tile), for NN column tiles per row tile. Items are numbered group
// by group (a group's row tiles are consecutive in the tile list `tiles` = (group, first row) pairs); inside a group
// column-major — the group's row tiles of one column tile are consecutive items — so the CTAs that read the same
// weight tile (expert g, columns n) run side by side. (Meant to turn the sibling reads into L2 hits; at 8192 rows the
// time did not change against row-tile-major order: bench/results/2026-12-02c-moe-wgmma-h200.md.)
struct WorkTile {
  int g, r0, n;
};
__device__ __forceinline__ WorkTile work_tile(const int32_t* tiles, const int32_t* offsets, int NN, int w) {
  constexpr int kBM = kMoeWgmmaRows;
  const int t = w / NN;  // some row tile of w's group (the group owns items [tfirst·NN, (tfirst + ng)·NN))
  const int g = tiles[2 * t];
  const int base = offsets[g];
  const int tfirst = t - (tiles[2 * t + 1] - base) / kBM;
  const int ng = (offsets[g + 1] - base + kBM - 1) / kBM;
  const int local = w - tfirst * NN;
  return WorkTile{g, base + (local % ng) * kBM, local / ng};
}

// SwiGLU-OAI (cpu::swiglu_oai): gate clamped above, up clamped both sides, σ(α·g)·g·(u + 1).
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
  const float gc = fminf(g, limit);
  const float uc = fminf(fmaxf(u, -limit), limit);
  return gc * (1.0f / (1.0f + expf(-alpha * gc))) * (uc + 1.0f);
}

}  // namespace m3::cuda::moe_wgmma
