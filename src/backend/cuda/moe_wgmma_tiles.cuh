// Device pieces shared by the grouped wgmma MoE kernels (bf16: moe_grouped_wgmma.cu; FP8: moe_grouped_wgmma_fp8.cu):
// the work-item order over (row tile, column tile), the queue that hands items to a CTA, and the SwiGLU-OAI epilogue.
#pragma once

#include <cstdint>

#include "backend/cuda/hopper/mbarrier.cuh"
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

// How a persistent CTA gets its work items. Static (the CTA's i-th item is blockIdx + i · grid) or dynamic: the
// producer thread takes the next item from a device counter when it starts one, so items are handed out in the order
// CTAs free up and consecutive items — the row tiles of one expert that read the same weight tile, and the column
// tiles that read the same rows — start within a fraction of an item of each other. (With the static order the CTAs
// drift apart: an item whose second warpgroup has no rows runs at nearly twice the speed, so after a few rounds the
// sibling tiles no longer meet in L2 — ncu at 8192 rows: 13 GB read from DRAM for 5 GB of weights, L2 hit rate 52 %,
// bench/results/2026-12-03e-h200.md.) The producer passes each item id to the 8 consumer warps through a 2-slot ring
// in shared memory; an id ≥ the item count ends the CTA.
struct WorkQueue {
  uint64_t full[2], empty[2];
  int id[2];
};
__device__ __forceinline__ void queue_init(WorkQueue* q) {  // one thread, before the CTA's barrier-init fence
  for (int s = 0; s < 2; ++s) hopper::mbar_init(&q->full[s], 1), hopper::mbar_init(&q->empty[s], 8);
}
// Producer: the CTA's i-th item (counter: null for the static order).
__device__ __forceinline__ int queue_push(WorkQueue* q, int i, int* counter) {
  const int s = i & 1;
  hopper::mbar_wait(&q->empty[s], (uint32_t(i >> 1) & 1u) ^ 1u);
  const int w = counter ? atomicAdd(counter, 1) : int(blockIdx.x) + i * int(gridDim.x);
  q->id[s] = w;
  hopper::mbar_arrive(&q->full[s]);  // release: the id is visible to the waiters' acquire
  return w;
}
// Consumer warps (all 8, every item): the CTA's i-th item.
__device__ __forceinline__ int queue_pop(WorkQueue* q, int i, int lane) {
  const int s = i & 1;
  hopper::mbar_wait(&q->full[s], uint32_t(i >> 1) & 1u);
  const int w = q->id[s];
  __syncwarp();
  if (lane == 0) hopper::mbar_arrive(&q->empty[s]);
  return w;
}
// The counter a launch passes for kernel `which` (0 gate/up, 1 down), or null for the static order
// (M3_MOE_STATIC_ORDER=1, A/B only). The group kernel zeroes counters[2 + which] before every MoE call.
int* work_counter(const int32_t* counters, int which);

// SwiGLU-OAI (cpu::swiglu_oai): gate clamped above, up clamped both sides, σ(α·g)·g·(u + 1).
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
  const float gc = fminf(g, limit);
  const float uc = fminf(fmaxf(u, -limit), limit);
  return gc * (1.0f / (1.0f + expf(-alpha * gc))) * (uc + 1.0f);
}

}  // namespace m3::cuda::moe_wgmma
