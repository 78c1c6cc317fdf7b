// CPU reference ops. Each function is the semantic definition of an op (fp32 math, fp32 storage); the CUDA
// backend implements the same computations and is tested against these, element by element.
//
// Determinism contract: every output element depends only on its own inputs and is computed with a fixed
// reduction order, independent of how many tokens are in the call. That makes chunked prefill and
// token-by-token decode bitwise equal to a one-shot forward, which the tests rely on.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace m3::cpu {

// y[T, N] = x[T, K] · W[N, K]ᵀ (row-major). Threaded over N.
void matmul_nt(const float* x, int64_t T, int64_t K, const float* W, int64_t N, float* y);

// Tool hook (tools/fp8_accuracy emulates FP8 activations with it): when set, matmul_nt first calls
// hook(x, T, K, W, ctx); a non-null result replaces x for that call. Unset (the default) it costs one load.
// Not thread-safe against concurrent set calls; set it before running a model.
using MatmulInputHook = const float* (*)(const float* x, int64_t T, int64_t K, const float* W, void* ctx);
void set_matmul_input_hook(MatmulInputHook hook, void* ctx);

// Gemma RMSNorm over rows: y = x / sqrt(mean(x²) + eps) · (1 + w). x, y: [rows, D] (may alias), w: [D].
void rms_norm_gemma(const float* x, int64_t rows, int64_t D, const float* w, float eps, float* y);

// NeoX RoPE on the first rotary_dim channels of each head, in place. x: [T, H, D]; positions: [T].
// Pairs (i, i + rotary_dim/2); inv_freq[i] = theta^(-2i/rotary_dim); angle = pos · inv_freq in fp32.
void rope_neox_partial(float* x, int64_t T, int64_t H, int64_t D, int64_t rotary_dim, const int32_t* positions,
                       double theta);

// SwiGLU-OAI: a = min(g, limit) · sigmoid(alpha · min(g, limit)) · (clamp(u, −limit, limit) + 1).
// gate_up: [T, 2·I] laid out as [gate | up] per row; out: [T, I].
void swiglu_oai(const float* gate_up, int64_t T, int64_t I, float alpha, float limit, float* out);

// MoE routing. logits: [T, E] (fp32 router output). Chooses top_k experts by sigmoid(logit) + bias (bias may be
// null), weights = unbiased sigmoid of the chosen, renormalised to sum 1, times scale.
// ids/weights: [T, top_k]; ties go to the lower expert id.
void moe_route(const float* logits, int64_t T, int64_t E, const float* bias, int top_k, float scale, int32_t* ids,
               float* weights);

// ---- Paged attention --------------------------------------------------------------------------------------
// The cache of one layer is addressed through a page table: logical block b of a sequence lives in physical page
// page_table[b]. K/V pages are HND: [Hkv, B, D] per page, page stride = Hkv·B·D floats.
struct PagedKV {
  const float* k = nullptr;   // base of the K pool of this layer: [P, Hkv, B, D]
  const float* v = nullptr;   // base of the V pool of this layer
  int64_t page_stride = 0;    // floats between consecutive pages (lets K, V, index-K share one page unit)
  int num_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;
};

// One query row's view of attention: query positions and which logical blocks it may read.
// Dense causal GQA for the queries of one sequence. q: [Tq, Hq, D]; out: [Tq, Hq, D].
// positions[i] = absolute position of query i; keys 0..positions[i] are visible.
void attention_dense_causal(const float* q, int64_t Tq, int Hq, const int32_t* positions, const PagedKV& kv,
                            const int32_t* page_table, float scale, float* out);

// MSA sparse attention for the queries of one sequence. selection: head-major [Hkv, Tq, top_k] logical block ids,
// valid prefix then -1. Query head m reads the blocks selected for KV head m / (Hq/Hkv), keys j ≤ position.
void attention_sparse(const float* q, int64_t Tq, int Hq, const int32_t* positions, const PagedKV& kv,
                      const int32_t* page_table, const int32_t* selection, int top_k, float scale, float* out);

// ---- MSA indexer ------------------------------------------------------------------------------------------
// Index keys of one layer: pages of [B, Di] floats at index_k + page·page_stride.
struct PagedIndexK {
  const float* ik = nullptr;
  int64_t page_stride = 0;
  int block_size = 0;
  int index_dim = 0;
};

// Block scores for the queries of one sequence: scores[h, i, b] = max over keys j in block b with j ≤ p_i of
// iq[i, h] · ik[j], for b < local(p_i); entries for b ≥ local(p_i) are −inf (the local block is forced, never
// ranked). iq: [Tq, Hidx, Di]; scores: [Hidx, Tq, max_blocks] with max_blocks ≥ local(max p) + 1.
void msa_block_scores(const float* iq, int64_t Tq, int Hidx, const int32_t* positions, const PagedIndexK& cache,
                      const int32_t* page_table, int64_t max_blocks, float* scores);

// Top-k selection per (head, query) following the MSA contract: n = local + 1 visible blocks; n ≤ top_k → 0..local;
// else the top_k − 1 best history blocks (score desc, ties to the lower id) in ascending id order, then the local
// block in the last valid slot; −1 padding. scores as above; selection: [Hidx, Tq, top_k].
void msa_topk(const float* scores, int64_t Tq, int Hidx, const int32_t* positions, int block_size,
              int64_t max_blocks, int top_k, int32_t* selection);

// ---- Vision tower (vision_ops.cpp; docs/M3_MODEL.md §5.4) -----------------------------------------------------
// LayerNorm with bias over rows (mean/variance in double): y = (x − μ)/sqrt(σ² + eps) · w + b. x, y may alias.
void layer_norm(const float* x, int64_t rows, int64_t D, const float* w, const float* b, float eps, float* y);
// Exact (erf) GELU in place.
void gelu_erf(float* x, int64_t n);
// y[r, :] += b for every row.
void add_bias(float* y, int64_t rows, int64_t N, const float* b);
// HF 5.17's axial vision RoPE, in place on x [T, H, D]: D/4 frequencies θ^(−2k/(D/2)); per row the angles
// [pos_a·inv | pos_b·inv] (D/2), used for both halves; rotate-half pairs (i, i + D/2). HF passes (t, h): the
// temporal group and the patch row (the column is not used; docs/M3_MODEL.md §5.4).
void vision_rope_hf517(float* x, int64_t T, int64_t H, int64_t D, const int32_t* pos_a, const int32_t* pos_b,
                       double theta);
// The official (vLLM `_get_3d_rope_embed`) 3D vision RoPE, in place on x [T, H, D], fp32: n = D/6 frequencies
// inv[k] = θ^(−2k/(2n)), k < n, per axis (M3: D 80, n 13, 10000^(−2k/26)); per row the 3n angles
// [pos_t·inv | pos_h·inv | pos_w·inv] over NeoX pairs (i, i + 3n); dims 6n..D−1 pass through (M3: 78 and 79).
void vision_rope_official(float* x, int64_t T, int64_t H, int64_t D, const int32_t* pos_t, const int32_t* pos_h,
                          const int32_t* pos_w, double theta);
// Bidirectional multi-head attention over T rows: q, k, v, out [T, H, D]; softmax in fp32 (sum in double).
void attention_full(const float* q, const float* k, const float* v, int64_t T, int64_t H, int64_t D, float scale,
                    float* out);

}  // namespace m3::cpu
