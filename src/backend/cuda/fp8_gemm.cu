// FP8 GEMMs and conversions (backend/cuda/fp8_gemm.cuh). Layout notes for the W8A16 kernel:
// mma.sync m16n8k16 computes yᵀ tiles: A = 16 weight rows × 16 k (dequantised in registers), B = 16 k × 8 tokens.
// The k order inside one mma is free as long as A and B agree, so each thread loads 16 contiguous weight bytes of
// its row (one 16-byte load) and 16 contiguous bf16 of its token (two 16-byte loads) per 64-wide K chunk, and step j
// of the chunk pairs bytes 4j..4j+3 with bf16 elements 4j..4j+3: thread quad position t4 then owns logical k
// {2·t4, 2·t4+1} = physical 16·t4 + 4j + {0, 1} and {2·t4+8, 2·t4+9} = 16·t4 + 4j + {2, 3}, the same for A and B.
#include "backend/cuda/fp8_gemm.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/e4m3_bf16.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "base/counter_hash.h"

namespace m3::cuda {

namespace {

#define M3_FP8_LT_CHECK(expr)                                                                         \
  do {                                                                                                \
    cublasStatus_t st_ = (expr);                                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS) failf("cuBLASLt error %d in %s at %s:%d", int(st_), #expr, __FILE__, __LINE__); \
  } while (0)

constexpr int kWarps = 8;  // W8A16: warps per block, each on its own K chunks of the same weight rows

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// ---- element types: E4M3 and mul_bf16x2 (backend/cuda/e4m3_bf16.cuh) ----------------------------------------------

// ---- scalar helpers (the CPU twins' arithmetic, restated) -----------------------------------------------------------
__device__ __forceinline__ float e4m3_to_f32_dev(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);  // exact for every code
  return __half2float(__half(h));
}
__device__ __forceinline__ float ue8m0_to_f32_dev(uint8_t s) {
  return s == 255 ? __int_as_float(0x7fc00000) : ldexpf(1.0f, int(s) - 127);
}
__device__ __forceinline__ float pow2_dev(int e) { return ldexpf(1.0f, e); }
__device__ __forceinline__ uint8_t e4m3_rne_dev(float f) {
  return uint8_t(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ int pow2_exponent_for_dev(float amax) {
  if (!(amax > 0.f)) return 0;
  int S = ilogbf(amax) - 8;
  if (amax > __fmul_rn(448.0f, pow2_dev(S))) ++S;
  return S;
}

// ---- W8A16 ------------------------------------------------------------------------------------------------------
struct W8Params {
  const uint8_t* q;
  const void* scales;
  int64_t N, K, sld;  // sld: fp8_scale_ld
  const uint16_t* x;
  int M;
  void* y;
  bool out_bf16, accumulate;
  float* partials;     // [splits][M][N]
  unsigned* counters;  // [gridDim.x]
  int splits;
};

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ void store_out(const W8Params& p, int64_t idx, float v) {
  if (p.out_bf16) {
    __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y);
    if (p.accumulate) v += __bfloat162float(y[idx]);
    y[idx] = __float2bfloat16_rn(v);
  } else {
    float* y = static_cast<float*>(p.y);
    y[idx] = p.accumulate ? y[idx] + v : v;
  }
}

constexpr int kStages = 4;  // W8A16: cp.async ring depth (chunks in flight per thread = kStages − 1)

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Shared memory of one W8A16 block: the per-thread cp.async ring while streaming, then the reduction tile.
template <int MT, int NT>
constexpr size_t w8a16_smem() {
  const size_t ring = size_t(kStages) * NT * 2 * kWarps * 32 * (16 + 4);
  const size_t red = size_t(kWarps) * NT * 16 * MT * 8 * sizeof(float);
  return ring > red ? ring : red;
}

// Block reduction over the warps' K slices in warp order, then the split-K reduction by the last block of the row
// tile (both in a fixed order: deterministic). `smem` must be free (the caller synchronised the block).
template <int MT, int NT>
__device__ __forceinline__ void w8a16_epilogue(const W8Params& p, float (&acc)[NT][MT][4], uint8_t* smem,
                                               int64_t n0) {
  constexpr int TR = NT * 16, TC = MT * 8, TILE = TR * TC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  float* red = reinterpret_cast<float*>(smem);
  float* mine = red + warp * TILE;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int r = nt * 16 + g, col = mt * 8 + 2 * t4;
      mine[r * TC + col] = acc[nt][mt][0];
      mine[r * TC + col + 1] = acc[nt][mt][1];
      mine[(r + 8) * TC + col] = acc[nt][mt][2];
      mine[(r + 8) * TC + col + 1] = acc[nt][mt][3];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w * TILE + i];
    red[i] = v;
  }
  __syncthreads();
  // Element i ↦ (token m, row r) with r fastest, so consecutive threads write consecutive outputs.
  if (p.splits == 1) {
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
      const int m = i / TR, r = i % TR;
      const int64_t row = n0 + r;
      if (m < p.M && row < p.N) store_out(p, int64_t(m) * p.N + row, red[r * TC + m]);
    }
    return;
  }
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    const int m = i / TR, r = i % TR;
    const int64_t row = n0 + r;
    if (m < p.M && row < p.N) p.partials[(int64_t(blockIdx.y) * p.M + m) * p.N + row] = red[r * TC + m];
  }
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&p.counters[blockIdx.x], 1u) == unsigned(p.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    const int m = i / TR, r = i % TR;
    const int64_t row = n0 + r;
    if (m >= p.M || row >= p.N) continue;
    float v = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) v += __ldcg(&p.partials[(int64_t(sp) * p.M + m) * p.N + row]);
    store_out(p, int64_t(m) * p.N + row, v);
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;  // ready for the next launch on this stream
}

// Each thread streams exactly the weight bytes (and scale words) it consumes through its own slots of a kStages-deep
// cp.async ring, so no warp or block synchronisation is needed in the main loop and kStages − 1 chunks per thread
// are always in flight without costing registers. Activations (small, L2-resident) are read directly.
template <typename Elem, int MT, int NT, Fp8Scale SC>
__global__ void __launch_bounds__(kWarps * 32) w8a16_kernel(W8Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int TR = NT * 16, SLOTS = NT * 2, NTHR = kWarps * 32;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * TR;
  const int64_t C = p.K / 64;
  const int64_t c_begin = C * blockIdx.y / p.splits, c_end = C * (blockIdx.y + 1) / p.splits;
  const int64_t c0 = c_begin + warp;
  const int n_my = c0 < c_end ? int((c_end - c0 + kWarps - 1) / kWarps) : 0;
  const uint32_t ring_w = smem_addr(smem), ring_s = ring_w + uint32_t(kStages * SLOTS * NTHR * 16);
  const bool scale_words_aligned = SC != Fp8Scale::G32 || (p.sld % 4) == 0;

  auto issue = [&](int i) {  // chunk i of this warp into stage i % kStages
    const int st = i % kStages;
    const int64_t c = c0 + int64_t(i) * kWarps, k = c * 64 + t4 * 16;
#pragma unroll
    for (int slot = 0; slot < SLOTS; ++slot) {
      const int64_t row = n0 + (slot >> 1) * 16 + (slot & 1) * 8 + g;
      const bool ok = row < p.N;
      const int64_t r = ok ? row : 0;
      const uint32_t o = uint32_t((st * SLOTS + slot) * NTHR + tid);
      cp_async16(ring_w + o * 16, p.q + r * p.K + k, ok ? 16 : 0);
      if constexpr (SC == Fp8Scale::G32) {
        const uint8_t* sp = static_cast<const uint8_t*>(p.scales) + r * p.sld;
        if (scale_words_aligned) {
          cp_async4(ring_s + o * 4, sp + ((2 * c) & ~int64_t(3)), ok ? 4 : 0);
        } else {  // K not a multiple of 128: the group's byte, placed where the aligned word would put it
          const uint32_t b = ok ? uint32_t(sp[2 * c + (t4 >> 1)]) : 0u;
          const uint32_t v = b << (8 * (((2 * c) & 3) + (t4 >> 1)));
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ring_s + o * 4), "r"(v));
        }
      } else {
        const float* sp = static_cast<const float*>(p.scales);
        const float* src = SC == Fp8Scale::Row128 ? sp + (k >> 7) * p.sld + r : sp + (r >> 7) * p.sld + (k >> 7);
        cp_async4(ring_s + o * 4, src, ok ? 4 : 0);
      }
    }
  };

  float acc[NT][MT][4];
#pragma unroll
  for (int a = 0; a < NT; ++a)
#pragma unroll
    for (int b = 0; b < MT; ++b) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.f;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_my) issue(i);
    cp_async_commit();
  }
#pragma unroll 1
  for (int i = 0; i < n_my; ++i) {
    if (i + kStages - 1 < n_my) issue(i + kStages - 1);
    cp_async_commit();
    const int64_t c = c0 + int64_t(i) * kWarps;
    uint4 xb[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mt * 8 + g;
      if (m < p.M) {
        const uint4* px = reinterpret_cast<const uint4*>(p.x + int64_t(m) * p.K + c * 64 + t4 * 16);
        xb[mt][0] = __ldg(px);
        xb[mt][1] = __ldg(px + 1);
      } else {
        xb[mt][0] = xb[mt][1] = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_wait<kStages - 1>();  // chunk i has landed (this thread's own bytes)
    const int st = i % kStages;
    uint4 w[NT][2];
    uint32_t sm[NT][2];
#pragma unroll
    for (int slot = 0; slot < SLOTS; ++slot) {
      const uint32_t o = uint32_t((st * SLOTS + slot) * NTHR + tid);
      uint4 v;
      uint32_t s;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(ring_w + o * 16));
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(s) : "r"(ring_s + o * 4));
      w[slot >> 1][slot & 1] = v;
      if constexpr (SC == Fp8Scale::G32) {
        const uint32_t e = (s >> (8 * (((2 * c) & 3) + (t4 >> 1)))) & 0xffu;
        const uint32_t b = (e + Elem::kBias) << 7;  // bf16 of 2^(e − 127 + kBias); e ≤ 134 by contract
        sm[slot >> 1][slot & 1] = b | (b << 16);
      } else {
        const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(__uint_as_float(s) * 0x1p120f));
        sm[slot >> 1][slot & 1] = b | (b << 16);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t w0 = word(w[nt][0], j), w1 = word(w[nt][1], j);
        a[nt][0] = mul_bf16x2(Elem::lo2(w0), sm[nt][0]);
        a[nt][1] = mul_bf16x2(Elem::lo2(w1), sm[nt][1]);
        a[nt][2] = mul_bf16x2(Elem::hi2(w0), sm[nt][0]);
        a[nt][3] = mul_bf16x2(Elem::hi2(w1), sm[nt][1]);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4& xv = xb[mt][j >> 1];
        const uint32_t b0 = (j & 1) ? xv.z : xv.x, b1 = (j & 1) ? xv.w : xv.y;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(acc[nt][mt], a[nt], b0, b1);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the reduction tile reuses the ring

  w8a16_epilogue<MT, NT>(p, acc, smem, n0);
}

// Shared memory of the whole-line W8A16 variant: per warp a kStages-deep ring of [16·NT rows][128 B] values and
// [16·NT] scale words, then the reduction tile.
template <int MT, int NT>
constexpr size_t w8a16_lines_smem() {
  const size_t ring = size_t(kWarps) * kStages * NT * 16 * (128 + 4);
  const size_t red = size_t(kWarps) * NT * 16 * MT * 8 * sizeof(float);
  return ring > red ? ring : red;
}

// Whole-line variant (K % 128 == 0, up to 16 token rows): a chunk is 128 K values, so each row of the warp's tile
// is one 128-byte line. Lane l copies 16 bytes of row l/8 (+4 per instruction) at (l%8)·16, so every cp.async
// instruction reads 4 whole lines instead of 8 half lines; the 16-byte pieces are stored XOR-swizzled by row parity
// (piece u of row r at u ^ 4·(r&1)) so the fragment reads — rows g and g+1 of a quarter warp, pieces 4h..4h+3 —
// hit 32 distinct banks. The warp's lanes share the ring, hence the __syncwarp()s. Same mapping of k inside an mma
// as w8a16_kernel, applied to each 64-wide half h of the chunk.
template <typename Elem, int MT, int NT, Fp8Scale SC>
__global__ void __launch_bounds__(kWarps * 32) w8a16_lines_kernel(W8Params p) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int TR = NT * 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * TR;
  const int64_t C = p.K / 128;
  const int64_t c_begin = C * blockIdx.y / p.splits, c_end = C * (blockIdx.y + 1) / p.splits;
  const int64_t c0 = c_begin + warp;
  const int n_my = c0 < c_end ? int((c_end - c0 + kWarps - 1) / kWarps) : 0;
  const uint32_t wq = smem_addr(smem) + uint32_t(warp * kStages * TR * (128 + 4));
  const uint32_t ws = wq + uint32_t(kStages * TR * 128);

  auto issue = [&](int i) {
    const int st = i % kStages;
    const int64_t c = c0 + int64_t(i) * kWarps;
#pragma unroll
    for (int it = 0; it < TR / 4; ++it) {
      const int r = it * 4 + (lane >> 3), u = lane & 7;
      const int64_t row = n0 + r;
      const bool ok = row < p.N;
      cp_async16(wq + uint32_t((st * TR + r) * 128 + ((u ^ ((r & 1) << 2)) << 4)),
                 p.q + (ok ? row : 0) * p.K + c * 128 + u * 16, ok ? 16 : 0);
    }
#pragma unroll
    for (int it = 0; it < (TR + 31) / 32; ++it) {
      const int r = it * 32 + lane;
      if (r < TR) {
        const int64_t row = n0 + r;
        const bool ok = row < p.N;
        const int64_t rr = ok ? row : 0;
        const void* src;
        if constexpr (SC == Fp8Scale::G32)
          src = static_cast<const uint8_t*>(p.scales) + rr * p.sld + c * 4;  // the row's 4 group scales
        else if constexpr (SC == Fp8Scale::Row128)
          src = static_cast<const float*>(p.scales) + c * p.sld + rr;
        else
          src = static_cast<const float*>(p.scales) + (rr >> 7) * p.sld + c;
        cp_async4(ws + uint32_t((st * TR + r) * 4), src, ok ? 4 : 0);
      }
    }
  };

  float acc[NT][MT][4];
#pragma unroll
  for (int a = 0; a < NT; ++a)
#pragma unroll
    for (int b = 0; b < MT; ++b) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.f;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_my) issue(i);
    cp_async_commit();
  }
#pragma unroll 1
  for (int i = 0; i < n_my; ++i) {
    __syncwarp();  // every lane has finished reading the stage the next issue overwrites
    if (i + kStages - 1 < n_my) issue(i + kStages - 1);
    cp_async_commit();
    const int64_t c = c0 + int64_t(i) * kWarps;
    uint4 xb[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mt * 8 + g;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (m < p.M) {
          const uint4* px = reinterpret_cast<const uint4*>(p.x + int64_t(m) * p.K + c * 128 + h * 64 + t4 * 16);
          xb[mt][2 * h] = __ldg(px);
          xb[mt][2 * h + 1] = __ldg(px + 1);
        } else {
          xb[mt][2 * h] = xb[mt][2 * h + 1] = make_uint4(0, 0, 0, 0);
        }
      }
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();  // the other lanes' copies of chunk i are visible
    const int st = i % kStages;
    uint32_t sw[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = nt * 16 + hh * 8 + g;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sw[nt][hh]) : "r"(ws + uint32_t((st * TR + r) * 4)));
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 w[NT][2];
      uint32_t sm[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = nt * 16 + hh * 8 + g;
          const uint32_t a = wq + uint32_t((st * TR + r) * 128 + (((4 * h + t4) ^ ((r & 1) << 2)) << 4));
          uint4 v;
          asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
          w[nt][hh] = v;
          uint32_t b;
          if constexpr (SC == Fp8Scale::G32) {
            const uint32_t e = (sw[nt][hh] >> (8 * (2 * h + (t4 >> 1)))) & 0xffu;
            b = (e + Elem::kBias) << 7;
          } else {
            b = __bfloat16_as_ushort(__float2bfloat16_rn(__uint_as_float(sw[nt][hh]) * 0x1p120f));
          }
          sm[nt][hh] = b | (b << 16);
        }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t a[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint32_t w0 = word(w[nt][0], j), w1 = word(w[nt][1], j);
          a[nt][0] = mul_bf16x2(Elem::lo2(w0), sm[nt][0]);
          a[nt][1] = mul_bf16x2(Elem::lo2(w1), sm[nt][1]);
          a[nt][2] = mul_bf16x2(Elem::hi2(w0), sm[nt][0]);
          a[nt][3] = mul_bf16x2(Elem::hi2(w1), sm[nt][1]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint4& xv = xb[mt][2 * h + (j >> 1)];
          const uint32_t b0 = (j & 1) ? xv.z : xv.x, b1 = (j & 1) ? xv.w : xv.y;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(acc[nt][mt], a[nt], b0, b1);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the reduction tile reuses the rings
  w8a16_epilogue<MT, NT>(p, acc, smem, n0);
}

template <int MT, int NT, Fp8Scale SC, bool LINES>
void launch_w8a16(W8Params p, cudaStream_t s, DeviceBuffer<float>& partials, DeviceBuffer<unsigned>& counters) {
  constexpr int TR = NT * 16, KC = LINES ? 128 : 64;
  constexpr size_t smem = LINES ? w8a16_lines_smem<MT, NT>() : w8a16_smem<MT, NT>();
  auto kern = [] {  // instantiate only the kernel this launch uses
    if constexpr (LINES) return w8a16_lines_kernel<E4M3, MT, NT, SC>;
    else return w8a16_kernel<E4M3, MT, NT, SC>;
  }();
  static int blocks_per_sm = [&] {
    if (smem > 48 * 1024) M3_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int b = 0;
    M3_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern, kWarps * 32, smem));
    return std::max(b, 1);
  }();
  const int64_t groups = ceil_div(p.N, TR), C = p.K / KC;
  const int64_t cap = int64_t(blocks_per_sm) * sm_count();  // blocks resident at once
  // Split K so the blocks fill whole waves (a streaming kernel is as slow as its last, partly empty wave), with at
  // least 256 K values per warp and partial sums of at most 1/4 of the weight bytes.
  int64_t s_max = std::max<int64_t>(1, C / ((LINES ? 2 : 4) * kWarps));  // ≥ 256 K values per warp
  s_max = std::min<int64_t>(s_max, std::max<int64_t>(1, p.K / (16 * p.M)));
  s_max = std::min<int64_t>(s_max, 65535);
  int64_t S = 1;
  double best = -1;
  for (int64_t s = 1; s <= s_max; ++s) {
    const int64_t blocks = groups * s, waves = ceil_div(blocks, cap);
    const double eff = double(blocks) / double(waves * cap);
    if (eff > best + 0.02) best = eff, S = s;
  }
  p.splits = int(S);
  if (S > 1) {
    partials.grow(size_t(S * p.M * p.N));
    if (counters.size() < size_t(groups)) {
      counters.grow(size_t(groups));
      M3_CUDA_CHECK(cudaMemsetAsync(counters.get(), 0, counters.size() * sizeof(unsigned), s));
    }
    p.partials = partials.get();
    p.counters = counters.get();
  }
  M3_CUDA_REQUIRE(groups <= 0x7fffffff, "w8a16: N too large");
  kern<<<dim3(unsigned(groups), unsigned(S)), kWarps * 32, smem, s>>>(p);
  M3_CUDA_LAUNCH_CHECK();
}

template <Fp8Scale SC>
void dispatch_w8a16(W8Params p, int nt, W8Kernel kernel, cudaStream_t s, DeviceBuffer<float>& partials,
                    DeviceBuffer<unsigned>& counters) {
  const int mt = p.M <= 8 ? 1 : p.M <= 16 ? 2 : p.M <= 32 ? 4 : 8;
  if (kernel == W8Kernel::Lines128) {
    M3_CUDA_REQUIRE(p.K % 128 == 0 && mt <= 2, "w8a16 lines: K %% 128 == 0 and at most 16 rows per call");
    if (nt == 0) nt = 1;
    if (mt == 1 && nt == 1) return launch_w8a16<1, 1, SC, true>(p, s, partials, counters);
    if (mt == 1 && nt == 2) return launch_w8a16<1, 2, SC, true>(p, s, partials, counters);
    if (mt == 2 && nt == 1) return launch_w8a16<2, 1, SC, true>(p, s, partials, counters);
    if (mt == 2 && nt == 2) return launch_w8a16<2, 2, SC, true>(p, s, partials, counters);
    failf("w8a16 lines: no kernel for %d token tiles × %d row tiles", mt, nt);
  }
  // Defaults from bench/results/2026-12-02-fp8-gemm-h200.md (fastest forced tile per token count).
  if (nt == 0) nt = mt == 1 ? 1 : mt == 8 ? 4 : 2;
#define M3_W8_CASE(MTV, NTV) \
  if (mt == MTV && nt == NTV) return launch_w8a16<MTV, NTV, SC, false>(p, s, partials, counters);
  if constexpr (SC == Fp8Scale::G32) {
    M3_W8_CASE(1, 1) M3_W8_CASE(1, 2) M3_W8_CASE(1, 4)
    M3_W8_CASE(2, 1) M3_W8_CASE(2, 2) M3_W8_CASE(2, 4)
    M3_W8_CASE(4, 1) M3_W8_CASE(4, 2) M3_W8_CASE(4, 4)
    M3_W8_CASE(8, 1) M3_W8_CASE(8, 2) M3_W8_CASE(8, 4)
  } else {
    M3_W8_CASE(1, 1) M3_W8_CASE(2, 2) M3_W8_CASE(4, 2) M3_W8_CASE(8, 4)
  }
#undef M3_W8_CASE
  failf("w8a16: no kernel for %d token tiles × %d row tiles with %s scales", mt, nt, fp8_scale_name(SC));
}

// ---- conversions --------------------------------------------------------------------------------------------------
// Blk128: one block per 128×128 tile; Row128: one warp per (row, 128 block).
__global__ void requant_blk128_kernel(const uint8_t* __restrict__ q, const uint8_t* __restrict__ ue8m0, int64_t N,
                                      int64_t K, uint8_t* __restrict__ q_out, float* __restrict__ s_out,
                                      int64_t sld) {
  const int64_t n0 = int64_t(blockIdx.x) * 128, k0 = int64_t(blockIdx.y) * 128;
  const int rows = int(N - n0 < 128 ? N - n0 : 128), cols = int(K - k0 < 128 ? K - k0 : 128);
  const int64_t sk = (K + 31) / 32;
  auto value = [&](int i) {
    const int64_t n = n0 + i / cols, k = k0 + i % cols;
    return __fmul_rn(e4m3_to_f32_dev(q[n * K + k]), ue8m0_to_f32_dev(ue8m0[n * sk + k / 32]));
  };
  float amax = 0.f;
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) amax = fmaxf(amax, fabsf(value(i)));
  __shared__ float wmax[32];
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = amax;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? wmax[threadIdx.x] : 0.f;
    v = warp_max(v);
    if (threadIdx.x == 0) wmax[0] = v;
  }
  __syncthreads();
  const int S = pow2_exponent_for_dev(wmax[0]);
  const float inv = pow2_dev(-S);
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    const int64_t n = n0 + i / cols, k = k0 + i % cols;
    q_out[n * K + k] = e4m3_rne_dev(__fmul_rn(value(i), inv));
  }
  if (threadIdx.x == 0) s_out[blockIdx.x * sld + blockIdx.y] = pow2_dev(S);
}

__global__ void requant_row128_kernel(const uint8_t* __restrict__ q, const uint8_t* __restrict__ ue8m0, int64_t N,
                                      int64_t K, uint8_t* __restrict__ q_out, float* __restrict__ s_out,
                                      int64_t sld) {
  const int64_t L = (K + 127) / 128;
  const int64_t wid = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= N * L) return;
  const int64_t n = wid / L, kb = wid % L, sk = (K + 31) / 32;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = kb * 128 + lane * 4 + i;
    v[i] = k < K ? __fmul_rn(e4m3_to_f32_dev(q[n * K + k]), ue8m0_to_f32_dev(ue8m0[n * sk + k / 32])) : 0.f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const int S = pow2_exponent_for_dev(amax);
  const float inv = pow2_dev(-S);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = kb * 128 + lane * 4 + i;
    if (k < K) q_out[n * K + k] = e4m3_rne_dev(__fmul_rn(v[i], inv));
  }
  if (lane == 0) s_out[kb * sld + n] = pow2_dev(S);
}

__global__ void fill_f32_kernel(float* p, int64_t n, float v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// One warp per (token, 128 block); lane i holds elements 4i..4i+3.
template <bool BF16>
__global__ void quant_act_kernel(const void* __restrict__ x, int64_t T, int64_t T_pad, int64_t K,
                                 uint8_t* __restrict__ q, float* __restrict__ s, int64_t ld_s) {
  const int64_t L = K / 128;
  const int64_t wid = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= T_pad * L) return;
  const int64_t t = wid / L, kb = wid % L, off = t * K + kb * 128 + lane * 4;
  uint32_t* qo = reinterpret_cast<uint32_t*>(q + off);
  if (t >= T) {
    *qo = 0;
    if (lane == 0) s[kb * ld_s + t] = 1.0f;
    return;
  }
  float v[4];
  if constexpr (BF16) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(x) + off);
    v[0] = __uint_as_float(raw.x << 16);
    v[1] = __uint_as_float(raw.x & 0xffff0000u);
    v[2] = __uint_as_float(raw.y << 16);
    v[3] = __uint_as_float(raw.y & 0xffff0000u);
  } else {
    const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + off);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  }
  float sc;
  *qo = quant_block128_warp(v, sc);
  if (lane == 0) s[kb * ld_s + t] = sc;
}

unsigned blocks_for_warps(int64_t warps) { return unsigned(ceil_div(warps, 8)); }

// Dummy FP8 weights: element i is counter_uniform(key, i, scale) (the bf16 dummy fill's value) quantised with the one
// power-of-two scale 2^S of the whole tensor: q = rne_e4m3(u · 2^−S) (the product is exact).
__global__ void fill_counter_e4m3_kernel(uint8_t* __restrict__ q, int64_t n, uint64_t key, float scale, float inv) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    q[i] = e4m3_rne_dev(__fmul_rn(counter_uniform(key, uint64_t(i), scale), inv));
}
__global__ void fill_u8_kernel(uint8_t* p, int64_t n, uint8_t v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// The operand arrangements tried, in order, when a plan is made (cuBLASLt documents its block-scaled FP8 support by
// example — 1×128 scales on A with 128×128 on B — so the first arrangement it accepts is used and recorded):
//   WX  A = W (K×N, transposed), B = x (K×T): D = yᵀ column-major [N, T] = y row-major; no copy.
//   XWr A = x (transposed), B = W: D = y column-major [T, N] declared row-order (ld N) = y row-major.
//   XWt A = x, B = W: D column-major [T, N] (ld T) = yᵀ row-major, transposed into y by a small kernel.
enum class LtMode : int { WX, XWr, XWt };
const char* lt_mode_name(LtMode m) {
  return m == LtMode::WX ? "A=W(TN) B=x D=col[N,T]" : m == LtMode::XWr ? "A=x(TN) B=W D=row[T,N]" : "A=x(TN) B=W D=col[T,N]+transpose";
}

template <typename T>
__global__ void transpose_out_kernel(const T* __restrict__ src, int64_t ld_src, T* __restrict__ y, int64_t rows,
                                     int64_t cols, bool accumulate) {
  // src: [cols][ld_src] (yᵀ), y: [rows][cols]
  __shared__ float tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c < cols && r < rows) {
      if constexpr (sizeof(T) == 2) tile[i][threadIdx.x] = __bfloat162float(src[c * ld_src + r]);
      else tile[i][threadIdx.x] = src[c * ld_src + r];
    }
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      float v = tile[threadIdx.x][i];
      if constexpr (sizeof(T) == 2) {
        if (accumulate) v += __bfloat162float(y[r * cols + c]);
        y[r * cols + c] = __float2bfloat16_rn(v);
      } else {
        y[r * cols + c] = accumulate ? y[r * cols + c] + v : v;
      }
    }
  }
}

}  // namespace

// ---- public API ---------------------------------------------------------------------------------------------------
void fp8_requant_from_mx(const uint8_t* q, const uint8_t* ue8m0, int64_t N, int64_t K, Fp8Scale fmt, uint8_t* q_out,
                         float* s_out, cudaStream_t s) {
  M3_CUDA_REQUIRE(fmt != Fp8Scale::G32, "fp8_requant_from_mx: the target must be Row128 or Blk128");
  if (N <= 0 || K <= 0) return;
  const int64_t L = ceil_div(K, 128), sld = fp8_scale_ld(fmt, N, K), count = fp8_scale_count(fmt, N, K);
  fill_f32_kernel<<<unsigned(std::min<int64_t>(ceil_div(count, 256), 1024)), 256, 0, s>>>(s_out, count, 1.0f);
  M3_CUDA_LAUNCH_CHECK();
  if (fmt == Fp8Scale::Blk128) {
    M3_CUDA_REQUIRE(L <= 65535, "fp8_requant_from_mx: K too large");
    requant_blk128_kernel<<<dim3(unsigned(ceil_div(N, 128)), unsigned(L)), 256, 0, s>>>(q, ue8m0, N, K, q_out, s_out,
                                                                                         sld);
  } else {
    requant_row128_kernel<<<blocks_for_warps(N * L), 256, 0, s>>>(q, ue8m0, N, K, q_out, s_out, sld);
  }
  M3_CUDA_LAUNCH_CHECK();
}

void fp8_quantize_act_1x128(const void* x, bool x_bf16, int64_t T, int64_t T_pad, int64_t K, uint8_t* q, float* s,
                            int64_t ld_s, cudaStream_t st) {
  M3_CUDA_REQUIRE(K % 128 == 0, "fp8_quantize_act_1x128: K must be a multiple of 128, got %lld", (long long)K);
  M3_CUDA_REQUIRE(T_pad >= T && ld_s >= T_pad, "fp8_quantize_act_1x128: bad padding");
  if (T_pad <= 0) return;
  const unsigned blocks = blocks_for_warps(T_pad * (K / 128));
  if (x_bf16)
    quant_act_kernel<true><<<blocks, 256, 0, st>>>(x, T, T_pad, K, q, s, ld_s);
  else
    quant_act_kernel<false><<<blocks, 256, 0, st>>>(x, T, T_pad, K, q, s, ld_s);
  M3_CUDA_LAUNCH_CHECK();
}

void fp8_fill_counter_uniform(uint8_t* q, void* scales, Fp8Scale fmt, int64_t N, int64_t K, uint64_t key, float scale,
                              cudaStream_t s) {
  if (N <= 0 || K <= 0) return;
  const int S = fp8_dummy_exponent(scale);
  M3_CUDA_REQUIRE(S >= -127 && S <= 127, "fp8_fill_counter_uniform: scale %g out of range", double(scale));
  const int64_t n = N * K, count = fp8_scale_count(fmt, N, K);
  const unsigned grid = unsigned(std::min<int64_t>(ceil_div(n, 256), 4096));
  fill_counter_e4m3_kernel<<<grid, 256, 0, s>>>(q, n, key, scale, std::ldexp(1.0f, -S));
  M3_CUDA_LAUNCH_CHECK();
  const unsigned sgrid = unsigned(std::min<int64_t>(ceil_div(count, 256), 1024));
  if (fmt == Fp8Scale::G32)
    fill_u8_kernel<<<sgrid, 256, 0, s>>>(static_cast<uint8_t*>(scales), count, uint8_t(S + 127));
  else
    fill_f32_kernel<<<sgrid, 256, 0, s>>>(static_cast<float*>(scales), count, std::ldexp(1.0f, S));
  M3_CUDA_LAUNCH_CHECK();
}

struct Fp8Gemm::LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  LtMode mode = LtMode::WX;
  void clear() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
    op = nullptr, a = b = c = nullptr;
  }
  ~LtPlan() { clear(); }
};

Fp8Gemm::Fp8Gemm() {
  cublasLtHandle_t h = nullptr;
  M3_FP8_LT_CHECK(cublasLtCreate(&h));
  lt_ = h;
  lt_ws_.grow(size_t(32) << 20);
}

Fp8Gemm::~Fp8Gemm() {
  plans_.clear();
  if (lt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
}

void Fp8Gemm::w8a16(const uint16_t* x, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
                    cudaStream_t s, int nt, W8Kernel kernel) {
  if (T <= 0 || W.N <= 0) return;
  M3_CUDA_REQUIRE(W.K > 0 && W.K % 64 == 0, "w8a16: K must be a positive multiple of 64, got %lld", (long long)W.K);
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(W.q) % 16 == 0,
                  "w8a16: x and W.q must be 16-byte aligned");
  const int64_t esz = out == GemmOut::BF16 ? 2 : 4;
  const int64_t slice = kernel == W8Kernel::Lines128 ? 16 : 64;
  for (int64_t t0 = 0; t0 < T; t0 += slice) {
    W8Params p{};
    p.q = W.q;
    p.scales = W.scales;
    p.N = W.N;
    p.K = W.K;
    p.sld = fp8_scale_ld(W.fmt, W.N, W.K);
    p.x = x + t0 * W.K;
    p.M = int(std::min<int64_t>(slice, T - t0));
    p.y = static_cast<uint8_t*>(y) + t0 * W.N * esz;
    p.out_bf16 = out == GemmOut::BF16;
    p.accumulate = accumulate;
    switch (W.fmt) {
      case Fp8Scale::G32: dispatch_w8a16<Fp8Scale::G32>(p, nt, kernel, s, partials_, counters_); break;
      case Fp8Scale::Row128: dispatch_w8a16<Fp8Scale::Row128>(p, nt, kernel, s, partials_, counters_); break;
      case Fp8Scale::Blk128: dispatch_w8a16<Fp8Scale::Blk128>(p, nt, kernel, s, partials_, counters_); break;
    }
  }
}

Fp8Gemm::LtPlan& Fp8Gemm::lt_plan(int64_t Tp, int64_t K, int64_t N, Fp8Scale fmt, GemmOut out, bool accumulate,
                                  const void* wscale, const float* xscale) {
  const LtKey key{Tp, K, N, int(fmt), int(out), int(accumulate)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<LtPlan>();
  const cublasLtMatmulMatrixScale_t wm = fmt == Fp8Scale::Blk128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const cublasLtMatmulMatrixScale_t xm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const cudaDataType_t ct = out == GemmOut::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  char tried[512] = "";
  for (LtMode mode : {LtMode::WX, LtMode::XWr, LtMode::XWt}) {
    p->clear();
    p->mode = mode;
    const bool wx = mode == LtMode::WX;
    M3_FP8_LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // FP8 on Hopper: "TN" only
    M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const cublasLtMatmulMatrixScale_t am = wx ? wm : xm, bm = wx ? xm : wm;
    const void* ap = wx ? wscale : static_cast<const void*>(xscale);
    const void* bp = wx ? static_cast<const void*>(xscale) : wscale;
    M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
    M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
    M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ap, sizeof ap));
    M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bp, sizeof bp));
    const int64_t am_cols = wx ? N : Tp, bm_cols = wx ? Tp : N;
    M3_FP8_LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(am_cols), K));
    M3_FP8_LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(bm_cols), K));
    if (mode == LtMode::WX) {
      M3_FP8_LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, ct, uint64_t(N), uint64_t(Tp), N));
    } else if (mode == LtMode::XWr) {
      M3_FP8_LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, ct, uint64_t(Tp), uint64_t(N), N));
      const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
      M3_FP8_LT_CHECK(cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
    } else {
      M3_FP8_LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, ct, uint64_t(Tp), uint64_t(N), Tp));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    M3_FP8_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = lt_ws_.size();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), p->op, p->a, p->b,
                                                             p->c, p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
      p->algo = res.algo;
      return *plans_.emplace(key, std::move(p)).first->second;
    }
    const size_t used = std::strlen(tried);
    std::snprintf(tried + used, sizeof tried - used, "%s[%s: status %d, %d algos]", used ? " " : "",
                  lt_mode_name(mode), int(st), found);
  }
  failf("cuBLASLt has no block-scaled FP8 algorithm for T=%lld K=%lld N=%lld (%s weights, %s out): %s",
        (long long)Tp, (long long)K, (long long)N, fp8_scale_name(fmt), out == GemmOut::BF16 ? "bf16" : "f32", tried);
}

const char* Fp8Gemm::lt_arrangement(int64_t T, const Fp8Weight& W, GemmOut out, bool accumulate) const {
  const LtKey key{round_up(T, 4), W.K, W.N, int(W.fmt), int(out), int(accumulate)};
  auto it = plans_.find(key);
  return it == plans_.end() ? "none" : lt_mode_name(it->second->mode);
}

void Fp8Gemm::blockscaled_q(const uint8_t* xq, const float* xs, int64_t T, const Fp8Weight& W, void* y, GemmOut out,
                            bool accumulate, cudaStream_t s) {
  if (T <= 0 || W.N <= 0) return;
  M3_CUDA_REQUIRE(W.fmt != Fp8Scale::G32, "blockscaled: weights must be Row128 or Blk128 (fp8_requant_from_mx)");
  M3_CUDA_REQUIRE(W.K % 128 == 0, "blockscaled: K must be a multiple of 128, got %lld", (long long)W.K);
  const int64_t Tp = round_up(T, 4), esz = out == GemmOut::BF16 ? 2 : 4;
  LtPlan& p = lt_plan(Tp, W.K, W.N, W.fmt, out, accumulate, W.scales, xs);
  const bool wx = p.mode == LtMode::WX;
  const void* ap = wx ? W.scales : static_cast<const void*>(xs);
  const void* bp = wx ? static_cast<const void*>(xs) : W.scales;
  M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ap, sizeof ap));
  M3_FP8_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bp, sizeof bp));
  const void* A = wx ? static_cast<const void*>(W.q) : xq;
  const void* B = wx ? static_cast<const void*>(xq) : W.q;
  const float alpha = 1.f;
  if (p.mode == LtMode::XWt) {  // D = yᵀ: stage, then transpose (+ accumulate) into y
    ypad_.grow(size_t(Tp * W.N * esz));
    const float beta = 0.f;
    M3_FP8_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p.op, &alpha, A, p.a, B, p.b, &beta,
                                   ypad_.get(), p.c, ypad_.get(), p.c, &p.algo, lt_ws_.get(), lt_ws_.size(), s));
    const dim3 grid(unsigned(ceil_div(W.N, 32)), unsigned(ceil_div(T, 32))), block(32, 8);
    if (out == GemmOut::BF16)
      transpose_out_kernel<__nv_bfloat16><<<grid, block, 0, s>>>(reinterpret_cast<const __nv_bfloat16*>(ypad_.get()),
                                                                 Tp, static_cast<__nv_bfloat16*>(y), T, W.N, accumulate);
    else
      transpose_out_kernel<float><<<grid, block, 0, s>>>(reinterpret_cast<const float*>(ypad_.get()), Tp,
                                                         static_cast<float*>(y), T, W.N, accumulate);
    M3_CUDA_LAUNCH_CHECK();
    return;
  }
  void* yt = y;
  if (Tp != T) {  // cuBLASLt writes Tp rows: stage them
    ypad_.grow(size_t(Tp * W.N * esz));
    yt = ypad_.get();
    if (accumulate) M3_CUDA_CHECK(cudaMemcpyAsync(yt, y, size_t(T * W.N * esz), cudaMemcpyDeviceToDevice, s));
  }
  const float beta = accumulate ? 1.f : 0.f;
  M3_FP8_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p.op, &alpha, A, p.a, B, p.b, &beta, yt, p.c, yt,
                                 p.c, &p.algo, lt_ws_.get(), lt_ws_.size(), s));
  if (Tp != T) M3_CUDA_CHECK(cudaMemcpyAsync(y, yt, size_t(T * W.N * esz), cudaMemcpyDeviceToDevice, s));
}

void Fp8Gemm::blockscaled(const void* x, bool x_bf16, int64_t T, const Fp8Weight& W, void* y, GemmOut out,
                          bool accumulate, cudaStream_t s) {
  if (T <= 0 || W.N <= 0) return;
  const int64_t Tp = round_up(T, 4);
  xq_.grow(size_t(Tp * W.K));
  xs_.grow(size_t(Tp * (W.K / 128)));
  fp8_quantize_act_1x128(x, x_bf16, T, Tp, W.K, xq_.get(), xs_.get(), Tp, s);
  blockscaled_q(xq_.get(), xs_.get(), T, W, y, out, accumulate, s);
}

bool fp8_fused_quant() {
  static const bool on = [] {
    const char* e = std::getenv("M3_FP8_FUSED_QUANT");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void Fp8Gemm::proj(const uint16_t* xb, int64_t T, const Fp8Weight& W, void* y, GemmOut out, bool accumulate,
                   int64_t lt_min_rows, cudaStream_t s, const Fp8ActOut* xq) {
  const Fp8Path path = fp8_pick_path(T, W.N, W.K, lt_min_rows);
  M3_CUDA_REQUIRE(xb || (xq && path == Fp8Path::Lt), "Fp8Gemm::proj: no bf16 input for the %s path",
                  fp8_path_name(path));
  switch (path) {
    case Fp8Path::W8Lines: return w8a16(xb, T, W, y, out, accumulate, s, 0, W8Kernel::Lines128);
    case Fp8Path::W8Chunk: return w8a16(xb, T, W, y, out, accumulate, s, 0, W8Kernel::Chunk64);
    case Fp8Path::Lt:
      if (!xq) return blockscaled(xb, true, T, W, y, out, accumulate, s);
      M3_CUDA_REQUIRE(xq->q && xq->s && xq->T_pad == round_up(T, 4) && xq->ld_s == xq->T_pad,
                      "Fp8Gemm::proj: the pre-quantised input must have T_pad = ld_s = %lld",
                      (long long)round_up(T, 4));
      return blockscaled_q(xq->q, xq->s, T, W, y, out, accumulate, s);
  }
}

void Fp8Gemm::reserve(int64_t T, int64_t K) {
  const int64_t Tp = round_up(T, 4);
  xq_.grow(size_t(Tp * K));
  xs_.grow(size_t(Tp * ceil_div(K, 128)));
}

}  // namespace m3::cuda
