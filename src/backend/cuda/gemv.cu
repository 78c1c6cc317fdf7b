// Weight-streaming GEMV (backend/cuda/gemv.cuh). Layout per warp: rows n0 .. n0 + RW − 1; K in steps of
// 32 lanes × one 16-byte load (8 bf16 or 16 e4m3 weights per lane); U steps' loads of all RW rows issue before
// any of them is used, so U · RW 16-byte loads per lane are in flight.
#include "backend/cuda/gemv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace m3::cuda {

namespace {

constexpr int kWarps = 4;  // per CTA

struct GemvParams {
  const uint16_t* x;  // [T, K] bf16
  const uint8_t* w;   // [N, K] weights (bytes)
  const float* scales;
  Fp8Scale fmt;
  int64_t N, K, sld;
  void* y;
  bool out_bf16, accumulate;
};

__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// Weight element traits: kPerLoad weights per 16-byte load; dot(w, x) adds the products of one load's weights with
// x[k .. k + kPerLoad) (x as packed bf16 words, 2 per 32-bit word) into acc, in k order.
struct Bf16W {
  static constexpr int kPerLoad = 8;
  static constexpr bool kScaled = false;
  __device__ __forceinline__ static float dot(const uint4& w, const uint32_t* xw, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = fmaf(bf_lo(ws[i]), bf_lo(xw[i]), acc);
      acc = fmaf(bf_hi(ws[i]), bf_hi(xw[i]), acc);
    }
    return acc;
  }
};

struct E4m3W {
  static constexpr int kPerLoad = 16;
  static constexpr bool kScaled = true;
  // Two codes → two f16 values, exactly (every e4m3 value is an f16 value).
  __device__ __forceinline__ static void two(uint16_t codes, float& a, float& b) {
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(codes));
    const __half2 v = *reinterpret_cast<const __half2*>(&h);
    a = __low2float(v), b = __high2float(v);
  }
  __device__ __forceinline__ static float dot(const uint4& w, const uint32_t* xw, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // word i: weights 4i .. 4i + 3 (bytes in k order); x words 2i, 2i + 1
      float a, b, c, d;
      two(uint16_t(ws[i] & 0xffffu), a, b);
      two(uint16_t(ws[i] >> 16), c, d);
      acc = fmaf(a, bf_lo(xw[2 * i]), acc);
      acc = fmaf(b, bf_hi(xw[2 * i]), acc);
      acc = fmaf(c, bf_lo(xw[2 * i + 1]), acc);
      acc = fmaf(d, bf_hi(xw[2 * i + 1]), acc);
    }
    return acc;
  }
};

template <class Elem, int T, int RW, int U>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvParams p) {
  constexpr int E = Elem::kPerLoad, XW = E / 2;  // x words (bf16 pairs) per load
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * RW;
  if (n0 >= p.N) return;  // whole warp
  const int64_t row_bytes = p.K * (E == 8 ? 2 : 1);
  const uint8_t* wr[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) wr[r] = p.w + (n0 + r < p.N ? n0 + r : p.N - 1) * row_bytes + lane * 16;
  const int64_t steps = p.K / (32 * E);
  float acc[RW][T];
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;

  for (int64_t s0 = 0; s0 < steps; s0 += U) {
    uint4 w[U][RW];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < RW; ++r)
        if (s0 + u < steps)  // loads first, streamed (each weight byte is read once per step)
          w[u][r] = __ldcs(reinterpret_cast<const uint4*>(wr[r] + (s0 + u) * 512));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + u >= steps) break;
      const int64_t k = (s0 + u) * 32 * E + lane * E;
      float sc[RW];
      if constexpr (Elem::kScaled) {
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const int64_t row = n0 + r < p.N ? n0 + r : p.N - 1;
          sc[r] = p.fmt == Fp8Scale::Row128 ? __ldg(p.scales + (k >> 7) * p.sld + row)
                                            : __ldg(p.scales + (row >> 7) * p.sld + (k >> 7));
        }
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        uint32_t xw[XW];
        const uint4* xp = reinterpret_cast<const uint4*>(p.x + int64_t(t) * p.K + k);
#pragma unroll
        for (int q = 0; q < XW / 4; ++q) {
          const uint4 v = __ldg(xp + q);
          xw[4 * q] = v.x, xw[4 * q + 1] = v.y, xw[4 * q + 2] = v.z, xw[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          if constexpr (Elem::kScaled)
            acc[r][t] = fmaf(sc[r], Elem::dot(w[u][r], xw, 0.f), acc[r][t]);
          else
            acc[r][t] = Elem::dot(w[u][r], xw, acc[r][t]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0 && n0 + r < p.N) {
        const int64_t idx = int64_t(t) * p.N + n0 + r;
        if (p.out_bf16) {
          __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y);
          y[idx] = __float2bfloat16_rn(p.accumulate ? v + __bfloat162float(y[idx]) : v);
        } else {
          float* y = static_cast<float*>(p.y);
          y[idx] = p.accumulate ? y[idx] + v : v;
        }
      }
    }
}

// Rows per warp and steps in flight: 2 rows share each x load; U · RW loads of 16 bytes in flight per lane (8 at
// T ≤ 4, 4 above, where x and the accumulators take the registers).
template <class Elem, int T>
void launch_t(const GemvParams& p, cudaStream_t s) {
  constexpr int RW = 2, U = T <= 4 ? 4 : 2;
  const int64_t rows_per_cta = int64_t(kWarps) * RW;
  const unsigned grid = unsigned((p.N + rows_per_cta - 1) / rows_per_cta);
  gemv_kernel<Elem, T, RW, U><<<grid, kWarps * 32, 0, s>>>(p);
  M3_CUDA_LAUNCH_CHECK();
}

template <class Elem>
void launch(const GemvParams& p, int64_t T, cudaStream_t s) {
  switch (T) {
    case 1: return launch_t<Elem, 1>(p, s);
    case 2: return launch_t<Elem, 2>(p, s);
    case 3: return launch_t<Elem, 3>(p, s);
    case 4: return launch_t<Elem, 4>(p, s);
    case 5: return launch_t<Elem, 5>(p, s);
    case 6: return launch_t<Elem, 6>(p, s);
    case 7: return launch_t<Elem, 7>(p, s);
    default: return launch_t<Elem, 8>(p, s);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool gemv_supported(int64_t T, int64_t K, bool e4m3) {
  return T >= 1 && T <= kGemvMaxRows && K > 0 && K % (e4m3 ? 512 : 256) == 0;
}

void gemv_bf16(const uint16_t* x, int64_t T, int64_t K, const uint16_t* W, int64_t N, void* y, GemmOut out,
               bool accumulate, cudaStream_t s) {
  if (N <= 0 || T <= 0) return;
  M3_CUDA_REQUIRE(gemv_supported(T, K, false) && aligned16(x) && aligned16(W),
                  "gemv_bf16: T %lld (1..%lld), K %lld (a multiple of 256) and 16-byte aligned x, W", (long long)T,
                  (long long)kGemvMaxRows, (long long)K);
  GemvParams p{x, reinterpret_cast<const uint8_t*>(W), nullptr, Fp8Scale::Blk128, N, K, 0, y,
               out == GemmOut::BF16, accumulate};
  launch<Bf16W>(p, T, s);
}

void gemv_e4m3(const uint16_t* x, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
               cudaStream_t s) {
  if (W.N <= 0 || T <= 0) return;
  M3_CUDA_REQUIRE(gemv_supported(T, W.K, true) && aligned16(x) && aligned16(W.q),
                  "gemv_e4m3: T %lld (1..%lld), K %lld (a multiple of 512) and 16-byte aligned x, W", (long long)T,
                  (long long)kGemvMaxRows, (long long)W.K);
  M3_CUDA_REQUIRE(W.fmt == Fp8Scale::Row128 || W.fmt == Fp8Scale::Blk128,
                  "gemv_e4m3: scales must be Row128 or Blk128 (MXFP8 G32 is converted at load)");
  GemvParams p{x, W.q, static_cast<const float*>(W.scales), W.fmt, W.N, W.K, fp8_scale_ld(W.fmt, W.N, W.K), y,
               out == GemmOut::BF16, accumulate};
  launch<E4m3W>(p, T, s);
}

}  // namespace m3::cuda
