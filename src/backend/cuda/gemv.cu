// Weight-streaming GEMV (backend/cuda/gemv.cuh). Layout per warp: rows n0 .. n0 + RW − 1; K in steps of
// 32 lanes × one 16-byte load (8 bf16 or 16 e4m3 weights per lane); U steps' loads of all RW rows issue before
// any of them is used, so U · RW 16-byte loads per lane are in flight.
#include "backend/cuda/gemv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/kv_fp8.cuh"    // e4m3x2_to_f16x2, bf16x2_to_f16x2
#include "backend/cuda/warp_mma.cuh"  // cp.async, ldmatrix, mma

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

// y[idx] (+)= v in the output type (both GEMV kernels).
__device__ __forceinline__ void store_out(const GemvParams& p, int64_t idx, float v) {
  if (p.out_bf16) {
    __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y);
    y[idx] = __float2bfloat16_rn(p.accumulate ? v + __bfloat162float(y[idx]) : v);
  } else {
    float* y = static_cast<float*>(p.y);
    y[idx] = p.accumulate ? y[idx] + v : v;
  }
}

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
      if (lane == 0 && n0 + r < p.N) store_out(p, int64_t(t) * p.N + n0 + r, v);
    }
}

// ---- e4m3 weights on tensor cores (gemv_e4m3, GemvKernel::Mma) ------------------------------------------------------
// The CUDA-core kernel above issues ≈ 3 instructions per weight at T = 1 (cvt to f16 pairs, f16 → f32, the FMA) and
// 8× the FMAs at T = 8; at HBM speed that is more than the SM issues (49–66 % of copy measured,
// bench/results/2026-12-03-gemv-h200.md). Here a CTA owns 16 weight rows (the m16n8k16 M; tokens are N, T ≤ 8 of
// its 8 columns) and its 4 warps split K in 512-byte chunks. A warp streams its chunks [16 rows × 512 B] through a
// cp.async ring of its own (each cp.async instruction reads 512 contiguous bytes of one row, as the kernel
// above does), ldmatrix gives lane (g, c) bytes 4c … 4c + 3 of rows g and g + 8 of a 16-byte column q, and one
// cvt.rn.f16x2.e4m3x2 per code pair makes the A fragment: bytes 4c + {0, 1} are logical k {2c, 2c + 1}, bytes
// 4c + {2, 3} logical {2c + 8, 2c + 9} (the mma's k order is free as long as A and B agree), so lane (g, c) takes
// x[g][16q + 4c … + 3] as its B fragment (one 8-byte shared load from the CTA's f16 copy of x, made once at the
// start while the first chunks are in flight). ≈ 0.03 instructions per weight, at any T.
// x is f16 inside the mma: exact for |x| in [2^-14, 65504]; smaller values round to f16 subnormals (steps of 2^-24),
// larger ones saturate to ±65504 (M3's decode projections read RMS-normed rows, attention outputs and SwiGLU-OAI
// activations, |a| ≤ 56). The Blk128 / Row128 scale is constant over 128 K: each 128-K block's 8 mmas accumulate
// apart and are scaled into the sums once. The 4 warps' sums meet in shared memory in warp order (deterministic).
// The ring's shape is a template parameter (kChunk bytes per row per stage, kStages); launch_e4m3_mma picks it:
// 512 B × 2 stages (one chunk streams in while the other is multiplied; 64 KiB leaves room for x and a second CTA per
// SM up to T·K ≈ 20k) or, at T = 1, 256 B × 3 (48 KiB).
constexpr int kMmaWarps = 4;
constexpr int64_t kMmaMaxSmem = 225 * 1024;  // 227 KiB opt-in per block, less the 2 KiB of static `red`
__host__ __device__ constexpr int mma_ring_bytes(int chunk, int stages) { return kMmaWarps * stages * 16 * chunk; }
// 64 KiB of ring (512 × 2), then scales [K/128][16] and x f16 [T][K + 16].
int64_t mma_smem_bytes(int64_t T, int64_t K, int ring = mma_ring_bytes(512, 2)) {
  return ring + (K / 128) * 16 * 4 + T * (K + 16) * 2;
}

template <int kChunk, int kMmaStages>
__global__ void __launch_bounds__(kMmaWarps * 32, 2) gemv_e4m3_mma_kernel(const GemvParams p, int T) {
  constexpr int kChunkBytes = 16 * kChunk, kMmaRing = mma_ring_bytes(kChunk, kMmaStages);
  constexpr int kCols = kChunk / 16, kRowsPerLoad = 32 / kCols;  // 16-byte columns per row; rows per cp.async
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float red[kMmaWarps][16][8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const int nch = int(p.K / kChunk), c0 = nch * warp / kMmaWarps, c1 = nch * (warp + 1) / kMmaWarps;
  const uint32_t ring = smem_addr(smem + warp * kMmaStages * kChunkBytes);
  const uint64_t policy = l2_evict_first_policy();
  // Rows past N read row N − 1 (their sums are never stored).
  // Load i of a chunk: rows i·kRowsPerLoad + lane / kCols, 16-byte column lane % kCols (one instruction reads
  // kChunk contiguous bytes of each of its rows); column c of row r is stored at c ^ (r & 7): ldmatrix conflict-free.
  constexpr int kLoads = 16 / kRowsPerLoad;
  const uint8_t* src[kLoads];
  uint32_t doff[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = i * kRowsPerLoad + lane / kCols, col = lane % kCols;
    src[i] = p.w + (n0 + r < p.N ? n0 + r : p.N - 1) * p.K + col * 16;
    doff[i] = uint32_t(r * kChunk + ((col ^ (r & 7)) << 4));
  }
  auto load = [&](int ch, int stage) {
    const uint32_t dst = ring + stage * kChunkBytes;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) cp_async16_policy(dst + doff[i], src[i] + int64_t(ch) * kChunk, policy);
  };
#pragma unroll
  for (int st = 0; st < kMmaStages - 1; ++st) {
    if (c0 + st < c1) load(c0 + st, st);
    cp_async_commit();
  }
  // ldmatrix.x4 lane addresses: matrix i / 8 = (rows 0–7 | 8–15) × (column q | q + 1), row i % 8.
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = lane >> 4;
  // x [T, K] bf16 → xs [T][K + 16] f16 (the 32-byte pad puts rows g and g + 4 in different banks).
  // The tile's scales → ss [K/128][16] (row r of the tile; rows past N take row N − 1's).
  const int64_t xld = p.K + 16, nkb = p.K / 128;
  float* ss = reinterpret_cast<float*>(smem + kMmaRing);
  uint16_t* xs = reinterpret_cast<uint16_t*>(ss + nkb * 16);
  for (int i = threadIdx.x; i < int(nkb) * 16; i += kMmaWarps * 32) {
    const int64_t kb = i >> 4, row = n0 + (i & 15) < p.N ? n0 + (i & 15) : p.N - 1;
    ss[i] = p.fmt == Fp8Scale::Row128 ? __ldg(p.scales + kb * p.sld + row) : __ldg(p.scales + (row >> 7) * p.sld + kb);
  }
  const int k8 = int(p.K / 8);
  for (int i = threadIdx.x; i < T * k8; i += kMmaWarps * 32) {
    const int64_t t = i / k8, k = int64_t(i % k8) * 8;
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.x + t * p.K + k));
    *reinterpret_cast<uint4*>(xs + t * xld + k) = make_uint4(bf16x2_to_f16x2<true>(v.x), bf16x2_to_f16x2<true>(v.y),
                                                             bf16x2_to_f16x2<true>(v.z), bf16x2_to_f16x2<true>(v.w));
  }
  __syncthreads();
  const uint16_t* xg = xs + (g < T ? g : 0) * xld + 4 * c;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int ch = c0; ch < c1; ++ch) {
    cp_async_wait<kMmaStages - 2>();
    __syncwarp();  // every lane's copies of chunk ch landed; the stage refilled below was read last iteration
    if (ch + kMmaStages - 1 < c1) load(ch + kMmaStages - 1, (ch + kMmaStages - 1 - c0) % kMmaStages);
    cp_async_commit();
    const uint32_t st = ring + ((ch - c0) % kMmaStages) * kChunkBytes;
#pragma unroll
    for (int kb = 0; kb < kChunk / 128; ++kb) {
      const int64_t k0 = int64_t(ch) * kChunk + kb * 128;
      uint32_t xf[8][2];  // B fragments of the block's 8 k16 steps: x[g][k0 + 16j + 4c … + 3] (f16)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint2 v = g < T ? *reinterpret_cast<const uint2*>(xg + k0 + 16 * j) : make_uint2(0u, 0u);
        xf[j][0] = v.x, xf[j][1] = v.y;
      }
      const float s0 = ss[(k0 >> 7) * 16 + g], s1 = ss[(k0 >> 7) * 16 + g + 8];
      float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {  // columns q = 8kb + 2jj and q + 1
        const int q = kb * 8 + 2 * jj;
        uint32_t r0, r1, r2, r3;
        ldmatrix_x4(st + lrow * kChunk + (((q + lcol) ^ (lrow & 7)) << 4), r0, r1, r2, r3);
        const uint32_t a0[4] = {e4m3x2_to_f16x2<false>(r0), e4m3x2_to_f16x2<false>(r1), e4m3x2_to_f16x2<true>(r0),
                                e4m3x2_to_f16x2<true>(r1)};
        mma_f16_16816(blk, a0, xf[2 * jj][0], xf[2 * jj][1]);
        const uint32_t a1[4] = {e4m3x2_to_f16x2<false>(r2), e4m3x2_to_f16x2<false>(r3), e4m3x2_to_f16x2<true>(r2),
                                e4m3x2_to_f16x2<true>(r3)};
        mma_f16_16816(blk, a1, xf[2 * jj + 1][0], xf[2 * jj + 1][1]);
      }
      acc[0] = fmaf(s0, blk[0], acc[0]), acc[1] = fmaf(s0, blk[1], acc[1]);
      acc[2] = fmaf(s1, blk[2], acc[2]), acc[3] = fmaf(s1, blk[3], acc[3]);
    }
  }
  cp_async_wait<0>();
  // C fragment: (row g, tokens 2c, 2c + 1), (row g + 8, the same tokens).
  red[warp][g][2 * c] = acc[0], red[warp][g][2 * c + 1] = acc[1];
  red[warp][g + 8][2 * c] = acc[2], red[warp][g + 8][2 * c + 1] = acc[3];
  __syncthreads();
  const int row = threadIdx.x >> 3, t = threadIdx.x & 7;
  if (t < T && n0 + row < p.N) {
    float v = red[0][row][t];
#pragma unroll
    for (int w = 1; w < kMmaWarps; ++w) v += red[w][row][t];
    store_out(p, int64_t(t) * p.N + n0 + row, v);
  }
}

template <int kChunk, int kStages>
void launch_e4m3_mma_shape(const GemvParams& p, int64_t T, cudaStream_t s) {
  static const cudaError_t attr = cudaFuncSetAttribute(gemv_e4m3_mma_kernel<kChunk, kStages>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMmaMaxSmem));
  M3_CUDA_CHECK(attr);
  const size_t smem = size_t(mma_smem_bytes(T, p.K, mma_ring_bytes(kChunk, kStages)));
  gemv_e4m3_mma_kernel<kChunk, kStages><<<unsigned((p.N + 15) / 16), kMmaWarps * 32, smem, s>>>(p, int(T));
  M3_CUDA_LAUNCH_CHECK();
}

// One token: the 256 B × 3 ring (48 KiB; up to four CTAs per SM, so every row tile of an M3 projection is resident
// at once) — measured faster at T = 1 on all six M3 shapes (o 17.3 → 15.2 µs, gate_up 14.6 → 12.4, the dense MLP's
// gate_up 41.1 → 38.9); from T = 2 the 512 B × 2 ring was as fast or faster (qkv 20.3 vs 22.2 µs;
// bench/results/2026-12-03c-fp8-decode-h200.md). M3_GEMV_MMA_SHAPE=256x3 / 512x2 forces one (A/B runs).
void launch_e4m3_mma(const GemvParams& p, int64_t T, cudaStream_t s) {
  static const int forced = [] {
    const char* e = std::getenv("M3_GEMV_MMA_SHAPE");
    return e == nullptr ? 0 : std::strcmp(e, "256x3") == 0 ? 1 : std::strcmp(e, "512x2") == 0 ? 2 : 0;
  }();
  if (forced == 1 || (forced == 0 && T == 1))
    launch_e4m3_mma_shape<256, 3>(p, T, s);
  else
    launch_e4m3_mma_shape<512, 2>(p, T, s);
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

bool gemv_e4m3_mma_supported(int64_t T, int64_t K) {
  return gemv_supported(T, K, true) && mma_smem_bytes(T, K) <= kMmaMaxSmem;
}

GemvKernel gemv_e4m3_kernel_for(int64_t T, int64_t N, int64_t K) {
  // Tensor cores where the row tiles fill the GPU (16 rows per CTA, two CTAs per SM where x is small) and x fits
  // beside the ring; the per-row warps of the CUDA-core kernel spread a narrow matrix over more SMs.
  return N >= 16 * int64_t(sm_count()) && gemv_e4m3_mma_supported(T, K) ? GemvKernel::Mma : GemvKernel::Fma;
}

void gemv_e4m3(const uint16_t* x, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
               cudaStream_t s, GemvKernel kernel) {
  if (W.N <= 0 || T <= 0) return;
  M3_CUDA_REQUIRE(gemv_supported(T, W.K, true) && aligned16(x) && aligned16(W.q),
                  "gemv_e4m3: T %lld (1..%lld), K %lld (a multiple of 512) and 16-byte aligned x, W", (long long)T,
                  (long long)kGemvMaxRows, (long long)W.K);
  M3_CUDA_REQUIRE(W.fmt == Fp8Scale::Row128 || W.fmt == Fp8Scale::Blk128,
                  "gemv_e4m3: scales must be Row128 or Blk128 (MXFP8 G32 is converted at load)");
  GemvParams p{x, W.q, static_cast<const float*>(W.scales), W.fmt, W.N, W.K, fp8_scale_ld(W.fmt, W.N, W.K), y,
               out == GemmOut::BF16, accumulate};
  if (kernel == GemvKernel::Auto) kernel = gemv_e4m3_kernel_for(T, W.N, W.K);
  M3_CUDA_REQUIRE(kernel != GemvKernel::Mma || gemv_e4m3_mma_supported(T, W.K),
                  "gemv_e4m3 (tensor cores): T %lld × K %lld does not fit in shared memory", (long long)T,
                  (long long)W.K);
  if (kernel == GemvKernel::Mma)
    launch_e4m3_mma(p, T, s);
  else
    launch<E4m3W>(p, T, s);
}

}  // namespace m3::cuda
