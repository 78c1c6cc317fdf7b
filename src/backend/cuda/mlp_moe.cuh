// SwiGLU-OAI, MoE routing and the grouped expert path (semantics: cpu::swiglu_oai, cpu::moe_route and the FFN of
// M3Model::forward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/moe_grouped.cuh"

namespace m3::cuda {

// gate_up: [T, 2·I] = [gate | up] per row; out: [T, I].
void swiglu_oai(const float* gate_up, int64_t T, int64_t I, float alpha, float limit, float* out, cudaStream_t s);
// The same SwiGLU rounded to bf16 and quantised per 1×128 in one pass, for an FP8×FP8 down GEMM (Fp8Gemm::proj's xq):
// q.q [T_pad, I] codes, q.s [I/128][T_pad] scales, bit for bit fp8_quantize_act_1x128 on the bf16 SwiGLU output.
// I % 128 == 0, q.ld_s == q.T_pad ≥ T.
void swiglu_oai_e4m3(const float* gate_up, int64_t T, int64_t I, float alpha, float limit, const Fp8ActOut& q,
                     cudaStream_t s);

// logits [T, E] → ids/weights [T, top_k]: top_k by sigmoid + bias (bias may be null; NaN ranks last; ties → lower
// id), weights = unbiased sigmoid renormalised × scale. One thread per token (E·top_k work each).
void moe_route(const float* logits, int64_t T, int64_t E, const float* bias, int top_k, float scale, int32_t* ids,
               float* weights, cudaStream_t s);

// x[i] += y[i] for i < n.
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s);

// One SwiGLU-OAI MLP's device weights: gate_up [2·I, H] (gate rows then up rows), down [H, I].
// FP8 (`--dtype fp8`, docs/FP8.md §6): gate_up8 / down8 set (q non-null) replace gate_up / down (each on its own:
// a matrix whose K no FP8 kernel takes stays bf16); run by Fp8Gemm::proj.
struct MlpDev {
  const void* gate_up = nullptr;
  const void* down = nullptr;
  WType wt = WType::BF16;
  int64_t I = 0;
  Fp8Weight gate_up8{}, down8{};
  bool fp8() const { return gate_up8.q != nullptr || down8.q != nullptr; }
};

// Scratch for run_mlp / MoeGrouped (grown on demand, reused across layers).
struct FfnScratch {
  DeviceBuffer<float> gu, act, y, shared_y, xe, logits, weights;
  DeviceBuffer<uint16_t> act_b;  // bf16 SwiGLU output (bf16 weights)
  DeviceBuffer<uint8_t> act_q8;  // the SwiGLU output quantised per 1×128 for an FP8×FP8 down GEMM, and its scales
  DeviceBuffer<float> act_s8;
  DeviceBuffer<int32_t> ids, gather_src, slot_pos;
  MoeGroupedScratch moe;  // the grouped (no host sync) MoE path's buffers, reserved at capacity
};

// y[T, H] = MLP(x) (or y += MLP(x) when accumulate). With bf16 weights the SwiGLU output goes to the down GEMM as
// bf16 (no fp32 round trip), and xb — x already rounded to bf16 (rms_norm_gemma_bf16), when given — replaces x as
// the gate/up input; results are bit-identical to rounding inside the GEMMs.
// FP8 weights (m.fp8()) need xb and f8; both projections go through f8->proj with lt_min_rows, or the e4m3 GEMV at
// T ≤ gemv_rows (bf16 in, fp32 out, the SwiGLU output in bf16 between them as for bf16 weights).
// gemv_rows: with bf16 activations, T ≤ gemv_rows takes the weight-streaming GEMV (gemv.cuh; bf16 or e4m3 weights)
// for each projection whose shape it supports (the executor's measured decode policy for the weight type; 0 = never).
// When a projection takes cuBLASLt FP8×FP8 (Fp8Gemm::proj_quantises), its input is quantised by its writer: gate/up
// reads xq when given (xb quantised by rms_norm_gemma_bf16_e4m3, T_pad = ld_s = round_up(T, 4)), down reads the
// SwiGLU output quantised in the SwiGLU pass (swiglu_oai_e4m3) — bit-identical to proj's own quantisation.
void run_mlp(Gemm& g, const MlpDev& m, const float* x, int64_t T, int64_t H, float alpha, float limit, float* y,
             bool accumulate, FfnScratch& scr, cudaStream_t s, const uint16_t* xb = nullptr, Fp8Gemm* f8 = nullptr,
             int64_t lt_min_rows = 0, int64_t gemv_rows = 0, const Fp8ActOut* xq = nullptr);

// Routed experts + shared expert, added to the residual: x[t] += Σ_k w[t,k]·expert_{id[t,k]}(xn[t]) + shared(xn[t]).
// Two implementations, both summing per token in slot order (a token's result does not depend on the batch, like
// the CPU reference):
// - grouped (moe_grouped.cuh): bf16 experts given as stacked pointers; routing, grouping and the expert GEMMs all
//   on the device, no host sync, capture-safe — taken when `stacked_gate_up` is set, every weight is bf16 and the
//   shape is supported;
// - sync (moe_forward_sync): route on the device, copy the ids to the host (one sync), gather each expert's rows,
//   run gate_up / SwiGLU / down per expert with cuBLASLt. Kept for fp32 weights: the verification path stays exact
//   to the CPU reference.
struct MoeArgs {
  const float* router = nullptr;       // [E, H] fp32
  const float* router_bias = nullptr;  // [E] or null
  std::vector<MlpDev> experts;         // [E] (the sync path)
  MlpDev shared;                       // I = 0 → none
  const void* stacked_gate_up = nullptr;  // [E, 2I, H] bf16 (the grouped path), or null
  const void* stacked_down = nullptr;     // [E, H, I] bf16
  // FP8 routed experts (`--dtype fp8`, docs/FP8.md §9), replacing the two bf16 stacks: e4m3 [E, 2I, H] / [E, H, I]
  // with per-expert Blk128 scales, read by the grouped path's W8A16 GEMMs. The shared expert then joins them as
  // group E when both its matrices are FP8 (Blk128); any other shared expert must be run by the caller (shared.I = 0
  // here), as the grouped kernels read one weight type.
  const uint8_t* stacked_gate_up8 = nullptr;
  const float* stacked_gate_up8_scales = nullptr;  // [E][fp8_scale_count(Blk128, 2I, H)]
  const uint8_t* stacked_down8 = nullptr;
  const float* stacked_down8_scales = nullptr;  // [E][fp8_scale_count(Blk128, H, I)]
  int64_t expert_I = 0;
  int64_t E = 0, top_k = 0;
  float routed_scale = 1.f, alpha = 1.702f, limit = 7.f;
  // FP8 experts at prefill sizes: the e4m3 × e4m3 wgmma GEMMs (moe_gemm_path) unless false — then the W8A16 mma.sync
  // GEMMs at every size (`--fp8-prefill-gemm w8a16`: f16 activations everywhere).
  bool fp8_e4m3_prefill = true;
};
void moe_forward(Gemm& g, const MoeArgs& a, const float* xn, int64_t T, int64_t H, float* x, FfnScratch& scr,
                 cudaStream_t s);
void moe_forward_sync(Gemm& g, const MoeArgs& a, const float* xn, int64_t T, int64_t H, float* x, FfnScratch& scr,
                      cudaStream_t s);
// True when moe_forward takes the grouped path for these arguments.
bool moe_uses_grouped(const MoeArgs& a, int64_t H);

}  // namespace m3::cuda
