// FP8 weight formats and their CPU twins (issue 15 items 1–2). The semantic definition of every FP8 op of the CUDA
// backend (backend/cuda/fp8_gemm.cuh): the device conversions must match these bit for bit, the GEMMs element by
// element up to fp32 summation order. docs/FP8.md describes the formats and the measured accuracy of the conversion.
//
// Formats: base/fp8_format.h (G32 = the MXFP8 release; Row128 / Blk128 = power-of-two fp32 scales per 1×128 / 128×128
// block, the layouts cuBLASLt reads).
// Row128 and Blk128 are made from G32 by requantisation: each block takes the smallest power of two 2^S with
// max|W| ≤ 448·2^S and every value becomes rne_e4m3(W · 2^−S). Values of a 32-group whose own scale was smaller lose
// low mantissa bits (or underflow); docs/FP8.md measures how much.
// Activations for the FP8×FP8 GEMM: 1×128 blocks, scale = amax/448 (fp32, not a power of two), q = rne_e4m3(x / s),
// scales stored [L][round_up(T, 4)].
#pragma once

#include <cstdint>
#include <vector>

#include "base/fp8_format.h"

namespace m3::cpu {

// Round to nearest even e4m3 (fn), saturating to ±448, NaN → 0x7f. Bit-identical to base/dtype.h f32_to_e4m3 and to
// the device's cvt.rn.satfinite.e4m3x2.f32, but O(1).
uint8_t e4m3_rne(float f);

// The smallest S with amax ≤ 448·2^S (amax > 0, finite); 0 for amax == 0.
int pow2_exponent_for(float amax);

// Exact dequantisation: out[n, k] = e4m3(q[n, k]) · scale(n, k). `scales` is uint8_t UE8M0 for G32, float otherwise.
void fp8_dequant(const uint8_t* q, const void* scales, Fp8Scale fmt, int64_t N, int64_t K, float* out);

// MXFP8 (G32) → Row128 or Blk128 by requantisation (see above). K need not be a multiple of 128 (the last block is
// short); q_out: [N, K], s_out: fp8_scale_count(fmt, N, K) floats (padding entries 1.0).
void fp8_requant_from_mx(const uint8_t* q, const uint8_t* ue8m0, int64_t N, int64_t K, Fp8Scale fmt, uint8_t* q_out,
                         float* s_out);

// The MXFP8 quantiser (for tests and the accuracy tool): per 32 values the smallest power of two 2^S with
// max|w| ≤ 448·2^S, stored as S + 127 (clamped to [0, 254]), q = rne_e4m3(w · 2^−S). K % 32 == 0.
void mx_quantize(const float* w, int64_t N, int64_t K, uint8_t* q, uint8_t* ue8m0);

// 1×128 activation quantisation (see above). x: [T, K] fp32 values (already bf16-rounded when the device input is
// bf16), K % 128 == 0. q: [T, K]; s: [K/128][ld_s] with ld_s ≥ T (columns T..ld_s−1 are left untouched).
void fp8_quantize_act_1x128(const float* x, int64_t T, int64_t K, uint8_t* q, float* s, int64_t ld_s);

// CPU twin of the W8A16 GEMM: y[T, N] = x[T, K] · dequant(W)ᵀ (x as given: the device rounds it to bf16 first, so
// pass bf16-rounded values), fp32.
void matmul_fp8_w8a16(const float* x, int64_t T, int64_t K, const uint8_t* q, const void* scales, Fp8Scale fmt,
                      int64_t N, float* y);

// CPU twin of the FP8×FP8 GEMM: y = dequant(xq, xs)·dequant(W)ᵀ, xs laid out as fp8_quantize_act_1x128 writes it.
void matmul_fp8_blockscaled(const uint8_t* xq, const float* xs, int64_t ld_s, int64_t T, int64_t K, const uint8_t* q,
                            const float* scales, Fp8Scale fmt, int64_t N, float* y);

// FP8 K/V and index-K caches (issue 15 item 4; docs/FP8.md §7): per-tensor fp32 scale, q = rne_e4m3(x / scale)
// (fp32 division), value = e4m3(q) · scale. The twins of cuda::kv_quantize_e4m3 (bit for bit) and of the e4m3
// decode kernels' loads (their CPU reference runs the fp32 ops on these dequantised values).
void kv_quantize_e4m3(const float* x, int64_t n, float scale, uint8_t* q);
void kv_dequantize_e4m3(const uint8_t* q, int64_t n, float scale, float* out);

}  // namespace m3::cpu
