// Gemma RMSNorm, and the fused per-head q/k norm + partial NeoX RoPE + paged-cache write of the attention and
// index branches. Semantics: cpu::rms_norm_gemma and cpu::rope_neox_partial (backend/cpu/cpu_ops.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/kv_types.cuh"

namespace m3::cuda {

// y[rows, D] = x / sqrt(mean(x²) + eps) · (1 + w); x and y may alias. One block per row.
void rms_norm_gemma(const float* x, int64_t rows, int64_t D, const float* w, float eps, float* y, cudaStream_t s);

// The same norm written as bf16 (yb: [rows, D] bf16 bits, rounded to nearest even — bit-identical to
// rms_norm_gemma then f32_to_bf16) for a bf16 GEMM input, and as fp32 into y when y is not null (one pass).
void rms_norm_gemma_bf16(const float* x, int64_t rows, int64_t D, const float* w, float eps, uint16_t* yb, float* y,
                         cudaStream_t s);

// The bf16 norm (yb may be null) and, in the same pass, its 1×128 e4m3 quantisation for the FP8×FP8 prefill GEMMs:
// q bit for bit fp8_quantize_act_1x128 (fp8_gemm.cuh) on yb, rows rows..T_pad−1 padded. D % 128 == 0. (Rows wider
// than the register path fall back to the two passes and then need yb.)
void rms_norm_gemma_bf16_e4m3(const float* x, int64_t rows, int64_t D, const float* w, float eps, uint16_t* yb,
                              const Fp8ActOut& q, cudaStream_t s);

// inv_freq[i] = theta^(−2i/rotary_dim), i < rotary_dim/2, computed exactly as the CPU reference does (fp64 → fp32).
std::vector<float> rope_inv_freq(int rotary_dim, double theta);

// One projection row per token holds several heads of width D at known columns. The kernel normalises the "q"
// heads and the "k" heads with their own weights, applies RoPE to both, and routes them:
//   q head i  → q_out[t, i, :]                                       ([T, n_q, D], contiguous)
//   k head i  → k_cache + slot_page[t]·page_stride + i·k_head_stride + (pos[t] % block)·D
//   v head i  → v_cache + (same addressing, raw, no norm/RoPE)
// Attention branch: q = Hq heads, k = v = Hkv heads, head stride block·D (HND pages).
// Index branch: q = Hidx index-query heads, k = the one index key (head stride 0), no v.
struct HeadsNormRopeArgs {
  const float* src = nullptr;  // [T, src_ld]
  int64_t src_ld = 0;
  int T = 0, D = 0;
  int n_q = 0, q_col0 = 0;
  const float* q_w = nullptr;  // [D]
  float* q_out = nullptr;
  uint16_t* q_out_bf16 = nullptr;  // when set, q heads go here as bf16 (RNE) instead of q_out: the tensor-core
                                   // attention input without a separate conversion
  int n_k = 0, k_col0 = 0;
  const float* k_w = nullptr;  // [D]
  void* k_cache = nullptr;  // elements of cache_type
  int64_t k_head_stride = 0;
  int n_v = 0, v_col0 = 0;
  void* v_cache = nullptr;
  int64_t v_head_stride = 0;
  KvType cache_type = KvType::F32;
  float k_scale = 1.f, v_scale = 1.f;  // E4M3 caches: code = rne_e4m3(value / scale) (kv_fp8.cuh), per tensor
  const int32_t* pos = nullptr;        // [T] absolute positions
  const int32_t* slot_page = nullptr;  // [T] physical page holding position pos[t] (unused when n_k = n_v = 0)
  int64_t page_stride = 0;             // elements per page (the K and V pools share it)
  int block_size = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int rotary_dim = 0;
  float eps = 1e-6f;
};
void heads_norm_rope(const HeadsNormRopeArgs& a, cudaStream_t s);

// x[rows, D] → gathered rows: y[i] = x[idx[i]] (fp32). Used for the LM-head rows and the MoE expert inputs.
void gather_rows(const float* x, int64_t D, const int32_t* idx, int64_t n, float* y, cudaStream_t s);

// out[t, :] = table[ids[t], :] (bf16 or fp32 table → fp32). Bad ids were rejected on the host.
void embed_rows(const void* table, bool bf16, int64_t H, const int32_t* ids, int64_t T, float* out, cudaStream_t s);

}  // namespace m3::cuda
