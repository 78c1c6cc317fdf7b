// Grouped MoE on the device (docs/KERNELS.md §10): router logits, routing + grouping in one CTA, two grouped
// tensor-core GEMMs (SwiGLU-OAI fused into gate/up), a per-token combine in slot order. No host sync, no
// routing-dependent launch parameter.
#include "backend/cuda/moe_grouped.cuh"
#include "backend/cuda/moe_grouped_wgmma.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "base/fp8_format.h"

namespace m3::cuda {

namespace {

constexpr int kRouterTT = 8;        // tokens per router CTA (router rows are re-read once per 8 tokens)
constexpr int kRouterSeg = 4;       // warps per router CTA: each sums one quarter of H
constexpr int64_t kRouterWideRows = 256;  // steps of at least this many rows give each router CTA 8 experts
constexpr int kGroupThreads = 1024;
constexpr int kMaxE = 256, kMaxK = 8;
constexpr int kBN = 64;             // GEMM columns per CTA (gate/up: 32 gate + 32 up)
constexpr int kRowBytes = 256;      // a smem tile row = 128 bf16 of K (the swz128 layout of warp_mma.cuh)
constexpr int kMaxScaleSteps = 256;  // e4m3 experts: K steps of 128 whose scales a GEMM CTA keeps (K ≤ 32768)

__device__ __forceinline__ float sigmoidf_(float l) { return 1.0f / (1.0f + expf(-l)); }

// True when (ka, a) ranks strictly before (kb, b): higher key, then lower id (cpu::moe_route's partial_sort order).
__device__ __forceinline__ bool ranks_before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// logits[t, e] = Σ_h xn[t, h]·router[e, h]. CTA = (8 tokens, EW experts), 4 warps; warp w sums quarter w of H:
// lane j the float4 columns w·H/16 + j, + 32, … in order, then a butterfly sum, and the four quarters are added in
// warp order. The order depends on H only, never on T, on EW or on which other tokens share the CTA, so a token's
// logits are the same bits in a decode step and in a long prefill. EW = 1 for small steps: a decode step has E CTAs
// of 4 warps, each lane 12 float4 loads at H = 6144 (one warp per expert over all of H left 32 CTAs, 48 dependent
// load rounds per lane — ≈ 30 µs of a 180 µs decode MoE at M3 widths). EW = 8 for long steps (8 × 8 outputs per
// warp: 16 loads per 256 FMAs instead of 9 per 32). CTAs of column 0 also write xn as bf16, or f16 for FP8 experts
// (the A operand of the gate/up GEMM); CTA (0, 0) zeroes the per-expert counts that route_kernel fills. TT tokens per
// CTA: 8, or 1 for a one-token step (the 8-token CTA re-read that row 8 times with 8 FMA chains; eager router time
// at T = 1 15.7 → 13.1 µs, bench/results/2026-12-03c-fp8-decode-h200.md). A token's sums are the same FMA chains
// either way.
template <int EW, int TT>
__global__ void __launch_bounds__(32 * kRouterSeg) router_logits_kernel(const float* __restrict__ xn, int T, int H,
                                                                        const float* __restrict__ router, int E,
                                                                        float* __restrict__ logits,
                                                                        __nv_bfloat16* __restrict__ xb,
                                                                        int32_t* __restrict__ counts, bool xb_f16) {
  constexpr int kThreads = 32 * kRouterSeg;
  __shared__ float part[kRouterSeg][EW][TT];
  const int t0 = blockIdx.x * TT, nt = min(TT, T - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int e = threadIdx.x; e < E; e += kThreads) counts[e] = 0;
  if (blockIdx.y == 0) {
    // Unrolled, no division: a thread keeps several independent loads in flight (this copy is on the critical path
    // of every long step's first wave).
    for (int t = 0; t < nt; ++t) {
      const float4* src = reinterpret_cast<const float4*>(xn + int64_t(t0 + t) * H);
      uint2* dst = reinterpret_cast<uint2*>(xb + int64_t(t0 + t) * H);
#pragma unroll 4
      for (int c = threadIdx.x; c < H / 4; c += kThreads) {
        const float4 v = src[c];
        if (xb_f16) {  // FP8 experts: the W8A16 GEMMs multiply f16 (see moe_gemm_kernel)
          const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
          dst[c] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        } else {
          const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
          dst[c] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        }
      }
    }
  }
  const int e0 = blockIdx.y * EW;
  const int q4 = H / (4 * kRouterSeg), c0 = warp * q4;  // this warp's quarter of the float4 columns (H % 64 == 0)
  const float4* w4[EW];
#pragma unroll
  for (int i = 0; i < EW; ++i)
    w4[i] = reinterpret_cast<const float4*>(router + int64_t(min(e0 + i, E - 1)) * H) + c0;
  // Rows past the step's end read the last row again (always valid memory, results never stored): no branch around
  // the loads, so all of an iteration's loads issue before the first FMA waits (a guarded load per token made the
  // kernel wait for 8 load latencies in a row per iteration).
  const float4* x4[TT];
#pragma unroll
  for (int t = 0; t < TT; ++t)
    x4[t] = reinterpret_cast<const float4*>(xn + int64_t(t0 + min(t, nt - 1)) * H) + c0;
  float acc[EW][TT];
#pragma unroll
  for (int i = 0; i < EW; ++i)
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[i][t] = 0.f;
  // One token, one expert (a decode step): a lane's loads in batches of 12, all issued before the first FMA waits
  // (H = 6144: one batch), then the FMAs in the same column order as the loop below.
  if constexpr (EW == 1 && TT == 1) {
    constexpr int kBatch = 12;
    for (int cb = lane; cb < q4; cb += 32 * kBatch) {
      float4 w[kBatch], v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {  // past the end: the last column again (valid memory, never used)
        const int c = min(cb + 32 * j, q4 - 1);
        w[j] = w4[0][c], v[j] = x4[0][c];
      }
      // Keeps the loads ahead of the FMAs in the PTX (without it nvcc moves two of them below); ptxas still schedules
      // the SASS itself (34 registers: it does not hold all 24 loads at once).
      asm volatile("" ::: "memory");
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (cb + 32 * j < q4) {
          acc[0][0] = fmaf(w[j].x, v[j].x, acc[0][0]);
          acc[0][0] = fmaf(w[j].y, v[j].y, acc[0][0]);
          acc[0][0] = fmaf(w[j].z, v[j].z, acc[0][0]);
          acc[0][0] = fmaf(w[j].w, v[j].w, acc[0][0]);
        }
    }
  } else {
    // Unrolled so several iterations' loads are in flight; the FMA order per output is unchanged.
#pragma unroll(EW == 1 ? 4 : 1)
    for (int c = lane; c < q4; c += 32) {
      float4 w[EW], v[TT];
#pragma unroll
      for (int i = 0; i < EW; ++i) w[i] = w4[i][c];
#pragma unroll
      for (int t = 0; t < TT; ++t) v[t] = x4[t][c];
#pragma unroll
      for (int t = 0; t < TT; ++t)
#pragma unroll
        for (int i = 0; i < EW; ++i) {
          acc[i][t] = fmaf(w[i].x, v[t].x, acc[i][t]);
          acc[i][t] = fmaf(w[i].y, v[t].y, acc[i][t]);
          acc[i][t] = fmaf(w[i].z, v[t].z, acc[i][t]);
          acc[i][t] = fmaf(w[i].w, v[t].w, acc[i][t]);
        }
    }
  }
#pragma unroll
  for (int i = 0; i < EW; ++i)
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      const float v = warp_sum(acc[i][t]);
      if (lane == 0) part[warp][i][t] = v;
    }
  __syncthreads();
  for (int o = threadIdx.x; o < EW * TT; o += kThreads) {
    const int i = o / TT, t = o % TT;
    if (t >= nt || e0 + i >= E) continue;
    float v = part[0][i][t];
#pragma unroll
    for (int w = 1; w < kRouterSeg; ++w) v += part[w][i][t];
    logits[int64_t(t0 + t) * E + e0 + i] = v;
  }
}

// Routing, one warp per token (cpu::moe_route's rule). Round k picks the best expert ranking strictly after round
// k−1's pick in the total order (choice desc, id asc): the CPU's partial_sort order without an "already taken" set.
// counts[e] += the token's picks of e (zeroed by router_logits_kernel; the totals do not depend on atomic order).
__global__ void __launch_bounds__(256) route_kernel(const float* __restrict__ logits, int T, int E, int K,
                                                    const float* __restrict__ bias, float scale,
                                                    int32_t* __restrict__ ids, float* __restrict__ weights,
                                                    int32_t* __restrict__ counts) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (t >= T) return;
  const float* l = logits + int64_t(t) * E;
  float prev_c = 0.f, sum = 0.f;
  int prev_e = -1, mine = -1;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    float best_c = 0.f;
    for (int e = lane; e < E; e += 32) {
      float c = sigmoidf_(l[e]) + (bias ? bias[e] : 0.0f);
      if (isnan(c)) c = -INFINITY;
      if (prev_e >= 0 && !ranks_before(prev_c, prev_e, c, e)) continue;
      if (best < 0 || ranks_before(c, e, best_c, best)) best = e, best_c = c;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float oc = __shfl_xor_sync(0xffffffffu, best_c, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best, o);
      if (oe >= 0 && (best < 0 || ranks_before(oc, oe, best_c, best))) best = oe, best_c = oc;
    }
    if (lane == k) mine = best;
    sum += sigmoidf_(l[best]);  // every lane: same picks, same order as the CPU's sum
    prev_c = best_c, prev_e = best;
    if (lane == 0) atomicAdd(&counts[best], 1);
  }
  if (lane < K) {
    ids[int64_t(t) * K + lane] = mine;
    weights[int64_t(t) * K + lane] = sigmoidf_(l[mine]) / sum * scale;
  }
}

// One CTA: histogram (from route_kernel's counts), scan, stable scatter, shared rows, tile list.
// smem: cnt[E], base[E], wc[32][E].
__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* __restrict__ counts, int T, int E, int K,
                                                              int BM, int has_shared,
                                                              const int32_t* __restrict__ ids,
                                                              int32_t* __restrict__ offsets,
                                                              int32_t* __restrict__ row_tok,
                                                              int32_t* __restrict__ row_slot,
                                                              int32_t* __restrict__ tiles,
                                                              int32_t* __restrict__ counters) {
  extern __shared__ int32_t gsm[];
  int32_t* cnt = gsm;
  int32_t* base = gsm + E;
  int32_t* wc = gsm + 2 * E;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < E; e += kGroupThreads) cnt[e] = counts[e];
  __syncthreads();

  const int TK = T * K;
  // Group offsets and the tile list: warp 0 scans (rows, tiles) of 32 groups at a time; group E = shared.
  if (warp == 0) {
    int run = 0, ntl = 0, active = 0;
    for (int g0 = 0; g0 <= E; g0 += 32) {
      const int g = g0 + lane;
      const int n = g < E ? cnt[g] : (g == E && has_shared ? T : 0);
      const int nt = (n + BM - 1) / BM;
      int sn = n, st = nt;  // inclusive scans over the lanes
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int vn = __shfl_up_sync(0xffffffffu, sn, o), vt = __shfl_up_sync(0xffffffffu, st, o);
        if (lane >= o) sn += vn, st += vt;
      }
      const int off = run + sn - n, toff = ntl + st - nt;
      if (g <= E) offsets[g] = off;
      if (g < E) base[g] = off;
      for (int i = 0; i < nt; ++i) tiles[2 * (toff + i)] = g, tiles[2 * (toff + i) + 1] = off + i * BM;
      active += __popc(__ballot_sync(0xffffffffu, g < E && n > 0));
      run += __shfl_sync(0xffffffffu, sn, 31), ntl += __shfl_sync(0xffffffffu, st, 31);
    }
    if (lane == 0) offsets[E + 1] = run, counters[0] = ntl, counters[1] = active, counters[2] = 0, counters[3] = 0;
  }
  __syncthreads();

  // Stable scatter, 1024 pairs per round: rank within the warp by match_any, warps ordered by a per-expert scan.
  for (int c0 = 0; c0 < TK; c0 += kGroupThreads) {
    for (int i = tid; i < 32 * E; i += kGroupThreads) wc[i] = 0;
    __syncthreads();
    const int p = c0 + tid;
    const bool valid = p < TK;
    const int e = valid ? ids[p] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (valid && rank == 0) wc[warp * E + e] = __popc(peers);
    __syncthreads();
    for (int e2 = tid; e2 < E; e2 += kGroupThreads) {
      int run = base[e2];
      for (int w = 0; w < 32; ++w) {
        const int v = wc[w * E + e2];
        wc[w * E + e2] = run;
        run += v;
      }
      base[e2] = run;
    }
    __syncthreads();
    if (valid) {
      const int pos = wc[warp * E + e] + rank;
      row_tok[pos] = p / K;
      row_slot[pos] = p;
    }
    __syncthreads();
  }
  if (has_shared)
    for (int t = tid; t < T; t += kGroupThreads) row_tok[TK + t] = t, row_slot[TK + t] = TK + t;
}

struct GemmParams {
  const __nv_bfloat16* a;  // gate/up: xb [T, lda] (row = token of the grouped row); down: act [rows, lda]
  int64_t lda;
  const int32_t* row_tok;
  const int32_t* row_slot;
  const int32_t* offsets;
  const int32_t* tiles;
  const int32_t* counters;
  const void* w;         // stacked experts: bf16, or e4m3 bytes (WT = uint8_t)
  const void* w_shared;  // group E
  const float* ws;         // e4m3 only: Blk128 scales of expert 0, experts ws_stride floats apart
  const float* ws_shared;  // e4m3 only: the shared expert's Blk128 scales
  int64_t ws_stride;
  int E, I, Is, H;
  __nv_bfloat16* act;  // gate/up output [rows, ld_act]
  int64_t ld_act;
  float* y;  // down output [slots, H]
  float alpha, limit;
};

// Weight element types of the GEMMs: bf16, or e4m3 codes (uint8_t) with Blk128 scales (W8A16, docs/FP8.md §9).
template <typename WT>
constexpr int kWRowBytes = std::is_same_v<WT, uint8_t> ? 128 : kRowBytes;  // a weight row of one 128-wide K step

template <int BM, int kStages, typename WT = __nv_bfloat16>
constexpr int gemm_smem_bytes() {
  return kStages * (BM * kRowBytes + kBN * kWRowBytes<WT>);
}

// A [64, 128] e4m3 weight tile in shared memory: a row is 128 bytes = 8 chunks of 16 bytes, chunk c of row r stored
// at c ^ 4·(r & 1). A quarter warp of the fragment loads below reads rows r, r + 1 at chunks 4h + {0..3}: 8 distinct
// 16-byte bank groups (rows are 128 bytes, so without the swizzle rows r and r + 1 collide).
__device__ __forceinline__ uint32_t swz_w8(int row, int chunk) {
  return uint32_t(row * 128 + ((chunk ^ ((row & 1) << 2)) << 4));
}

__device__ __forceinline__ void lds128(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// Grouped y = A·Wᵀ over one tile: rows [r0, r0 + nrows) of group g, 64 weight rows, K in steps of 128.
// 4 warps as WM × (4 / WM); warp tile (BM / WM) × (64 / WN); mma.sync m16n8k16, fp32 accumulate; cp.async ring
// of kStages stages, rows past the tile and K past the end zero-filled.
// WT = uint8_t: W8A16 on e4m3 weights with Blk128 scales. The ring carries the e4m3 bytes (half the bf16 tile) and
// the fragments are made in registers, as fp8_gemm.cu's W8A16 kernel does: per 64-wide half of a K step a thread
// loads 16 contiguous weight bytes of its row (one 16-byte load) and 16 contiguous bf16 of each of its A rows (two
// 16-byte loads), and mma step j pairs bytes 4j..4j+3 with A elements 4j..4j+3 — the k order inside an mma is free
// as long as A and B agree: lane quad position c owns logical k {2c, 2c+1} = physical 16c + 4j + {0, 1} and
// {2c+8, 2c+9} = 16c + 4j + {2, 3}. Each code pair becomes an exact f16 pair in one cvt.rn.f16x2.e4m3x2, the mma
// is f16 (fp32 accumulate) into per-K-step accumulators that are scaled into the tile's once per step (the Blk128
// scale is constant over 128 K). So the A operand is f16 here: the router writes xn as f16 for FP8 experts and the
// gate/up epilogue writes act as f16 (|act| ≤ 56 under SwiGLU-OAI's clamps; f16 rounds a normal value more finely
// than bf16). The earlier bf16 route (codes placed as bf16·2^−120, one mul.bf16x2 by scale·2^120 per pair) issued
// ≈ 4 instructions per code pair where this issues one (bench/results/2026-12-02e-moe-h200.md: instruction-bound).
template <int BM, int WM, int kStages, bool kGateUp, typename WT>
__global__ void __launch_bounds__(128) moe_gemm_kernel(const GemmParams p) {
  constexpr bool kFp8 = std::is_same_v<WT, uint8_t>;
  constexpr int WN = 4 / WM, RW = BM / WM, MT = RW / 16, CW = kBN / WN, NP = CW / 16;
  constexpr int kABytes = BM * kRowBytes, kStageBytes = kABytes + kBN * kWRowBytes<WT>;
  static_assert(MT >= 1 && NP >= 1, "warp tile");
  extern __shared__ __align__(128) uint8_t smem[];
  const int tile = blockIdx.y;
  if (tile >= p.counters[0]) return;  // grid sized at capacity
  const int g = p.tiles[2 * tile], r0 = p.tiles[2 * tile + 1];
  const int nrows = min(BM, p.offsets[g + 1] - r0);
  const int Ig = g < p.E ? p.I : p.Is;
  int n0, K;
  const WT* W;
  const float* WS = nullptr;  // e4m3: this group's Blk128 scales
  if (kGateUp) {
    n0 = blockIdx.x * (kBN / 2);
    if (n0 >= Ig) return;
    K = p.H;
    W = g < p.E ? static_cast<const WT*>(p.w) + int64_t(g) * 2 * p.I * p.H : static_cast<const WT*>(p.w_shared);
  } else {
    n0 = blockIdx.x * kBN;
    K = Ig;
    W = g < p.E ? static_cast<const WT*>(p.w) + int64_t(g) * p.H * p.I : static_cast<const WT*>(p.w_shared);
  }
  if constexpr (kFp8) WS = g < p.E ? p.ws + int64_t(g) * p.ws_stride : p.ws_shared;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t sbase = smem_addr(smem);
  // Load assignment: chunk (16 bytes) ch = tid & 15 of rows (tid >> 4) + 8i; fixed for the whole K loop.
  const int ch = tid & 15, rsub = tid >> 4;
  const __nv_bfloat16* asrc[BM / 8];
  bool aok[BM / 8];
#pragma unroll
  for (int i = 0; i < BM / 8; ++i) {
    const int row = rsub + 8 * i;
    aok[i] = row < nrows;
    const int64_t ar = aok[i] ? (kGateUp ? int64_t(p.row_tok[r0 + row]) : int64_t(r0 + row)) : 0;
    asrc[i] = p.a + ar * p.lda;
  }
  // Weight rows: smem row j ↔ global row wrow(j) (gate/up: 32 gate rows, then the matching 32 up rows).
  auto wrow = [&](int j) -> int64_t {
    return kGateUp ? (j < kBN / 2 ? n0 + j : Ig + n0 + j - kBN / 2) : n0 + j;
  };
  // bf16: chunk ch of rows rsub + 8i (16 chunks of 8 elements per row). e4m3: chunk tid & 7 of rows (tid >> 3) + 16i
  // (8 chunks of 16 codes per row).
  constexpr int kWLoads = kFp8 ? kBN / 16 : kBN / 8;
  const int wch = kFp8 ? (tid & 7) : ch, wsub = kFp8 ? (tid >> 3) : rsub, wstep = kFp8 ? 16 : 8;
  const WT* bsrc[kWLoads];
#pragma unroll
  for (int i = 0; i < kWLoads; ++i) bsrc[i] = W + wrow(wsub + wstep * i) * K;
  const int nk = (K + 127) / 128;
  auto load = [&](int kb, int stage) {
    const int k0 = kb * 128 + ch * 8;
    const bool kok = k0 < K;
    const uint32_t as = sbase + stage * kStageBytes, bs = as + kABytes;
#pragma unroll
    for (int i = 0; i < BM / 8; ++i) {
      const bool ok = aok[i] && kok;
      cp_async16(as + swz128(rsub + 8 * i, ch), ok ? asrc[i] + k0 : p.a, ok ? 16 : 0);
    }
    if constexpr (kFp8) {
      const int kw = kb * 128 + wch * 16;  // K % 16 == 0 (H % 64, I % 32): a chunk is all in or all out
      const bool wok = kw < K;
#pragma unroll
      for (int i = 0; i < kWLoads; ++i)
        cp_async16(bs + swz_w8(wsub + wstep * i, wch), wok ? bsrc[i] + kw : W, wok ? 16 : 0);
    } else {
#pragma unroll
      for (int i = 0; i < kWLoads; ++i)
        cp_async16(bs + swz128(rsub + 8 * i, ch), kok ? bsrc[i] + k0 : W, kok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load(s, s);
    cp_async_commit();
  }
  const int wm = warp / WN, wn = warp % WN;
  float acc[MT][2 * NP][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2 * NP; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  // e4m3: the CTA's weight rows touch at most two 128-row scale blocks (gate/up: the gate rows' and the up rows';
  // down: one — 8-row n-tiles never straddle a block, n0 and I being multiples of 32). Both scale rows, every K
  // step, go to shared memory once here, beside the ring's first stages: a scale read from global memory each K step
  // (prefetched only one step ahead) left every step waiting on a dependent load.
  const int sld = ((K + 127) / 128 + 3) / 4 * 4;  // fp8_scale_ld(Blk128, ·, K)
  __shared__ float ssc[kFp8 ? 2 * kMaxScaleSteps : 1];
  int sidx[2 * NP];  // which of the two scale rows each n-tile reads
  if constexpr (kFp8) {
    const int64_t b0 = wrow(0) / 128, b1 = wrow(kBN - 1) / 128;
    for (int i = tid; i < 2 * nk; i += 128) {
      const int r = i / nk, k = i % nk;
      ssc[r * kMaxScaleSteps + k] = WS[(r == 0 ? b0 : b1) * int64_t(sld) + k];
    }
#pragma unroll
    for (int j = 0; j < 2 * NP; ++j) sidx[j] = wrow(wn * CW + j * 8) / 128 == b0 ? 0 : kMaxScaleSteps;
  }

  for (int kb = 0; kb < nk; ++kb) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kb landed for all; the stage refilled below was consumed in iteration kb − 1
    if (kb + kStages - 1 < nk) load(kb + kStages - 1, (kb + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t as = sbase + (kb % kStages) * kStageBytes, bs = as + kABytes;
    if constexpr (kFp8) {
      // This K step's products in their own accumulators, scaled into acc once (the block scale is per 128 K).
      float sacc[MT][2 * NP][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 2 * NP; ++j) sacc[i][j][0] = sacc[i][j][1] = sacc[i][j][2] = sacc[i][j][3] = 0.f;
      const int gq = lane >> 2, c = lane & 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // 64-wide halves of the K step
        uint32_t af[MT][2][8];      // rows g and g + 8 of each m-tile: f16 k 64h + 16c … + 15
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int row = wm * RW + mt * 16 + gq + 8 * hr;
            lds128(as + swz128(row, 8 * h + 2 * c), af[mt][hr][0], af[mt][hr][1], af[mt][hr][2], af[mt][hr][3]);
            lds128(as + swz128(row, 8 * h + 2 * c + 1), af[mt][hr][4], af[mt][hr][5], af[mt][hr][6], af[mt][hr][7]);
          }
        uint32_t bw[2 * NP][4];  // row gq of each n-tile: codes k 64h + 16c … + 15
#pragma unroll
        for (int j = 0; j < 2 * NP; ++j)
          lds128(bs + swz_w8(wn * CW + j * 8 + gq, 4 * h + c), bw[j][0], bw[j][1], bw[j][2], bw[j][3]);
#pragma unroll
        for (int st = 0; st < 4; ++st) {
#pragma unroll
          for (int j = 0; j < 2 * NP; ++j) {
            const uint32_t b0 = e4m3x2_to_f16x2<false>(bw[j][st]), b1 = e4m3x2_to_f16x2<true>(bw[j][st]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const uint32_t a[4] = {af[mt][0][2 * st], af[mt][1][2 * st], af[mt][0][2 * st + 1],
                                     af[mt][1][2 * st + 1]};
              mma_f16_16816(sacc[mt][j], a, b0, b1);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 2 * NP; ++j) {
        const float sc = ssc[sidx[j] + kb];  // written before the loop's first __syncthreads
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][j][e] = fmaf(sc, sacc[mt][j][e], acc[mt][j][e]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(as + swz128(wm * RW + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)),
                      af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
#pragma unroll
        for (int np = 0; np < NP; ++np) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(bs + swz128(wn * CW + np * 16 + ((lane >> 4) << 3) + (lane & 7), 2 * kk + ((lane >> 3) & 1)),
                      b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16_16816(acc[mt][2 * np], af[mt], b0, b1);
            mma_bf16_16816(acc[mt][2 * np + 1], af[mt], b2, b3);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Accumulator (mt, j, e): row wm·RW + mt·16 + lane/4 (+8 for e ≥ 2), column wn·CW + j·8 + 2·(lane%4) + e%2.
  if (kGateUp) {
    constexpr int LD = kBN + 4;
    __syncthreads();  // every warp is done with the ring: reuse it as [BM][LD] fp32
    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2 * NP; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = wm * RW + mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
          const int col = wn * CW + j * 8 + 2 * (lane & 3) + (e & 1);
          cs[row * LD + col] = acc[mt][j][e];
        }
    __syncthreads();
    for (int idx = tid; idx < nrows * (kBN / 2); idx += 128) {
      const int r = idx / (kBN / 2), j = idx % (kBN / 2);
      // SwiGLU-OAI (cpu::swiglu_oai): gate clamped above, up clamped both sides, σ(α·g)·g·(u + 1).
      const float gv = cs[r * LD + j], uv = cs[r * LD + kBN / 2 + j];
      const float gc = fminf(gv, p.limit);
      const float uc = fminf(fmaxf(uv, -p.limit), p.limit);
      const float sig = 1.0f / (1.0f + expf(-p.alpha * gc));
      const float av = gc * sig * (uc + 1.0f);  // |av| ≤ 7 · 1 · 8: in f16's range
      if constexpr (kFp8)
        reinterpret_cast<__half*>(p.act)[int64_t(r0 + r) * p.ld_act + n0 + j] = __float2half_rn(av);
      else
        p.act[int64_t(r0 + r) * p.ld_act + n0 + j] = __float2bfloat16_rn(av);
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = wm * RW + mt * 16 + (lane >> 2) + hf * 8;
        if (row >= nrows) continue;
        float* yr = p.y + int64_t(p.row_slot[r0 + row]) * p.H + n0;
#pragma unroll
        for (int j = 0; j < 2 * NP; ++j) {
          const int col = wn * CW + j * 8 + 2 * (lane & 3);
          *reinterpret_cast<float2*>(yr + col) = make_float2(acc[mt][j][2 * hf], acc[mt][j][2 * hf + 1]);
        }
      }
  }
}

// x[t] += Σ_k w[t,k]·y[t·K + k] (+ y[T·K + t]), in slot order (M3Model::forward's sum). CTA (t, j): token t,
// float4 columns j·256 + threadIdx.x (+ gridDim.y·256 …): H / 1024 CTAs per token, so a decode step's few tokens
// still spread over many SMs (one CTA per token took ≈ 11 µs at T = 1, H = 6144: six dependent rounds of 9 loads).
constexpr int kCombineThreads = 256;
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(float* __restrict__ x, int H, int K, int TK,
                                                                  const float* __restrict__ w,
                                                                  const float* __restrict__ y, int has_shared) {
  const int t = blockIdx.x;
  for (int h = (blockIdx.y * kCombineThreads + threadIdx.x) * 4; h < H; h += gridDim.y * kCombineThreads * 4) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < K; ++k) {
      const float wk = w[t * K + k];
      const float4 v = *reinterpret_cast<const float4*>(y + int64_t(t * K + k) * H + h);
      acc.x += wk * v.x, acc.y += wk * v.y, acc.z += wk * v.z, acc.w += wk * v.w;
    }
    if (has_shared) {
      const float4 v = *reinterpret_cast<const float4*>(y + int64_t(TK + t) * H + h);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    float4* xp = reinterpret_cast<float4*>(x + int64_t(t) * H + h);
    float4 o = *xp;
    o.x += acc.x, o.y += acc.y, o.z += acc.z, o.w += acc.w;
    *xp = o;
  }
}

// Decode-sized tiles keep 4 warps side by side on the weight columns (BM 16); prefill tiles trade them for rows.
// e4m3 stages are 12 KB (BM 16) / 24 KB (BM 64) instead of 20 / 32: twice the stages at BM 16 keep about as many
// weight bytes in flight per CTA as bf16 (7 × 8 KB vs 3 × 16 KB) in the same 96 KB (2 CTAs per SM).
constexpr int kStagesSmall = 4, kStagesLarge = 3;
constexpr int kStagesSmall8 = 8, kStagesLarge8 = 4;

template <int BM, int WM, int kStages, bool kGateUp, typename WT>
void set_gemm_attribute() {
  M3_CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_kernel<BM, WM, kStages, kGateUp, WT>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     gemm_smem_bytes<BM, kStages, WT>()));
}

// Opt-in shared memory for every GEMM instantiation, once, outside any capture (from moe_reserve).
void ensure_attributes() {
  static const bool done = [] {
    using bf = __nv_bfloat16;
    set_gemm_attribute<16, 1, kStagesSmall, true, bf>();
    set_gemm_attribute<16, 1, kStagesSmall, false, bf>();
    set_gemm_attribute<64, 2, kStagesLarge, true, bf>();
    set_gemm_attribute<64, 2, kStagesLarge, false, bf>();
    set_gemm_attribute<16, 1, kStagesSmall8, true, uint8_t>();
    set_gemm_attribute<16, 1, kStagesSmall8, false, uint8_t>();
    set_gemm_attribute<64, 2, kStagesLarge8, true, uint8_t>();
    set_gemm_attribute<64, 2, kStagesLarge8, false, uint8_t>();
    return true;
  }();
  (void)done;
}

template <int BM, int WM, int kStages, bool kGateUp, typename WT>
void launch_gemm(const GemmParams& p, dim3 grid, cudaStream_t s) {
  moe_gemm_kernel<BM, WM, kStages, kGateUp, WT><<<grid, 128, gemm_smem_bytes<BM, kStages, WT>(), s>>>(p);
  M3_CUDA_LAUNCH_CHECK();
}

// Both grouped GEMMs of one call with weights of type WT, BM-row tiles.
template <typename WT>
void launch_gemms(int BM, const GemmParams& pg, dim3 grid_gu, const GemmParams& pd, dim3 grid_dn, cudaStream_t s,
                  const std::function<void()>& after_gate_up) {
  constexpr bool f8 = std::is_same_v<WT, uint8_t>;
  constexpr int SS = f8 ? kStagesSmall8 : kStagesSmall, SL = f8 ? kStagesLarge8 : kStagesLarge;
  if (BM == 16) {
    launch_gemm<16, 1, SS, true, WT>(pg, grid_gu, s);
    after_gate_up();
    launch_gemm<16, 1, SS, false, WT>(pd, grid_dn, s);
  } else {
    launch_gemm<64, 2, SL, true, WT>(pg, grid_gu, s);
    after_gate_up();
    launch_gemm<64, 2, SL, false, WT>(pd, grid_dn, s);
  }
}

int64_t max_tiles(int64_t T, int64_t E, int64_t K, int BM, bool shared) {
  const int64_t TK = T * K;
  return (TK + BM - 1) / BM + std::min(E, TK) + (shared ? (T + BM - 1) / BM : 0);
}

struct Sizes {
  size_t logits, tk, xb, offsets, rows, tiles, act, y, counts;
};
Sizes sizes_for(int64_t T, int64_t H, int64_t E, int64_t K, int64_t I, int64_t Is) {
  const int64_t R = T * K + T;
  return Sizes{size_t(T * E), size_t(T * K), size_t(T * H), size_t(E + 2), size_t(R),
               size_t(2 * max_tiles(T, E, K, 16, true)), size_t(R * std::max(I, Is)), size_t(R * H), size_t(E)};
}

bool fits(const MoeGroupedScratch& s, const Sizes& z) {
  return s.logits.size() >= z.logits && s.ids.size() >= z.tk && s.weights.size() >= z.tk && s.xb.size() >= z.xb &&
         s.offsets.size() >= z.offsets && s.row_tok.size() >= z.rows && s.row_slot.size() >= z.rows &&
         s.tiles.size() >= z.tiles && s.counters.size() >= 4 && s.act.size() >= z.act && s.y.size() >= z.y &&
         s.counts.size() >= z.counts;
}

}  // namespace

bool moe_grouped_supported(int64_t H, int64_t E, int64_t top_k, int64_t I, int64_t Is) {
  return H > 0 && H % kBN == 0 && E >= 1 && E <= kMaxE && top_k >= 1 && top_k <= kMaxK && top_k <= E && I > 0 &&
         I % (kBN / 2) == 0 && Is >= 0 && Is % (kBN / 2) == 0;
}

int moe_tile_rows(int64_t T, int64_t E, int64_t top_k) { return T * top_k <= 24 * E ? 16 : 64; }

MoeGemmPath moe_gemm_path(int64_t T, int64_t H, int64_t E, int64_t top_k, int64_t I, int64_t Is, bool fp8) {
  const bool fits = fp8 ? moe_wgmma_fp8_supported(H, I, Is) : moe_wgmma_supported(H, I, Is);
  const int64_t min_rows = fp8 ? kMoeWgmmaFp8MinRowsPerExpert : kMoeWgmmaMinRowsPerExpert;
  if (!(fits && T * top_k >= min_rows * E)) return MoeGemmPath::MmaSync;
  // FP8 experts take the N = 256 kernels where the widths allow: 1.06 / 1.13 / 1.18× the N = 128 ones at T = 512 /
  // 2048 / 8192 at M3 widths (bench/results/2026-12-03f-h200.md). M3_MOE_FP8_WIDE=0 keeps N = 128 (A/B).
  static const bool wide = [] {
    const char* e = std::getenv("M3_MOE_FP8_WIDE");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  return fp8 && wide && moe_wgmma_fp8_supported(H, I, Is, true) ? MoeGemmPath::Wgmma256 : MoeGemmPath::Wgmma;
}

void moe_reserve(MoeGroupedScratch& s, int64_t T_max, int64_t H, int64_t E, int64_t top_k, int64_t I, int64_t Is) {
  M3_CUDA_REQUIRE(moe_grouped_supported(H, E, top_k, I, Is),
                  "moe_reserve: unsupported shape H %lld, E %lld, top_k %lld, I %lld, shared I %lld", (long long)H,
                  (long long)E, (long long)top_k, (long long)I, (long long)Is);
  ensure_attributes();
  const Sizes z = sizes_for(std::max<int64_t>(T_max, 1), H, E, top_k, I, Is);
  s.logits.grow(z.logits), s.ids.grow(z.tk), s.weights.grow(z.tk), s.xb.grow(z.xb), s.offsets.grow(z.offsets);
  s.row_tok.grow(z.rows), s.row_slot.grow(z.rows), s.tiles.grow(z.tiles), s.counters.grow(4), s.act.grow(z.act);
  s.y.grow(z.y), s.counts.grow(z.counts);
  s.cap_T = std::max(s.cap_T, T_max), s.cap_H = H, s.cap_E = E, s.cap_K = top_k, s.cap_I = std::max(I, Is);
}

void moe_grouped_forward(const MoeGroupedWeights& w, const float* xn, int64_t T, int64_t H, float* x,
                         MoeGroupedScratch& scr, cudaStream_t s, const MoeStageEvents* marks, MoeGemmPath path) {
  auto mark = [&](int i) {
    if (marks) M3_CUDA_CHECK(cudaEventRecord(marks->ev[i], s));
  };
  if (T <= 0) return;
  const bool fp8 = w.fp8();
  const bool shared = w.has_shared();
  const int64_t E = w.E, K = w.top_k, I = w.I, Is = shared ? w.Is : 0, TK = T * K;
  M3_CUDA_REQUIRE(moe_grouped_supported(H, E, K, I, Is),
                  "moe_grouped_forward: unsupported shape H %lld, E %lld, top_k %lld, I %lld, shared I %lld",
                  (long long)H, (long long)E, (long long)K, (long long)I, (long long)Is);
  if (fp8) {
    M3_CUDA_REQUIRE(w.router && w.gate_up8_scales && w.down8 && w.down8_scales,
                    "moe_grouped_forward: FP8 experts need values and Blk128 scales for gate_up and down");
    M3_CUDA_REQUIRE(!shared || (w.shared_gate_up8_scales && w.shared_down8 && w.shared_down8_scales),
                    "moe_grouped_forward: an FP8 shared expert needs values and Blk128 scales for gate_up and down");
    M3_CUDA_REQUIRE(w.shared_gate_up == nullptr || w.Is == 0,
                    "moe_grouped_forward: a bf16 shared expert with FP8 routed experts must run on its own");
    M3_CUDA_REQUIRE(H <= 128 * kMaxScaleSteps && std::max(I, Is) <= 128 * kMaxScaleSteps,
                    "moe_grouped_forward: FP8 experts with H %lld, I %lld, shared I %lld: K above %d", (long long)H,
                    (long long)I, (long long)Is, 128 * kMaxScaleSteps);
  } else {
    M3_CUDA_REQUIRE(w.router && w.gate_up && w.down, "moe_grouped_forward: missing weights");
  }
  M3_CUDA_REQUIRE(TK + T < (int64_t(1) << 31) / 2, "moe_grouped_forward: %lld rows is too many", (long long)T);
  if (!fits(scr, sizes_for(T, H, E, K, I, Is))) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    M3_CUDA_CHECK(cudaStreamIsCapturing(s, &cs));
    M3_CUDA_REQUIRE(cs == cudaStreamCaptureStatusNone,
                    "moe_grouped_forward: scratch not reserved for %lld rows while capturing a graph (moe_reserve)",
                    (long long)T);
    moe_reserve(scr, T, H, E, K, I, Is);
  }

  mark(0);
  // Experts per router warp: a function of T only (launch shape), never of the summation order.
  const unsigned router_tiles = unsigned((T + kRouterTT - 1) / kRouterTT);
  if (T >= kRouterWideRows)
    router_logits_kernel<8, kRouterTT><<<dim3(router_tiles, unsigned((E + 7) / 8)), 32 * kRouterSeg, 0, s>>>(
        xn, int(T), int(H), w.router, int(E), scr.logits.get(), scr.xb.get(), scr.counts.get(), fp8);
  else if (T == 1)
    router_logits_kernel<1, 1><<<dim3(1u, unsigned(E)), 32 * kRouterSeg, 0, s>>>(
        xn, int(T), int(H), w.router, int(E), scr.logits.get(), scr.xb.get(), scr.counts.get(), fp8);
  else
    router_logits_kernel<1, kRouterTT><<<dim3(router_tiles, unsigned(E)), 32 * kRouterSeg, 0, s>>>(
        xn, int(T), int(H), w.router, int(E), scr.logits.get(), scr.xb.get(), scr.counts.get(), fp8);
  M3_CUDA_LAUNCH_CHECK();
  mark(1);
  if (path == MoeGemmPath::Auto) path = moe_gemm_path(T, H, E, K, I, Is, fp8);
  if (path == MoeGemmPath::Wgmma256 && !fp8) path = MoeGemmPath::Wgmma;  // bf16 tiles are N = 256 already
  const bool wide = path == MoeGemmPath::Wgmma256;
  M3_CUDA_REQUIRE(path == MoeGemmPath::MmaSync ||
                      (fp8 ? moe_wgmma_fp8_supported(H, I, Is, wide) : moe_wgmma_supported(H, I, Is)),
                  "moe_grouped_forward: the wgmma GEMMs do not take H %lld, I %lld, shared I %lld%s", (long long)H,
                  (long long)I, (long long)Is, fp8 ? (wide ? " (FP8 experts, N = 256 tiles)" : " (FP8 experts)") : "");
  const bool wgmma = path == MoeGemmPath::Wgmma || wide;
  const int BM = wgmma ? kMoeWgmmaRows : moe_tile_rows(T, E, K);
  route_kernel<<<unsigned((T + 7) / 8), 256, 0, s>>>(scr.logits.get(), int(T), int(E), int(K), w.router_bias,
                                                     w.routed_scale, scr.ids.get(), scr.weights.get(),
                                                     scr.counts.get());
  M3_CUDA_LAUNCH_CHECK();
  group_kernel<<<1, kGroupThreads, size_t(34 * E) * 4, s>>>(scr.counts.get(), int(T), int(E), int(K), BM,
                                                            shared ? 1 : 0, scr.ids.get(), scr.offsets.get(),
                                                            scr.row_tok.get(), scr.row_slot.get(), scr.tiles.get(),
                                                            scr.counters.get());
  M3_CUDA_LAUNCH_CHECK();
  mark(2);

  GemmParams p{};
  p.row_tok = scr.row_tok.get(), p.row_slot = scr.row_slot.get(), p.offsets = scr.offsets.get();
  p.tiles = scr.tiles.get(), p.counters = scr.counters.get();
  p.E = int(E), p.I = int(I), p.Is = int(Is), p.H = int(H);
  p.act = scr.act.get(), p.ld_act = std::max(I, Is), p.y = scr.y.get(), p.alpha = w.alpha, p.limit = w.limit;
  const unsigned ntiles = unsigned(max_tiles(T, E, K, BM, shared));
  // gate/up: A = xb rows by token.
  GemmParams pg = p;
  pg.a = scr.xb.get(), pg.lda = H, pg.w = w.gate_up, pg.w_shared = w.shared_gate_up;
  if (fp8) {
    pg.w = w.gate_up8, pg.w_shared = w.shared_gate_up8, pg.ws = w.gate_up8_scales;
    pg.ws_shared = w.shared_gate_up8_scales, pg.ws_stride = fp8_scale_count(Fp8Scale::Blk128, 2 * I, H);
  }
  const dim3 grid_gu(unsigned(std::max(I, Is) / (kBN / 2)), ntiles);
  // down: A = act rows.
  GemmParams pd = p;
  pd.a = scr.act.get(), pd.lda = std::max(I, Is), pd.w = w.down, pd.w_shared = w.shared_down;
  if (fp8) {
    pd.w = w.down8, pd.w_shared = w.shared_down8, pd.ws = w.down8_scales, pd.ws_shared = w.shared_down8_scales;
    pd.ws_stride = fp8_scale_count(Fp8Scale::Blk128, H, I);
  }
  const dim3 grid_dn(unsigned(H / kBN), ntiles);
  if (wgmma) {
    // Grouped rows of this call: T·K routed + T shared. xg (the gathered A of gate/up) lives in y, which only the
    // down GEMM writes, after gate/up has read xg.
    MoeWgmmaRouting rt;
    rt.offsets = scr.offsets.get(), rt.row_tok = scr.row_tok.get(), rt.row_slot = scr.row_slot.get();
    rt.tiles = scr.tiles.get(), rt.counters = scr.counters.get(), rt.E = int(E);
    rt.cap_rows = TK + (shared ? T : 0);
    rt.cap_tiles = max_tiles(T, E, K, kMoeWgmmaRows, shared);
    if (fp8) {
      // FP8 experts: xg as e4m3 + 1x128 scales (from the router's f16 xn) in y's bytes, act with 1x64 (wide: 1x128)
      // scales in act's ([rows, ld] codes, then [rows, ld / 64] scales at most: 1.0625 bytes per element where y
      // holds 4 and act 2).
      uint8_t* xq = reinterpret_cast<uint8_t*>(scr.y.get());
      float* xs = reinterpret_cast<float*>(xq + rt.cap_rows * H);
      uint8_t* aq = reinterpret_cast<uint8_t*>(scr.act.get());
      float* as = reinterpret_cast<float*>(aq + rt.cap_rows * p.ld_act);
      const MoeWgmmaFp8Weights gu{w.gate_up8, w.gate_up8_scales, shared ? w.shared_gate_up8 : nullptr,
                                  shared ? w.shared_gate_up8_scales : nullptr};
      const MoeWgmmaFp8Weights dn{w.down8, w.down8_scales, shared ? w.shared_down8 : nullptr,
                                  shared ? w.shared_down8_scales : nullptr};
      moe_gather_quant_rows(scr.xb.get(), H, rt, xq, xs, s);
      moe_gate_up_wgmma_fp8(xq, xs, H, gu, I, Is, w.alpha, w.limit, rt, aq, as, p.ld_act, s, wide);
      mark(3);
      moe_down_wgmma_fp8(aq, as, p.ld_act, dn, H, I, Is, rt, scr.y.get(), s, wide);
    } else {
      __nv_bfloat16* xg = reinterpret_cast<__nv_bfloat16*>(scr.y.get());
      moe_gather_rows(scr.xb.get(), H, rt, xg, s);
      moe_gate_up_wgmma(static_cast<const __nv_bfloat16*>(xg), H, w.gate_up, shared ? w.shared_gate_up : nullptr, I,
                        Is, w.alpha, w.limit, rt, scr.act.get(), p.ld_act, s);
      mark(3);
      moe_down_wgmma(static_cast<const __nv_bfloat16*>(scr.act.get()), p.ld_act, w.down,
                     shared ? w.shared_down : nullptr, H, I, Is, rt, scr.y.get(), s);
    }
  } else if (fp8) {
    launch_gemms<uint8_t>(BM, pg, grid_gu, pd, grid_dn, s, [&] { mark(3); });
  } else {
    launch_gemms<__nv_bfloat16>(BM, pg, grid_gu, pd, grid_dn, s, [&] { mark(3); });
  }
  mark(4);
  combine_kernel<<<dim3(unsigned(T), unsigned((H + 4 * kCombineThreads - 1) / (4 * kCombineThreads))),
                   kCombineThreads, 0, s>>>(x, int(H), int(K), int(TK), scr.weights.get(), scr.y.get(),
                                            shared ? 1 : 0);
  M3_CUDA_LAUNCH_CHECK();
  mark(5);
}

namespace {
__device__ __forceinline__ float hash_unit(uint64_t seed, int64_t i) {
  uint64_t z = seed ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
__global__ void fill_bf16_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(scale * hash_unit(seed, i));
}
__global__ void fill_f32_kernel(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = scale * hash_unit(seed, i);
}
// q = rne_e4m3(448·u) (saturating; never the NaN code), one UE8M0 byte per 32-group: 127 + e0 + (hash mod 3).
__global__ void fill_mxfp8_kernel(uint8_t* q, uint8_t* ue8m0, int64_t n, int64_t groups, uint64_t seed, int e0) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    q[i] = uint8_t(__nv_cvt_float_to_fp8(448.f * hash_unit(seed, i), __NV_SATFINITE, __NV_E4M3));
    if (i < groups) {
      const float u = hash_unit(seed ^ 0x5bd1e995ull, i);  // [−1, 1)
      ue8m0[i] = uint8_t(127 + e0 + min(2, int((u + 1.f) * 1.5f)));
    }
  }
}
__global__ void blk128_to_bf16_kernel(const uint8_t* __restrict__ q, const float* __restrict__ sc, int64_t N,
                                      int64_t K, int64_t sld, __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);  // exact for every code
    out[i] = __float2bfloat16_rn(__half2float(__half(h)) * sc[(n / 128) * sld + k / 128]);
  }
}
}  // namespace

void fill_hash_mxfp8(uint8_t* q, uint8_t* ue8m0, int64_t N, int64_t K, uint64_t seed, int e0, cudaStream_t s) {
  M3_CUDA_REQUIRE(K % 32 == 0 && e0 >= -127 && e0 <= 125, "fill_hash_mxfp8: K %lld, e0 %d", (long long)K, e0);
  if (N * K <= 0) return;
  fill_mxfp8_kernel<<<4096, 256, 0, s>>>(q, ue8m0, N * K, N * K / 32, seed, e0);
  M3_CUDA_LAUNCH_CHECK();
}

void fp8_blk128_to_bf16(const uint8_t* q, const float* scales, int64_t N, int64_t K, __nv_bfloat16* out,
                        cudaStream_t s) {
  if (N * K <= 0) return;
  blk128_to_bf16_kernel<<<4096, 256, 0, s>>>(q, scales, N, K, fp8_scale_ld(Fp8Scale::Blk128, N, K), out);
  M3_CUDA_LAUNCH_CHECK();
}

void fill_hash_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n <= 0) return;
  fill_bf16_kernel<<<4096, 256, 0, s>>>(p, n, seed, scale);
  M3_CUDA_LAUNCH_CHECK();
}
void fill_hash_f32(float* p, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n <= 0) return;
  fill_f32_kernel<<<4096, 256, 0, s>>>(p, n, seed, scale);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
