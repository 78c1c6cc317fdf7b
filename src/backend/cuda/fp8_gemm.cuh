// FP8 weights on Hopper (issue 15 items 1–2): the load-time scale conversion, the activation quantisation and the
// two GEMMs, y[T, N] (+)= x[T, K] · Wᵀ with W stored as e4m3 + scales (formats: base/fp8_format.h, docs/FP8.md).
//   - W8A16 (decode, T ≤ 64 per launch): weights dequantised in registers — e4m3 → bf16 by a bit shift (the value
//     times 2^−120, exact for every code including subnormals), times the block's scale·2^120 in bf16 (exact for
//     power-of-two scales ≤ 2^7, which is every scale the formats hold), then mma.sync m16n8k16 bf16 with fp32
//     accumulation; bf16 activations; split-K with a deterministic in-kernel reduction. Reads every scale format,
//     so a tensor converted once for the prefill GEMM needs no second copy. The element type is a template
//     parameter of the kernel (an e4m3 trait today).
//   - FP8×FP8 (prefill): cuBLASLt block scaling, e4m3 activations with 1×128 fp32 scales (quantised here) times
//     Row128 (VEC128_32F) or Blk128 (BLK128x128_32F) weights. (The MX mode VEC32_UE8M0 does not run on sm_90, so
//     MXFP8 weights are requantised at load by fp8_requant_from_mx.)
// CPU twins: backend/cpu/fp8.h. Tests: tests/gpu/gpu_fp8_test.cpp. Benchmark: tools/bench_fp8_gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_wgmma.cuh"  // GemmOut
#include "base/fp8_format.h"

namespace m3::cuda {

// A device FP8 weight: q [N, K] e4m3 bytes, scales as base/fp8_format.h lays them out (UE8M0 bytes for G32, fp32
// otherwise).
struct Fp8Weight {
  const uint8_t* q = nullptr;
  const void* scales = nullptr;
  Fp8Scale fmt = Fp8Scale::G32;
  int64_t N = 0, K = 0;
};

// MXFP8 (G32) → Row128 / Blk128 by requantisation, bit for bit backend/cpu/fp8.h fp8_requant_from_mx.
// q_out: [N, K] (may be q itself: every element is read before it is written); s_out: fp8_scale_count(fmt, N, K)
// floats.
void fp8_requant_from_mx(const uint8_t* q, const uint8_t* ue8m0, int64_t N, int64_t K, Fp8Scale fmt, uint8_t* q_out,
                         float* s_out, cudaStream_t s);

// 1×128 activation quantisation, bit for bit backend/cpu/fp8.h fp8_quantize_act_1x128. x: [T, K] bf16 (x_bf16) or
// fp32; K % 128 == 0. Rows T..T_pad−1 (T_pad ≤ ld_s) are written as zeros with scale 1 (cuBLASLt wants the token
// count a multiple of 4). q: [T_pad, K]; s: [K/128][ld_s].
void fp8_quantize_act_1x128(const void* x, bool x_bf16, int64_t T, int64_t T_pad, int64_t K, uint8_t* q, float* s,
                            int64_t ld_s, cudaStream_t st);

// Dummy FP8 weights (`--load-format dummy --dtype fp8`): q [N, K] = rne_e4m3(u · 2^−S) with u = counter_uniform(key,
// i, scale) (base/counter_hash.h: the bf16 dummy fill's values) and S the smallest exponent with scale ≤ 448·2^S
// (base/fp8_format.h fp8_dummy_exponent); every scale of `fmt` is 2^S (UE8M0 byte S + 127 for G32).
void fp8_fill_counter_uniform(uint8_t* q, void* scales, Fp8Scale fmt, int64_t N, int64_t K, uint64_t key, float scale,
                              cudaStream_t s);

// Whether the writers of FP8×FP8 GEMM inputs quantise them in their own pass (rms_norm_gemma_bf16_e4m3,
// swiglu_oai_e4m3) instead of Fp8Gemm::proj's separate pass; bit-identical either way. M3_FP8_FUSED_QUANT=0 turns it
// off (A/B timing).
bool fp8_fused_quant();

// W8A16 kernel variants (Fp8Gemm::w8a16).
enum class W8Kernel : uint8_t { Auto, Chunk64, Lines128 };

class Fp8Gemm {
 public:
  Fp8Gemm();
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // W8A16: y[T, N] (+)= x[T, K] · dequant(W)ᵀ, x bf16. K % 64 == 0, 16-byte aligned x and q; any T ≥ 0 (slices of
  // 64 rows). `nt` forces the rows-per-warp tile (16·nt weight rows; 1, 2 or 4; 0 = default) for benchmarks.
  // `kernel` Lines128 selects the whole-line variant (K % 128 == 0, slices of 16 rows, nt 1 or 2; docs/FP8.md §5 —
  // not yet measured on a device, so Auto keeps the 64-wide chunk kernel).
  // One stream at a time per Fp8Gemm (the split-K counters live in the object).
  void w8a16(const uint16_t* x, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate, cudaStream_t s,
             int nt = 0, W8Kernel kernel = W8Kernel::Auto);

  // FP8×FP8 through cuBLASLt: quantises x (bf16 or fp32) to e4m3 with 1×128 scales, then the block-scaled GEMM.
  // W must be Row128 or Blk128; K % 128 == 0.
  void blockscaled(const void* x, bool x_bf16, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
                   cudaStream_t s);
  // The GEMM alone on activations already quantised (xq [T_pad, K], xs [K/128][T_pad], T_pad = round_up(T, 4)).
  void blockscaled_q(const uint8_t* xq, const float* xs, int64_t T, const Fp8Weight& W, void* y, GemmOut out,
                     bool accumulate, cudaStream_t s);
  // One projection of the executor's `--dtype fp8` (bf16 activations xb [T, K]): the kernel fp8_pick_path chooses
  // for T rows (W8A16 below lt_min_rows, cuBLASLt FP8×FP8 from there; lt_min_rows ≤ 0: W8A16 only). W in Blk128 or
  // Row128. No allocation once the buffers have grown for the largest T (reserve), so it can be captured.
  // xq (optional): xb already quantised per 1×128 by its writer (rms_norm_gemma_bf16_e4m3, swiglu_oai_e4m3) with
  // T_pad = ld_s = round_up(T, 4); used when the path is cuBLASLt FP8 (proj_quantises()), which then skips its own
  // quantisation pass. xb may be null only when that path is taken with xq.
  void proj(const uint16_t* xb, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
            int64_t lt_min_rows, cudaStream_t s, const Fp8ActOut* xq = nullptr);
  // Whether proj() quantises its input for T rows of W (the cuBLASLt FP8×FP8 path): where a writer can do it instead.
  static bool proj_quantises(int64_t T, const Fp8Weight& W, int64_t lt_min_rows) {
    return fp8_pick_path(T, W.N, W.K, lt_min_rows) == Fp8Path::Lt;
  }
  // Grows the activation-quantisation buffers for T rows of K (the largest projection input), so a graph capture
  // never allocates there.
  void reserve(int64_t T, int64_t K);
  // The operand arrangement cuBLASLt accepted for this call's plan ("none" before the first call).
  const char* lt_arrangement(int64_t T, const Fp8Weight& W, GemmOut out, bool accumulate) const;

 private:
  struct LtPlan;
  using LtKey = std::tuple<int64_t, int64_t, int64_t, int, int, int>;  // T_pad, K, N, fmt, out, accumulate
  LtPlan& lt_plan(int64_t Tp, int64_t K, int64_t N, Fp8Scale fmt, GemmOut out, bool accumulate,
                  const void* wscale, const float* xscale);

  void* lt_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer<uint8_t> lt_ws_;
  DeviceBuffer<float> partials_;     // W8A16 split-K partial sums
  DeviceBuffer<unsigned> counters_;  // W8A16 split-K arrival counters (zero between launches)
  DeviceBuffer<uint8_t> xq_;         // quantised activations
  DeviceBuffer<float> xs_;
  DeviceBuffer<uint8_t> ypad_;       // output staging when T is not a multiple of 4
  std::map<LtKey, std::unique_ptr<LtPlan>> plans_;
};

}  // namespace m3::cuda
