// Grouped MoE GEMMs of FP8 experts on wgmma, e4m3 × e4m3 (moe_grouped_wgmma.cuh, the FP8 part). The bf16 kernels'
// structure (moe_grouped_wgmma.cu) with what FP8 changes:
//   - CTA = 3 warpgroups (384 threads, one CTA per SM, persistent): warpgroup 0 the TMA producer, 1 and 2 consumers of
//     rows 0–63 / 64–127 of a 128-row tile. Ring of kStages stages, each A [128 rows, 128 K] and B [N rows, 128 K]
//     e4m3 (16 KB each; 128-byte swizzled rows, the same byte layout as bf16's 64-wide K steps).
//   - Tile N = 128 (m64n128k32): the tensor cores may sum only as far along K as one activation scale block reaches
//     (x: 1×128, so gate/up promotes once per 128-K stage; act: 1×64, so down promotes per 64-K half); each partial
//     lands in a second register tile and is added to the accumulator times its scales ("promotion"). 64 + 64 fp32
//     registers per thread — an N = 256 tile would need 256.
//   - gate/up: B = 64 gate rows of expert g then the matching 64 up rows (two TMA boxes), so column c < 64 is gate and
//     c + 64 its up; SwiGLU-OAI in registers, then the 64 act values of a row (one quad of lanes) are quantised to
//     e4m3 with one scale: act's 1×64 blocks are exactly the column tiles.
//   - down: B = 128 rows of expert g's [H, I]; fp32 y rows scattered by row_slot.
// Per K stage a consumer issues 4 wgmma: gate/up as one chain and one promotion, down as two 64-K halves, waiting
// for each before promoting it; the other consumer warpgroup's MMAs fill the tensor cores meanwhile. (With x also in
// 1×64 blocks gate/up promoted twice per stage: tensor pipe 41 % in ncu at 8192 rows, bench/results/
// 2026-12-03d-fp8-moe-wgmma-h200.md; 1×128 is the dense projections' rule, docs/FP8.md §3.)
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/moe_grouped_wgmma.cuh"
#include "backend/cuda/moe_wgmma_tiles.cuh"
#include "base/fp8_format.h"

namespace m3::cuda {
namespace {

using namespace hopper;

constexpr int kBM = kMoeWgmmaRows, kBK = 128, kThreads = 384;
constexpr int kQ = 64;    // act's scale block with N = 128 tiles (down's promotion interval): a gate/up tile's 64 act
                          // columns
constexpr int kQx = 128;  // x's scale block along K (gate/up's promotion interval: one K stage); act's with N = 256
constexpr uint32_t kTileA = kBM * kBK;  // bytes per stage
// The two tile widths (moe_grouped_wgmma.cuh, `wide`). N = 128: 6 stages of A + B [128 rows, 128 K]. N = 256 (wide):
// 4 stages of A + B [256 rows, 128 K], B as two 128-row halves, each issued and promoted into its own accumulator;
// a gate/up tile then covers 128 act columns, so act takes 1 × 128 scales and down promotes once per stage too.
template <bool kWide>
struct Tiles {
  static constexpr int kBN = kWide ? 256 : 128, kStages = kWide ? 4 : 6;
  static constexpr int kActBlock = kWide ? 128 : 64;  // act's scale block: the act columns of one gate/up tile
  static constexpr uint32_t kTileB = uint32_t(kBN) * kBK, kHalfB = kTileB / 2;
  static constexpr size_t kSmem = size_t(kStages) * (kTileA + kTileB) + 1024 /*alignment*/ + 256 /*barriers*/;
};

struct Fp8Params {
  const int32_t* offsets;
  const int32_t* row_slot;
  const int32_t* tiles;
  const int32_t* counters;
  int* queue;  // the dynamic order's item counter (moe_wgmma::work_counter), or null
  int E, H, I, Is;
  int NN;        // column tiles per row tile
  int cap_rows;  // rows of the A operand and its scales
  const float* a_scales;  // [cap_rows, K / block] of the A operand (gate/up: x, K = H, block kQx; down: act,
                          // K = ld_act, block Tiles::kActBlock)
  int a_scale_ld;         // K / block of the A buffer
  const float* w_scales;  // routed experts' Blk128 scales, [E][w_scale_stride]
  const float* ws_scales; // the shared expert's
  int64_t w_scale_stride;
  uint8_t* act_q;
  float* act_s;
  int64_t ld_act;
  float* y;
  float alpha, limit;
};

// The MMAs of promotion block h (kP K wide) of a stage into part (overwritten): kP / 32 m64n128k32, one commit group.
template <int kP>
__device__ __forceinline__ void issue_block(float (&part)[64], uint64_t da, uint64_t db, int h) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kP / 32; ++k) {
    const uint32_t off = uint32_t(h * kP + k * 32);  // bytes = e4m3 elements along the 128-byte row
    Wgmma<e4m3_t, 128>::mma_ss(part, desc_advance(da, off), desc_advance(db, off), k != 0);
  }
  wgmma_commit();
}

// The e4m3 scale of an activation block from its amax (1 for an all-zero block): the CPU twin's amax / 448.
__device__ __forceinline__ float act_scale(float amax) { return amax > 0.f ? __fdiv_rn(amax, 448.0f) : 1.0f; }

// acc += part · (A scale of the row · B scale of the column block). part[i]: row a for i % 4 < 2 else row b (sa_a,
// sa_b); columns 0–63 for i < 32 (w_lo: gate or down), 64–127 above (w_hi: up, or down again).
__device__ __forceinline__ void promote(float (&acc)[64], const float (&part)[64], float sa_a, float sa_b, float w_lo,
                                        float w_hi) {
  const float f_alo = sa_a * w_lo, f_blo = sa_b * w_lo, f_ahi = sa_a * w_hi, f_bhi = sa_b * w_hi;
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const bool lo = i < 32, ra = (i & 2) == 0;
    acc[i] = fmaf(part[i], lo ? (ra ? f_alo : f_blo) : (ra ? f_ahi : f_bhi), acc[i]);
  }
}

// One act row's 2·kPairs values of this lane (columns col + c0 + 8j, + 1) as e4m3 codes with the row's scale, which
// the quad's first lane stores (col: the tile's first act column, one kBlock-wide scale block).
template <int kPairs, int kBlock>
__device__ __forceinline__ void store_act_row(const Fp8Params& p, int64_t row, int col, int c0,
                                              const float (&v)[2 * kPairs], float sc, bool quad_lead) {
  uint8_t* q = p.act_q + row * p.ld_act + col + c0;
#pragma unroll
  for (int j = 0; j < kPairs; ++j)
    *reinterpret_cast<uint16_t*>(q + 8 * j) =
        uint16_t(e4m3_quantize(v[2 * j], sc) | (uint32_t(e4m3_quantize(v[2 * j + 1], sc)) << 8));
  if (quad_lead) p.act_s[row * (p.ld_act / kBlock) + col / kBlock] = sc;
}

// The gate/up epilogue: SwiGLU-OAI of kPairs column pairs per row (gate g[4j + e], up u[4j + e]; e < 2 row a, else
// row b), each row's 2·kPairs values of this lane and its quad's others (kBlock act columns from col) quantised with
// one scale (amax over the quad: two shuffles) and stored.
template <int kPairs, int kBlock>
__device__ __forceinline__ void act_epilogue(const Fp8Params& p, const float* g, const float* u, int r0, int row_a,
                                             int row_b, int nrows, int col, int c0, int lane) {
  float va[2 * kPairs], vb[2 * kPairs];
  float ma = 0.f, mb = 0.f;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    va[2 * j] = moe_wgmma::swiglu_oai(g[4 * j], u[4 * j], p.alpha, p.limit);
    va[2 * j + 1] = moe_wgmma::swiglu_oai(g[4 * j + 1], u[4 * j + 1], p.alpha, p.limit);
    vb[2 * j] = moe_wgmma::swiglu_oai(g[4 * j + 2], u[4 * j + 2], p.alpha, p.limit);
    vb[2 * j + 1] = moe_wgmma::swiglu_oai(g[4 * j + 3], u[4 * j + 3], p.alpha, p.limit);
    ma = fmaxf(ma, fmaxf(fabsf(va[2 * j]), fabsf(va[2 * j + 1])));
    mb = fmaxf(mb, fmaxf(fabsf(vb[2 * j]), fabsf(vb[2 * j + 1])));
  }
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, o));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
  }
  if (row_a < nrows) store_act_row<kPairs, kBlock>(p, r0 + row_a, col, c0, va, act_scale(ma), lane % 4 == 0);
  if (row_b < nrows) store_act_row<kPairs, kBlock>(p, r0 + row_b, col, c0, vb, act_scale(mb), lane % 4 == 0);
}

// One 128-column half of a down tile's two rows (y0, y1: the rows' first columns of the half; null past the group's
// end) from its accumulator d.
__device__ __forceinline__ void store_y_half(float* y0, float* y1, const float* d) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (y0) *reinterpret_cast<float2*>(y0 + 8 * j) = make_float2(d[4 * j], d[4 * j + 1]);
    if (y1) *reinterpret_cast<float2*>(y1 + 8 * j) = make_float2(d[4 * j + 2], d[4 * j + 3]);
  }
}

// Each promotion block is waited for and promoted in turn. (A pipelined loop — a half's promotion under the next
// half's MMAs, two partial tiles, 192 accumulator registers — measured 5–11 % slower:
// bench/results/2026-12-03d-fp8-moe-wgmma-h200.md.)
template <bool kGateUp, bool kWide>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_fp8_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                         const __grid_constant__ CUtensorMap map_ws, const Fp8Params p) {
  using S = Tiles<kWide>;
  constexpr int kBN = S::kBN, kStages = S::kStages;
  constexpr uint32_t kTileB = S::kTileB, kHalfB = S::kHalfB;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles_a = smem;                     // [kStages][128][128] e4m3
  uint8_t* tiles_b = smem + kStages * kTileA;  // [kStages][kBN][128]
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles_b + kStages * kTileB);
  uint64_t* empty = full + kStages;
  auto* queue = reinterpret_cast<moe_wgmma::WorkQueue*>(empty + kStages);

  constexpr int kP = kGateUp || kWide ? kQx : kQ;  // promotion interval along K: the A operand's scale block
  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_a);
    tma_prefetch_map(&map_w);
    tma_prefetch_map(&map_ws);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each of the 8 consumer warps
    }
    moe_wgmma::queue_init(queue);
    fence_barrier_init();
  }
  __syncthreads();
  pdl_grid_dependency_wait();
  const int num_work = p.counters[0] * p.NN;

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      PipeState<kStages> ps;
      for (int i = 0;; ++i) {
        const int w = moe_wgmma::queue_push(queue, i, p.queue);
        if (w >= num_work) break;
        const moe_wgmma::WorkTile wt = moe_wgmma::work_tile(p.tiles, p.offsets, p.NN, w);
        const int g = wt.g, r0 = wt.r0, n = wt.n;
        const bool shared = g == p.E;
        const int Ig = shared ? p.Is : p.I;
        if (kGateUp && n * (kBN / 2) >= Ig) continue;  // this expert is narrower than the widest one
        const int num_k = (kGateUp ? p.H : Ig) / kBK;
        const CUtensorMap* mw = shared ? &map_ws : &map_w;
        for (int kb = 0; kb < num_k; ++kb) {
          mbar_wait(&empty[ps.stage], ps.phase ^ 1u);
          mbar_arrive_expect_tx(&full[ps.stage], kTileA + kTileB);
          uint8_t* b = tiles_b + ps.stage * kTileB;
          tma_load_2d(tiles_a + ps.stage * kTileA, &map_a, &full[ps.stage], kb * kBK, r0);
          if (kGateUp) {
            // Gate rows n·kBN/2 … and the matching up rows Ig + n·kBN/2 … of expert g ([E·2I, H] or shared
            // [2Is, H]).
            const int base = shared ? 0 : g * 2 * p.I;
            tma_load_2d(b, mw, &full[ps.stage], kb * kBK, base + n * (kBN / 2));
            tma_load_2d(b + kHalfB, mw, &full[ps.stage], kb * kBK, base + Ig + n * (kBN / 2));
          } else {
            const int base = shared ? 0 : g * p.H;  // [E·H, I] or shared [H, Is]
            tma_load_2d(b, mw, &full[ps.stage], kb * kBK, base + n * kBN);
            if constexpr (kWide) tma_load_2d(b + kHalfB, mw, &full[ps.stage], kb * kBK, base + n * kBN + 128);
          }
          ps.advance();
        }
      }
    }
    pdl_launch_dependents();
  } else {
    setmaxnreg_inc<232>();
    const int half = wg - 1;  // rows half·64 … half·64 + 63 of the tile
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    // Accumulator d[4j + e]: tile row half·64 + warp·16 + lane/4 (+8 for e ≥ 2), column 8j + 2·(lane%4) + e%2.
    const int row_a = half * 64 + warp * 16 + lane / 4, row_b = row_a + 8;
    float acc[64], acc1[kWide ? 64 : 1], part[64];  // acc1: the wide tile's second 128 columns
    PipeState<kStages> ps;
    for (int i = 0;; ++i) {
      const int w = moe_wgmma::queue_pop(queue, i, lane);
      if (w >= num_work) break;
      const moe_wgmma::WorkTile wt = moe_wgmma::work_tile(p.tiles, p.offsets, p.NN, w);
      const int g = wt.g, r0 = wt.r0, n = wt.n;
      const bool shared = g == p.E;
      const int Ig = shared ? p.Is : p.I;
      if (kGateUp && n * (kBN / 2) >= Ig) continue;
      const int num_k = (kGateUp ? p.H : Ig) / kBK;
      const int nrows = min(kBM, p.offsets[g + 1] - r0);
      if (half * 64 >= nrows) {
        // Every row of this half is past the group's end: no MMA, hand each stage straight back.
        for (int kb = 0; kb < num_k; ++kb) {
          mbar_wait(&full[ps.stage], ps.phase);
          if (lane == 0) mbar_arrive(&empty[ps.stage]);
          ps.advance();
        }
        continue;
      }
      // Scales: A per (row, kP K) from global (rows past the call's rows read row cap − 1: their results are
      // dropped); B per 128×128 block of expert g: gate/up rows n·64 and Ig + n·64, or down rows n·128.
      const float* sa_a = p.a_scales + int64_t(min(r0 + row_a, p.cap_rows - 1)) * p.a_scale_ld;
      const float* sa_b = p.a_scales + int64_t(min(r0 + row_b, p.cap_rows - 1)) * p.a_scale_ld;
      const float* sw = shared ? p.ws_scales : p.w_scales + int64_t(g) * p.w_scale_stride;
      const int K = kGateUp ? p.H : Ig;
      const int w_ld = (K / 128 + 3) & ~3;  // fp8_scale_ld(Blk128, ·, K): scale blocks per weight row block, padded
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.f;
      if constexpr (kWide) {
        // Columns 0–127 (gate, or down columns n·256 …) into acc, 128–255 (up, or down columns n·256 + 128 …)
        // into acc1: each half is one 128-row weight scale block. Scales are loaded at the stage (no prefetch
        // registers).
        const float* sw0 = sw + int64_t(kGateUp ? n : 2 * n) * w_ld;
        const float* sw1 = sw + int64_t(kGateUp ? (Ig + n * 128) / 128 : 2 * n + 1) * w_ld;
#pragma unroll
        for (int i = 0; i < 64; ++i) acc1[i] = 0.f;
        for (int kb = 0; kb < num_k; ++kb) {
          const float sa = sa_a[kb], sb = sa_b[kb], w0 = __ldg(sw0 + kb), w1 = __ldg(sw1 + kb);
          mbar_wait(&full[ps.stage], ps.phase);
          const uint64_t da = smem_desc_sw128(tiles_a + ps.stage * kTileA + half * (64 * 128));
          issue_block<kQx>(part, da, smem_desc_sw128(tiles_b + ps.stage * kTileB), 0);
          wgmma_wait<0>();
          fence_regs(part);
          promote(acc, part, sa, sb, w0, w0);
          issue_block<kQx>(part, da, smem_desc_sw128(tiles_b + ps.stage * kTileB + kHalfB), 0);
          wgmma_wait<0>();
          fence_regs(part);
          if (lane == 0) mbar_arrive(&empty[ps.stage]);
          promote(acc1, part, sa, sb, w1, w1);
          ps.advance();
        }
      } else {
        // columns 0–63 (gate / down) and 64–127 (up)
        const float* sw_lo = sw + int64_t(kGateUp ? (n * (kBN / 2)) / 128 : n) * w_ld;
        const float* sw_hi = kGateUp ? sw + int64_t((Ig + n * (kBN / 2)) / 128) * w_ld : sw_lo;
        // A scales of one stage: kBK / kP per row (down: a float2, gate/up: one float, .y unused).
        auto stage_scales = [&](const float* sa, int kb) {
          if constexpr (kP == kBK) return make_float2(sa[kb], 0.f);
          else return *reinterpret_cast<const float2*>(sa + 2 * kb);
        };
        float2 na = stage_scales(sa_a, 0), nb = stage_scales(sa_b, 0);
        float nlo = __ldg(sw_lo), nhi = __ldg(sw_hi);
        for (int kb = 0; kb < num_k; ++kb) {
          const float2 ca = na, cb = nb;
          const float clo = nlo, chi = nhi;
          if (kb + 1 < num_k) {  // the next stage's scales, in flight during this stage's MMAs
            na = stage_scales(sa_a, kb + 1), nb = stage_scales(sa_b, kb + 1);
            nlo = __ldg(sw_lo + kb + 1), nhi = __ldg(sw_hi + kb + 1);
          }
          mbar_wait(&full[ps.stage], ps.phase);
          const uint64_t da = smem_desc_sw128(tiles_a + ps.stage * kTileA + half * (64 * 128));
          const uint64_t db = smem_desc_sw128(tiles_b + ps.stage * kTileB);
#pragma unroll
          for (int h = 0; h < kBK / kP; ++h) {
            issue_block<kP>(part, da, db, h);
            wgmma_wait<0>();
            fence_regs(part);
            if (h == kBK / kP - 1 && lane == 0) mbar_arrive(&empty[ps.stage]);
            promote(acc, part, h == 0 ? ca.x : ca.y, h == 0 ? cb.x : cb.y, clo, chi);
          }
          ps.advance();
        }
      }

      const int c0 = 2 * (lane % 4);
      if constexpr (kGateUp) {
        // Wide: acc holds the gate columns and acc1 the matching up columns, a row's 128 act values in one quad of
        // lanes (32 each), one 1 × 128 scale block. N = 128: columns 0–63 are gate, 64–127 the matching up
        // (acc[4j + e] pairs with acc[4(j + 8) + e]), a row's 64 act values in one quad (16 each).
        act_epilogue<kBN / 16, S::kActBlock>(p, acc, kWide ? acc1 : acc + 32, r0, row_a, row_b, nrows, n * (kBN / 2),
                                             c0, lane);
      } else {
        float* y0 = row_a < nrows ? p.y + int64_t(p.row_slot[r0 + row_a]) * p.H + n * kBN + c0 : nullptr;
        float* y1 = row_b < nrows ? p.y + int64_t(p.row_slot[r0 + row_b]) * p.H + n * kBN + c0 : nullptr;
        store_y_half(y0, y1, acc);
        if constexpr (kWide) store_y_half(y0 ? y0 + 128 : nullptr, y1 ? y1 + 128 : nullptr, acc1);
      }
    }
  }
}

// One warp per grouped row of f16 x; lane l converts 8 values (16 bytes) per 256-wide step, a 128-block is 16 lanes:
// its amax is four shuffles away. Codes as e4m3_quantize (the CPU twin's rne_e4m3(v / scale)).
__global__ void __launch_bounds__(256) gather_quant_rows_kernel(const uint16_t* __restrict__ xb, int H,
                                                                const int32_t* __restrict__ row_tok,
                                                                const int32_t* __restrict__ offsets, int E,
                                                                uint8_t* __restrict__ xq, float* __restrict__ xs) {
  const int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (r >= offsets[E + 1]) return;
  const int lane = threadIdx.x % 32;
  const uint16_t* src = xb + int64_t(row_tok[r]) * H;
  for (int c0 = 0; c0 < H; c0 += 256) {  // every lane takes every step (the shuffles need the whole warp)
    const int c = c0 + lane * 8;
    const bool in = c < H;  // H % 128 == 0: a 128-block's 16 lanes are all in or all out
    const uint4 raw = in ? *reinterpret_cast<const uint4*>(src + c) : make_uint4(0, 0, 0, 0);
    const uint32_t wds[4] = {raw.x, raw.y, raw.z, raw.w};
    float v[8];
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&wds[i]));
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
      m = fmaxf(m, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
    }
#pragma unroll
    for (int o = 1; o <= 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float sc = act_scale(m);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo |= uint32_t(e4m3_quantize(v[i], sc)) << (8 * i);
      hi |= uint32_t(e4m3_quantize(v[4 + i], sc)) << (8 * i);
    }
    if (!in) continue;
    *reinterpret_cast<uint2*>(xq + r * H + c) = make_uint2(lo, hi);
    if (lane % 16 == 0) xs[r * (H / kQx) + c / kQx] = sc;
  }
}

template <bool kGateUp, bool kWide>
void launch(const CUtensorMap& ma, const CUtensorMap& mw, const CUtensorMap& mws, const Fp8Params& p,
            int64_t cap_tiles, cudaStream_t s) {
  constexpr size_t kSmem = Tiles<kWide>::kSmem;
  static const bool configured = [] {
    M3_CUDA_CHECK(cudaFuncSetAttribute(moe_wgmma_fp8_kernel<kGateUp, kWide>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  (void)configured;
  const int64_t work = std::max<int64_t>(1, cap_tiles * p.NN);
  moe_wgmma_fp8_kernel<kGateUp, kWide>
      <<<unsigned(std::min<int64_t>(work, sm_count())), kThreads, kSmem, s>>>(ma, mw, mws, p);
  M3_CUDA_LAUNCH_CHECK();
}

Fp8Params params_of(const MoeWgmmaRouting& rt, int64_t H, int64_t I, int64_t Is, int NN) {
  Fp8Params p{};
  p.offsets = rt.offsets, p.row_slot = rt.row_slot, p.tiles = rt.tiles, p.counters = rt.counters;
  p.E = rt.E, p.H = int(H), p.I = int(I), p.Is = int(Is), p.NN = NN, p.cap_rows = int(rt.cap_rows);
  return p;
}

}  // namespace

bool moe_wgmma_fp8_supported(int64_t H, int64_t I, int64_t Is, bool wide) {
  return H > 0 && H % (wide ? 2 * kBK : kBK) == 0 && I > 0 && I % kBK == 0 && Is >= 0 && Is % kBK == 0 &&
         H < (int64_t(1) << 20) && I < (int64_t(1) << 20) && Is < (int64_t(1) << 20);
}

void moe_gather_quant_rows(const void* xb_f16, int64_t H, const MoeWgmmaRouting& rt, uint8_t* xq, float* xs,
                           cudaStream_t s) {
  M3_CUDA_REQUIRE(H > 0 && H % kQx == 0, "moe_gather_quant_rows: H %lld is not a multiple of %d", (long long)H, kQx);
  if (rt.cap_rows <= 0) return;
  gather_quant_rows_kernel<<<unsigned((rt.cap_rows + 7) / 8), 256, 0, s>>>(
      static_cast<const uint16_t*>(xb_f16), int(H), rt.row_tok, rt.offsets, rt.E, xq, xs);
  M3_CUDA_LAUNCH_CHECK();
}

void moe_gate_up_wgmma_fp8(const uint8_t* xq, const float* xs, int64_t H, const MoeWgmmaFp8Weights& gate_up, int64_t I,
                           int64_t Is, float alpha, float limit, const MoeWgmmaRouting& rt, uint8_t* act_q,
                           float* act_s, int64_t ld_act, cudaStream_t s, bool wide) {
  const bool shared = gate_up.shared != nullptr && Is > 0;
  M3_CUDA_REQUIRE(moe_wgmma_fp8_supported(H, I, shared ? Is : 0, wide) && ld_act >= std::max(I, shared ? Is : 0) &&
                      ld_act % kBK == 0 && gate_up.w && gate_up.scales && (!shared || gate_up.shared_scales),
                  "moe_gate_up_wgmma_fp8: unsupported widths H %lld, I %lld, shared I %lld (or missing scales)",
                  (long long)H, (long long)I, (long long)Is);
  if (rt.cap_rows <= 0 || rt.cap_tiles <= 0) return;
  const CUtensorMap ma = make_tma_map_2d(xq, TmaDtype::U8, uint64_t(rt.cap_rows), uint64_t(H), uint64_t(H), kBM, kBK,
                                         TmaSwizzle::B128);
  const int half_n = (wide ? Tiles<true>::kBN : Tiles<false>::kBN) / 2;  // gate (and up) rows per tile
  const CUtensorMap mw = make_tma_map_2d(gate_up.w, TmaDtype::U8, uint64_t(rt.E) * 2 * uint64_t(I), uint64_t(H),
                                         uint64_t(H), half_n, kBK, TmaSwizzle::B128);
  const CUtensorMap mws = shared ? make_tma_map_2d(gate_up.shared, TmaDtype::U8, 2 * uint64_t(Is), uint64_t(H),
                                                   uint64_t(H), half_n, kBK, TmaSwizzle::B128)
                                 : mw;
  const int64_t Imax = std::max(I, shared ? Is : 0);
  Fp8Params p = params_of(rt, H, I, shared ? Is : 0, int(Imax / half_n));
  p.queue = moe_wgmma::work_counter(rt.counters, 0);
  p.a_scales = xs, p.a_scale_ld = int(H / kQx);
  p.w_scales = gate_up.scales, p.ws_scales = shared ? gate_up.shared_scales : gate_up.scales;
  p.w_scale_stride = fp8_scale_count(Fp8Scale::Blk128, 2 * I, H);
  p.act_q = act_q, p.act_s = act_s, p.ld_act = ld_act, p.alpha = alpha, p.limit = limit;
  if (wide)
    launch<true, true>(ma, mw, mws, p, rt.cap_tiles, s);
  else
    launch<true, false>(ma, mw, mws, p, rt.cap_tiles, s);
}

void moe_down_wgmma_fp8(const uint8_t* act_q, const float* act_s, int64_t ld_act, const MoeWgmmaFp8Weights& down,
                        int64_t H, int64_t I, int64_t Is, const MoeWgmmaRouting& rt, float* y, cudaStream_t s,
                        bool wide) {
  const bool shared = down.shared != nullptr && Is > 0;
  M3_CUDA_REQUIRE(moe_wgmma_fp8_supported(H, I, shared ? Is : 0, wide) && ld_act >= std::max(I, shared ? Is : 0) &&
                      ld_act % kBK == 0 && down.w && down.scales && (!shared || down.shared_scales),
                  "moe_down_wgmma_fp8: unsupported widths H %lld, I %lld, shared I %lld, ld %lld (or missing scales)",
                  (long long)H, (long long)I, (long long)Is, (long long)ld_act);
  if (rt.cap_rows <= 0 || rt.cap_tiles <= 0) return;
  const CUtensorMap ma = make_tma_map_2d(act_q, TmaDtype::U8, uint64_t(rt.cap_rows), uint64_t(ld_act),
                                         uint64_t(ld_act), kBM, kBK, TmaSwizzle::B128);
  // B boxes of 128 weight rows (output columns): one per N = 128 tile, two per wide tile.
  const CUtensorMap mw = make_tma_map_2d(down.w, TmaDtype::U8, uint64_t(rt.E) * uint64_t(H), uint64_t(I), uint64_t(I),
                                         128, kBK, TmaSwizzle::B128);
  const CUtensorMap mws = shared ? make_tma_map_2d(down.shared, TmaDtype::U8, uint64_t(H), uint64_t(Is), uint64_t(Is),
                                                   128, kBK, TmaSwizzle::B128)
                                 : mw;
  Fp8Params p = params_of(rt, H, I, shared ? Is : 0, int(H / (wide ? Tiles<true>::kBN : Tiles<false>::kBN)));
  p.queue = moe_wgmma::work_counter(rt.counters, 1);
  p.a_scales = act_s, p.a_scale_ld = int(ld_act / (wide ? Tiles<true>::kActBlock : Tiles<false>::kActBlock));
  p.w_scales = down.scales, p.ws_scales = shared ? down.shared_scales : down.scales;
  p.w_scale_stride = fp8_scale_count(Fp8Scale::Blk128, H, I);
  p.y = y;
  if (wide)
    launch<false, true>(ma, mw, mws, p, rt.cap_tiles, s);
  else
    launch<false, false>(ma, mw, mws, p, rt.cap_tiles, s);
}

}  // namespace m3::cuda
