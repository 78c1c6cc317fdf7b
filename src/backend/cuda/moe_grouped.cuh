// Grouped MoE on the device with no host synchronisation (issue 9 item 4; docs/KERNELS.md §10).
//
// Six launches (seven on the wgmma path), every launch parameter a function of the step's row count T only (never of the routing), so the
// call can be captured in a CUDA graph per batch-size bucket:
//   1. moe_router_logits: logits [T, E] = xn · routerᵀ in fp32, a fixed reduction order per (token, expert) (the
//      same bits whatever else is in the batch); the first column of CTAs also writes xn as bf16 [T, H].
//   2. moe_route (a warp per token, many CTAs) — routing (cpu::moe_route's rule: top-k of sigmoid + bias, NaN last,
//      ties to the lower id; weights = unbiased sigmoid renormalised × scale) and the per-expert counts; then
//      moe_group: one CTA — histogram of the T·K (token, slot) pairs by expert,
//      exclusive scan → group offsets, a stable scatter (pairs of an expert keep ascending t·K + k order), the
//      shared expert as group E over all T tokens, and the tile list (group, first row) of the grouped GEMMs.
//   3. moe_gemm<gate_up>: grouped bf16 GEMM on mma.sync tensor cores; a CTA = (64 columns: 32 gate + the matching
//      32 up rows, one tile of BM grouped rows); SwiGLU-OAI fused in the epilogue → act bf16 [rows, I]. Long
//      prefills take the wgmma GEMMs of moe_grouped_wgmma.cuh instead (rows gathered first; same results).
//   4. moe_gemm<down>: act · downᵀ → y fp32 [slot, H] (slot = t·K + k, shared rows at T·K + t): no atomics.
//   5. moe_combine: x[t] += Σ_k w[t,k]·y[t·K+k] + y[T·K+t], summed in slot order like M3Model::forward.
// The GEMM grids are sized at capacity (every possible tile); CTAs past the device-side tile count exit at once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace m3::cuda {

// Device weights of one MoE layer for the grouped path (bf16 or FP8 experts, fp32 router).
// FP8 experts (`--dtype fp8`, docs/FP8.md §9): e4m3 values with 128×128 power-of-two fp32 block scales (Blk128 of
// base/fp8_format.h, one scale array per expert matrix, stacked like the values). When `gate_up8` is set the GEMMs
// read the FP8 fields and ignore the bf16 ones; the shared expert (group E of the same kernels) is then FP8 too
// (`shared_gate_up8`) or absent — a bf16 shared expert beside FP8 routed experts runs on its own (mlp_moe.cu).
struct MoeGroupedWeights {
  const float* router = nullptr;       // [E, H]
  const float* router_bias = nullptr;  // [E] or null
  const __nv_bfloat16* gate_up = nullptr;  // stacked [E, 2I, H]: per expert gate rows then up rows
  const __nv_bfloat16* down = nullptr;     // stacked [E, H, I]
  const __nv_bfloat16* shared_gate_up = nullptr;  // [2·Is, H] or null (no shared expert)
  const __nv_bfloat16* shared_down = nullptr;     // [H, Is]
  const uint8_t* gate_up8 = nullptr;          // stacked [E, 2I, H] e4m3
  const float* gate_up8_scales = nullptr;     // [E][fp8_scale_count(Blk128, 2I, H)]
  const uint8_t* down8 = nullptr;             // stacked [E, H, I] e4m3
  const float* down8_scales = nullptr;        // [E][fp8_scale_count(Blk128, H, I)]
  const uint8_t* shared_gate_up8 = nullptr;   // [2·Is, H] e4m3 or null
  const float* shared_gate_up8_scales = nullptr;
  const uint8_t* shared_down8 = nullptr;      // [H, Is] e4m3
  const float* shared_down8_scales = nullptr;
  int64_t E = 0, top_k = 0, I = 0, Is = 0;
  float routed_scale = 1.f, alpha = 1.702f, limit = 7.f;
  bool fp8() const { return gate_up8 != nullptr; }
  bool has_shared() const { return Is > 0 && (fp8() ? shared_gate_up8 != nullptr : shared_gate_up != nullptr); }
};

// Every buffer of the grouped path, allocated at capacity by moe_reserve (before any graph capture).
struct MoeGroupedScratch {
  int64_t cap_T = 0, cap_H = 0, cap_E = 0, cap_K = 0, cap_I = 0;
  DeviceBuffer<float> logits;           // [T, E]
  DeviceBuffer<int32_t> ids;            // [T, K]
  DeviceBuffer<float> weights;          // [T, K]
  DeviceBuffer<__nv_bfloat16> xb;       // [T, H]
  DeviceBuffer<int32_t> offsets;        // [E + 2]: group g's rows are [offsets[g], offsets[g+1]); group E = shared
  DeviceBuffer<int32_t> row_tok;        // [T·K + T] grouped row → token
  DeviceBuffer<int32_t> row_slot;       // [T·K + T] grouped row → output slot
  DeviceBuffer<int32_t> tiles;          // [2 · max tiles]: (group, first grouped row)
  DeviceBuffer<int32_t> counters;       // [4]: tile count, routed experts with ≥ 1 row (for the bench floor),
                                        // the wgmma kernels' work queues (gate/up, down; moe_wgmma_tiles.cuh)
  DeviceBuffer<int32_t> counts;         // [E]: routed rows per expert (route_kernel → group_kernel)
  DeviceBuffer<__nv_bfloat16> act;      // [T·K + T, max(I, Is)]
  DeviceBuffer<float> y;                // [T·K + T, H]
};

// True when the grouped kernels take these shapes (H % 64, I and Is % 32, E ≤ 256, top_k ≤ 8, H % 8 for loads).
bool moe_grouped_supported(int64_t H, int64_t E, int64_t top_k, int64_t I, int64_t Is);

// Allocates every buffer for steps of up to T_max rows (grows only; call before capturing a graph).
void moe_reserve(MoeGroupedScratch& s, int64_t T_max, int64_t H, int64_t E, int64_t top_k, int64_t I, int64_t Is);

// x[t] += Σ_k w[t,k]·expert_{id[t,k]}(xn[t]) + shared(xn[t]) for t < T. xn, x: fp32 [T, H]. No host sync and no
// allocation when the scratch was reserved for T (while capturing, an unreserved T is an error).
// Optional events recorded around the five launches (bench breakdown): [0] before the router, [1] after it,
// [2] after grouping, [3] after gate/up, [4] after down, [5] after the combine.
struct MoeStageEvents {
  cudaEvent_t ev[6];
};
// Which kernels run the two grouped GEMMs: the mma.sync ones of this file (16- or 64-row tiles), or the wgmma ones
// of moe_grouped_wgmma.cuh (128-row tiles, for long prefills). Auto: moe_gemm_path. Wgmma256: for FP8 experts the
// wgmma kernels with N = 256 tiles and act in 1 × 128 blocks (moe_grouped_wgmma.cuh, `wide`; Auto's FP8 choice where
// H % 256 == 0, M3_MOE_FP8_WIDE=0 turns it off); bf16 experts take it as Wgmma.
enum class MoeGemmPath : uint8_t { Auto, MmaSync, Wgmma, Wgmma256 };

void moe_grouped_forward(const MoeGroupedWeights& w, const float* xn, int64_t T, int64_t H, float* x,
                         MoeGroupedScratch& scr, cudaStream_t s, const MoeStageEvents* marks = nullptr,
                         MoeGemmPath path = MoeGemmPath::Auto);

// What Auto picks for T rows: wgmma when the widths fit it (moe_wgmma_supported; moe_wgmma_fp8_supported for FP8
// experts) and the step routes at least kMoeWgmmaMinRowsPerExpert (FP8: kMoeWgmmaFp8MinRowsPerExpert) rows per expert
// on average, else mma.sync. bf16, measured at M3's widths on the H200 (bench/results/2026-12-02c-moe-wgmma-h200.md):
// wgmma was faster from 512 rows (16 per expert: 1.26x) up; below that it is not measured. The two bf16 paths give
// the same bits, so the choice changes only the speed. FP8 experts: the wgmma path multiplies e4m3 activations (x in
// 1x128 blocks, act in 1x64) where mma.sync multiplies f16 ones, so prefill-sized steps only, like the dense projections' cuBLASLt FP8
// path (docs/FP8.md section 9).
constexpr int64_t kMoeWgmmaMinRowsPerExpert = 16;
constexpr int64_t kMoeWgmmaFp8MinRowsPerExpert = 16;
MoeGemmPath moe_gemm_path(int64_t T, int64_t H, int64_t E, int64_t top_k, int64_t I, int64_t Is, bool fp8 = false);

// Rows per mma.sync GEMM tile the forward picks for T rows (16 for decode-sized steps, 64 for prefill).
int moe_tile_rows(int64_t T, int64_t E, int64_t top_k);

}  // namespace m3::cuda

namespace m3::cuda {
// For tests and benchmarks (gigabytes of expert weights; a host fill would dominate): p[i] = scale·u(seed, i),
// u uniform in [−1, 1) from a 64-bit hash of (seed, i) — the same values whatever the launch shape.
void fill_hash_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale, cudaStream_t s);
void fill_hash_f32(float* p, int64_t n, uint64_t seed, float scale, cudaStream_t s);
// MXFP8-like test weights [N, K] (K % 32 == 0): q = rne_e4m3(448·u(seed, i)) and per 32-group UE8M0 bytes
// 127 + e0 + (hash of the group mod 3), so w = e4m3(q)·2^(s − 127) has |w| < 448·2^(e0 + 2) and scales that vary by
// group (fp8_requant_from_mx then gives 128×128 blocks of different scales, as a real checkpoint would).
void fill_hash_mxfp8(uint8_t* q, uint8_t* ue8m0, int64_t N, int64_t K, uint64_t seed, int e0, cudaStream_t s);
// out[n, k] = bf16(e4m3(q[n, k])·scale(n, k)) for Blk128 scales (exact: an e4m3 value times a power of two fits bf16).
// The bf16 copy of FP8 weights the tests and the benchmark compare against; CPU twin cpu::fp8_dequant.
void fp8_blk128_to_bf16(const uint8_t* q, const float* scales, int64_t N, int64_t K, __nv_bfloat16* out,
                        cudaStream_t s);
}  // namespace m3::cuda
