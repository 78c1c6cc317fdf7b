// FP8 (e4m3) K/V and index-K caches (issue 15 item 4; docs/FP8.md §7): the element type, the quantiser that fills
// an e4m3 pool, and the register conversion the decode kernels use on the way to the bf16 mma.sync.
// Format: per-tensor fp32 scale s (vLLM's --kv-cache-dtype fp8 k_scale / v_scale; MSA stores index-K unscaled,
// s = 1 — ../shared/docs/MSA_KERNELS.md §2.2): value = e4m3(q) · s, q = rne_e4m3(x / s) (fp32 division, saturating
// to ±448). CPU twins: cpu::kv_quantize_e4m3 / kv_dequantize_e4m3 (backend/cpu/fp8.h), bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace m3::cuda {

using e4m3_t = __nv_fp8_e4m3;  // one byte, the pools' element type for --kv-cache-dtype fp8

// q[i] = rne_e4m3(x[i] / scale), n elements (any n; x and q need no alignment). Capture-safe, allocation-free.
void kv_quantize_e4m3(const __nv_bfloat16* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s);
void kv_quantize_e4m3(const float* x, int64_t n, float scale, e4m3_t* q, cudaStream_t s);

// The prefill staging copy (executor, docs/FP8.md §8.2): for each of the n_pages page ids in pages (device), the
// page_elems codes of that page of q [P, page_elems] become bf16(e4m3(code) · scale) at the same page of out
// [P, page_elems], so the bf16 prefill kernels read the values the e4m3 decode kernels read (exact for scale = 1
// or any power of two; otherwise one bf16 rounding of the product). page_elems % 16 == 0, q and out 16-byte
// aligned. Repeated ids are fine (the same values are written twice). CPU twin: cpu::kv_dequantize_e4m3 then
// f32_to_bf16 per page. Allocation-free.
void kv_dequantize_pages_e4m3(const e4m3_t* q, int64_t page_elems, const int32_t* pages, int64_t n_pages,
                              float scale, __nv_bfloat16* out, cudaStream_t s);

#ifdef __CUDACC__
// The stored code of x: rne_e4m3(x / scale), fp32 division rounded to nearest (the CPU twin's x / scale), then
// cvt.rn.satfinite (saturating to ±448; NaN → 0x7f, the CPU twin's e4m3_rne).
__device__ __forceinline__ uint8_t e4m3_quantize(float x, float scale) {
  return uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}

// Two e4m3 codes → bf16x2 holding the exact values. Codes S.EEEE.MMM placed as bf16 S.0000EEEE.MMM0000 are
// value·2^−120 (for E = 0 too: the bf16 subnormal (M/8)·2^−126), then one mul.bf16x2 by 2^120 (exact: every
// product is an e4m3 value). v: the two codes in bytes 1 and 3 (others zero), low half first.
__device__ __forceinline__ uint32_t e4m3_placed_to_bf16x2(uint32_t v) {
  const uint32_t b = ((v >> 4) & 0x07F007F0u) | (v & 0x80008000u);
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(b), "r"(0x7B807B80u));  // 2^120 = bf16 0x7B80
  return d;
}
// Bytes (i, j) of w → bf16x2 (lo = byte i, hi = byte j); the selector is 0x{j}4{i}4.
template <int kSel>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t w) {
  return e4m3_placed_to_bf16x2(__byte_perm(w, 0, kSel));
}
// Bytes 0–1 (kHi false) or 2–3 (kHi true) of w → f16x2 holding the exact values (lo = the lower byte): one
// cvt.rn.f16x2.e4m3x2 (sm_89+), where the bf16 route above takes three instructions. Every e4m3 value, subnormals
// included, is an f16 value.
template <bool kHi>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
  uint32_t d;
  if constexpr (kHi)
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(d) : "r"(w));
  else
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(d) : "r"(w));
  return d;
}
// bf16x2 → f16x2 (round to nearest): exact for |v| in [2^-14, 65504] (f16 has 3 more significand bits); smaller
// magnitudes round to f16 subnormals (steps of 2^-24), larger ones overflow to ±inf, or saturate to ±65504 with kSat.
template <bool kSat = false>
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
  const float lo = __uint_as_float(w << 16), hi = __uint_as_float(w & 0xffff0000u);
  uint32_t d;
  if constexpr (kSat)
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
constexpr int kE4m3Bytes01 = 0x1404, kE4m3Bytes23 = 0x3424;

// A [rows, 128] e4m3 tile in shared memory: a row is 128 bytes = 8 chunks of 16; chunk c of row r sits at chunk
// c ^ (r & 7), so the 8 rows of one ldmatrix 8×8 (b16) matrix hit 8 distinct 16-byte bank groups.
__device__ __forceinline__ uint32_t swz64(int row, int chunk) {
  return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}
#endif

}  // namespace m3::cuda
