// The grouped MoE GEMMs of long prefills on Hopper tensor cores (wgmma), a drop-in for moe_grouped.cu's mma.sync
// gate/up and down launches when a step routes many rows per expert (docs/KERNELS.md §10.1).
//
// Why: at 8192 rows the mma.sync kernels (64 × 64 tiles, cp.async, 4 warps) reach ≈ 195 TFLOP/s, a quarter of what
// the hopper/ toolkit's GEMM does (gemm_wgmma.cu, ≥ 760 TFLOP/s), and the MoE is a third of a prefill step.
// How: the same persistent, warp-specialised mainloop as gemm_wgmma.cu (one TMA producer warpgroup, two consumer
// warpgroups, 4-stage ring of 128 × 64 A and 256 × 64 B tiles, m64n256k16), walking a list of (work tile) =
// (grouped-row tile of 128 rows of one expert, 256 weight columns) read from the device, so it stays capture-safe:
//   - A is row-contiguous: the gate/up GEMM reads xg [R, H], the token rows gathered into grouped order first
//     (moe_gather_rows; TMA cannot gather), the down GEMM reads act [R, ld_act] as it is.
//   - gate/up: the 256-row B tile is expert g's gate rows n0 … n0 + 127 and its up rows I + n0 … (two TMA boxes), so
//     a thread holds gate column c and up column c + 128 in the same registers and SwiGLU-OAI runs in registers.
//   - down: B = 256 rows of expert g's [H, I]; y rows are scattered to their (token, slot) by row_slot.
//   - Rows of a tile past its group's end (the next expert's rows, or zero-filled past R) are computed and dropped; a
//     consumer whose 64 rows are all past the end issues no MMA.
// WT is the weights' element type (bf16). FP8 experts (e4m3 + 128×128 block scales, docs/FP8.md §9) have their own
// kernels below (moe_grouped_wgmma_fp8.cu): e4m3 × e4m3 on m64n128k32 with x quantised per 1×128, act per 1×64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace m3::cuda {

// Device routing data of one grouped call (moe_grouped.cuh's scratch).
struct MoeWgmmaRouting {
  const int32_t* offsets = nullptr;   // [E + 2]: group g's grouped rows are [offsets[g], offsets[g + 1])
  const int32_t* row_tok = nullptr;   // [R] grouped row → token
  const int32_t* row_slot = nullptr;  // [R] grouped row → output slot of y
  const int32_t* tiles = nullptr;     // [2 · tiles]: (group, first grouped row), 128-row tiles (kMoeWgmmaRows)
  const int32_t* counters = nullptr;  // [0]: tile count; [2], [3]: the gate/up and down work queues (zeroed by the
                                      // group kernel, taken by the dynamic order: moe_wgmma_tiles.cuh)
  int64_t cap_rows = 0;               // rows the scratch holds (R ≤ cap_rows)
  int64_t cap_tiles = 0;              // tiles the grid is sized for (host bound; the device count is ≤ it)
  int E = 0;
};

constexpr int kMoeWgmmaRows = 128;  // grouped rows per tile (the group kernel's BM on this path)

// True when the wgmma path takes these widths: H % 256 (down's N tile), I and Is % 128 (gate/up's N tile), all % 64.
bool moe_wgmma_supported(int64_t H, int64_t I, int64_t Is);

// xg[r] = xb[row_tok[r]] for r < offsets[E + 1] (device count); rows past it untouched. xb, xg: [·, H] bf16.
void moe_gather_rows(const __nv_bfloat16* xb, int64_t H, const MoeWgmmaRouting& rt, __nv_bfloat16* xg,
                     cudaStream_t s);

// act[r, n] = SwiGLU-OAI(xg[r] · gate_gᵀ, xg[r] · up_gᵀ)[n] for every grouped row r of every tile, n < I_g.
// gate_up: stacked [E, 2I, H] (gate rows then up rows per expert); shared_gate_up [2Is, H] (group E) or null.
template <typename WT>
void moe_gate_up_wgmma(const __nv_bfloat16* xg, int64_t H, const WT* gate_up, const WT* shared_gate_up, int64_t I,
                       int64_t Is, float alpha, float limit, const MoeWgmmaRouting& rt, __nv_bfloat16* act,
                       int64_t ld_act, cudaStream_t s);

// y[row_slot[r]] = act[r, :I_g] · down_gᵀ for every grouped row r. down: stacked [E, H, I]; shared_down [H, Is].
template <typename WT>
void moe_down_wgmma(const __nv_bfloat16* act, int64_t ld_act, const WT* down, const WT* shared_down, int64_t H,
                    int64_t I, int64_t Is, const MoeWgmmaRouting& rt, float* y, cudaStream_t s);

// ---- FP8 experts (moe_grouped_wgmma_fp8.cu) ----------------------------------------------------------------------
// Why: at prefill sizes the W8A16 mma.sync GEMMs are compute-bound on f16 (T = 2048 at M3 widths: 7.85 ms against
// the bf16 wgmma path's 4.69 ms, bench/results/2026-12-03c-fp8-decode-h200.md), while e4m3 wgmma has twice bf16's
// rate and reads half the bytes.
// Numerics (CPU twin in tests/gpu/gpu_moe_test.cpp): activations are quantised per row and per 64 columns, scale =
// amax / 448 (fp32 division; 1 for an all-zero block), q = rne_e4m3(v / scale) — the gathered x rows (from the
// router's f16 copy of xn) and SwiGLU's act. Each 64-wide K step's e4m3 products are summed by the tensor cores in
// fp32, then added to the accumulator times (x scale of the row · weight block scale): "promotion" every 64 K.
// Scale arrays of quantised rows: [rows, K / 64] fp32, row-major.
struct MoeWgmmaFp8Weights {
  const uint8_t* w = nullptr;          // stacked [E, N, K] e4m3 (gate/up: N = 2I, K = H; down: N = H, K = I)
  const float* scales = nullptr;       // [E][fp8_scale_count(Blk128, N, K)]
  const uint8_t* shared = nullptr;     // the shared expert's [N_s, K_s] or null
  const float* shared_scales = nullptr;
};

// True when the FP8 wgmma path takes these widths: H, I and Is multiples of 128 (wide: H a multiple of 256).
bool moe_wgmma_fp8_supported(int64_t H, int64_t I, int64_t Is, bool wide = false);

// xq[r] = quantise_1x128(xb[row_tok[r]]) with scales xs [rows, H / 128], for r < offsets[E + 1]. xb_f16: [·, H] f16
// (the router's copy of xn for FP8 experts).
void moe_gather_quant_rows(const void* xb_f16, int64_t H, const MoeWgmmaRouting& rt, uint8_t* xq, float* xs,
                           cudaStream_t s);

// act = quantise_1xB(SwiGLU-OAI(xg · gate_gᵀ, xg · up_gᵀ)) for every grouped row; act_q [rows, ld_act] e4m3,
// act_s [rows, ld_act / B]. B = 64 with N = 128 tiles; wide (N = 256 tiles, H % 256): B = 128, and the down GEMM
// must then be the wide one too (it reads act's scales per 128). Wide: MoeGemmPath::Wgmma256, Auto's FP8 choice where
// H % 256 == 0 (tested and measured on the H200 2026-12-03f).
void moe_gate_up_wgmma_fp8(const uint8_t* xq, const float* xs, int64_t H, const MoeWgmmaFp8Weights& gate_up, int64_t I,
                           int64_t Is, float alpha, float limit, const MoeWgmmaRouting& rt, uint8_t* act_q,
                           float* act_s, int64_t ld_act, cudaStream_t s, bool wide = false);

// y[row_slot[r]] = dequant(act[r, :I_g]) · down_gᵀ for every grouped row r.
void moe_down_wgmma_fp8(const uint8_t* act_q, const float* act_s, int64_t ld_act, const MoeWgmmaFp8Weights& down,
                        int64_t H, int64_t I, int64_t Is, const MoeWgmmaRouting& rt, float* y, cudaStream_t s,
                        bool wide = false);

}  // namespace m3::cuda
