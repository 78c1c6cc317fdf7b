#include "backend/cuda/paged_decode_tc.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <cooperative_groups.h>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/warp_mma.cuh"

namespace cg = cooperative_groups;

namespace m3::cuda {

namespace {

constexpr int D = PagedDecodeTc::kHeadDim, PAGE = PagedDecodeTc::kPage;
constexpr int CH = 64;  // tokens per pipeline stage (half a page): 16 per warp
constexpr int kWarps = 4, kThreads = 32 * kWarps;
// The pipeline of one element type: a stage holds the K then the V tile of one chunk ([64, 128]: 16 KiB each in
// bf16, 8 KiB in e4m3). Two shapes, chosen in plan(): wide (2 CTAs per SM) and deep (1 CTA per SM). bf16: 3 stages
// (100 KiB, 2 chunks in flight per CTA) and 6 (196 KiB, 5 in flight). e4m3 keeps about the same bytes in flight
// with twice the chunks: 5 stages (84 KiB, 4 in flight) and 12 (196 KiB, 11 in flight).
template <typename KvT>
struct Pipe {
  static constexpr int kTileBytes = CH * D * int(sizeof(KvT));
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kWideStages = sizeof(KvT) == 2 ? 3 : 5, kDeepStages = sizeof(KvT) == 2 ? 6 : 12;
  // The pair loop (paged_decode_tc_kernel's kPair) consumes two stages per iteration and keeps stages − 2 chunks in
  // flight: e4m3 6 wide stages (100 KiB, 4 in flight as above) and the same 12 deep; bf16 deep only, the same 6
  // stages (4 in flight instead of 5; its wide ring has no room for a fourth 32 KiB stage).
  static constexpr int kWidePairStages = 6, kDeepPairStages = sizeof(KvT) == 2 ? 6 : 12;
  __host__ __device__ static constexpr int stages(bool deep, bool pair) {
    return pair ? (deep ? kDeepPairStages : kWidePairStages) : (deep ? kDeepStages : kWideStages);
  }
  // q [16, 128] bf16 sits after the ring.
  __host__ __device__ static constexpr int q_off(int stages) { return stages * kStageBytes; }
  __host__ __device__ static constexpr int smem_bytes(int stages) { return q_off(stages) + 16 * D * 2; }
};
constexpr int kMaxSplits = 16;       // one cluster: 8 is portable, 16 the non-portable maximum on Hopper
constexpr int kPortableSplits = 8;
constexpr int kPartOff = 40 * 1024;  // the split partial, after the cross-warp merge area
constexpr float kLog2e = 1.4426950408889634f;
static_assert(4 * 16 * (D + 8) * 4 + 2 * 4 * 16 * 4 <= kPartOff &&
                  kPartOff + (16 * D + 16) * 4 <= Pipe<__nv_bfloat16>::q_off(Pipe<__nv_bfloat16>::kWideStages) &&
                  kPartOff + (16 * D + 16) * 4 <= Pipe<e4m3_t>::q_off(Pipe<e4m3_t>::kWideStages),
              "the cross-warp and split merges reuse the ring");
static_assert(Pipe<e4m3_t>::smem_bytes(Pipe<e4m3_t>::kDeepStages) <=
                      Pipe<__nv_bfloat16>::smem_bytes(Pipe<__nv_bfloat16>::kDeepStages) &&
                  Pipe<e4m3_t>::smem_bytes(Pipe<e4m3_t>::kWideStages) <=
                      Pipe<__nv_bfloat16>::smem_bytes(Pipe<__nv_bfloat16>::kWideStages) &&
                  Pipe<e4m3_t>::smem_bytes(Pipe<e4m3_t>::kWidePairStages) <=
                      Pipe<__nv_bfloat16>::smem_bytes(Pipe<__nv_bfloat16>::kWideStages) &&
                  Pipe<e4m3_t>::smem_bytes(Pipe<e4m3_t>::kDeepPairStages) <=
                      Pipe<__nv_bfloat16>::smem_bytes(Pipe<__nv_bfloat16>::kDeepStages),
              "e4m3 pipelines fit wherever the bf16 ones do (max_active_clusters measures the bf16 kernel)");

// ---- pieces both schedules share ---------------------------------------------------------------------------------

// Stage one chunk ([64, 128] of K and of V at element offset `off`; rows ≥ valid zero-filled) into ks / ks + tile.
template <typename KvT>
__device__ __forceinline__ void load_tile(const PagedDecodeTcArgs<KvT>& a, int64_t off, int valid, uint32_t ks,
                                          int tid) {
  const uint32_t vs = ks + Pipe<KvT>::kTileBytes;
  if constexpr (sizeof(KvT) == 1) {
#pragma unroll
    for (int i = 0; i < CH * 8 / kThreads; ++i) {
      const int idx = tid + i * kThreads, row = idx >> 3, ch = idx & 7;
      const bool ok = row < valid;
      const int64_t src = off + int64_t(ok ? row : 0) * a.stride_tok + ch * 16;
      cp_async16(ks + swz64(row, ch), a.k + src, ok ? 16 : 0);
      cp_async16(vs + swz64(row, ch), a.v + src, ok ? 16 : 0);
    }
  } else {
#pragma unroll
    for (int i = 0; i < CH * 16 / kThreads; ++i) {
      const int idx = tid + i * kThreads, row = idx >> 4, ch = idx & 15;
      const bool ok = row < valid;
      const int64_t src = off + int64_t(ok ? row : 0) * a.stride_tok + ch * 8;
      cp_async16(ks + swz128(row, ch), a.k + src, ok ? 16 : 0);
      cp_async16(vs + swz128(row, ch), a.v + src, ok ? 16 : 0);
    }
  }
}

// e4m3 route, S = Q·Kᵀ of the warp's 16 tokens of one staged K tile (n-tile j: tokens warp·16 + 8j + (0..7)) into
// s0 / s1 (accumulated: zero them first).
__device__ __forceinline__ void scores_e4m3(uint32_t ks, const uint32_t (&qf)[8][4], int warp, int lane,
                                            float (&s0)[4], float (&s1)[4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // chunks 4h..4h+3 = k-steps 4h..4h+3
      uint32_t w[4];
      ldmatrix_x4(ks + swz64(warp * 16 + 8 * j + (lane & 7), 4 * h + (lane >> 3)), w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int m = 0; m < 4; ++m)
        mma_f16_16816(j ? s1 : s0, qf[4 * h + m], e4m3x2_to_f16x2<false>(w[m]), e4m3x2_to_f16x2<true>(w[m]));
    }
}

// e4m3 route, O += P·V for the warp's 16 tokens of one staged V tile (pa: P's A fragment, f16).
__device__ __forceinline__ void pv_e4m3(uint32_t vs, const uint32_t (&pa)[4], int warp, int lane,
                                        float (&o)[16][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // chunks 2i, 2i + 1; matrices (tokens 0–7 | 8–15) × chunk
    uint32_t w[4];
    ldmatrix_x4_trans(vs + swz64(warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * i + (lane >> 4)), w[0], w[1],
                      w[2], w[3]);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int ch = 2 * i + q;
      // Bytes (0, 2) | (1, 3) of each word into the two halves, then one cvt per pair.
      const uint32_t x = __byte_perm(w[2 * q], 0, 0x3120), y = __byte_perm(w[2 * q + 1], 0, 0x3120);
      mma_f16_16816(o[2 * ch], pa, e4m3x2_to_f16x2<false>(x), e4m3x2_to_f16x2<false>(y));
      mma_f16_16816(o[2 * ch + 1], pa, e4m3x2_to_f16x2<true>(x), e4m3x2_to_f16x2<true>(y));
    }
  }
}

// bf16, S = Q·Kᵀ of the warp's 16 tokens of one staged K tile into s0 / s1 (accumulated).
__device__ __forceinline__ void scores_bf16(uint32_t ks, const uint32_t (&qf)[8][4], int warp, int lane,
                                            float (&s0)[4], float (&s1)[4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    uint32_t b0, b1, b2, b3;
    ldmatrix_x4(ks + swz128(warp * 16 + ((lane >> 4) << 3) + (lane & 7), 2 * kk + ((lane >> 3) & 1)), b0, b1, b2,
                b3);
    mma_bf16_16816(s0, qf[kk], b0, b1);
    mma_bf16_16816(s1, qf[kk], b2, b3);
  }
}

// bf16, O += P·V for the warp's 16 tokens of one staged V tile (pa: P's A fragment, bf16).
__device__ __forceinline__ void pv_bf16(uint32_t vs, const uint32_t (&pa)[4], int warp, int lane,
                                        float (&o)[16][4]) {
#pragma unroll
  for (int nd = 0; nd < 8; ++nd) {
    uint32_t v0, v1, v2, v3;
    ldmatrix_x4_trans(vs + swz128(warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * nd + (lane >> 4)), v0, v1,
                      v2, v3);
    mma_bf16_16816(o[2 * nd], pa, v0, v1);
    mma_bf16_16816(o[2 * nd + 1], pa, v2, v3);
  }
}

// Two staged chunks folded at once (the kPair loop): S of both (4 independent accumulator chains instead of 2: the
// chains of dependent mma.sync are the critical path at 1–2 warps per scheduler), one online-softmax step over the
// warp's 32 tokens (one max exchange, one O rescale), then P·V of both. valid0 / valid1 as fold_chunk's valid; ≤ 0
// for an absent chunk, whose stage was zero-filled (so P·V adds 0 · 0).
template <bool kFp8>
__device__ __forceinline__ void fold_pair(uint32_t ks0, uint32_t ks1, const uint32_t (&qf)[8][4], int valid0,
                                          int valid1, float sl2, int warp, int lane, float& m0, float& m1, float& l0,
                                          float& l1, float (&o)[16][4]) {
  constexpr int kTile = kFp8 ? Pipe<e4m3_t>::kTileBytes : Pipe<__nv_bfloat16>::kTileBytes;
  float sc[4][4] = {};
  if constexpr (kFp8) {
    scores_e4m3(ks0, qf, warp, lane, sc[0], sc[1]);
    scores_e4m3(ks1, qf, warp, lane, sc[2], sc[3]);
  } else {
    scores_bf16(ks0, qf, warp, lane, sc[0], sc[1]);
    scores_bf16(ks1, qf, warp, lane, sc[2], sc[3]);
  }
  const int tb = warp * 16 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (tb + 8 * (j & 1) + (e & 1) >= (j < 2 ? valid0 : valid1)) sc[j][e] = -INFINITY;
  online_softmax_step(sc, 0, 0x7fffffff, sl2, m0, m1, l0, l1, o);  // masked above (−inf · sl2 stays −inf)
  const auto pack = [](float lo, float hi) { return kFp8 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi); };
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const uint32_t pa[4] = {pack(sc[2 * p][0], sc[2 * p][1]), pack(sc[2 * p][2], sc[2 * p][3]),
                            pack(sc[2 * p + 1][0], sc[2 * p + 1][1]), pack(sc[2 * p + 1][2], sc[2 * p + 1][3])};
    if constexpr (kFp8)
      pv_e4m3((p ? ks1 : ks0) + kTile, pa, warp, lane, o);
    else
      pv_bf16((p ? ks1 : ks0) + kTile, pa, warp, lane, o);
  }
}

// Fold one staged chunk into the warp's (m, l, O): tokens warp·16 .. +15 of the chunk, those ≥ valid masked.
template <bool kFp8>
__device__ __forceinline__ void fold_chunk(uint32_t ks, uint32_t vs, const uint32_t (&qf)[8][4], int valid,
                                           float sl2, int warp, int lane, float& m0, float& m1, float& l0, float& l1,
                                           float (&o)[16][4]) {
  float sc[2][4] = {};
  if constexpr (kFp8) {
    scores_e4m3(ks, qf, warp, lane, sc[0], sc[1]);
  } else {
    scores_bf16(ks, qf, warp, lane, sc[0], sc[1]);
  }
  online_softmax_step(sc, warp * 16 + 2 * (lane & 3), valid, sl2, m0, m1, l0, l1, o);
  // P as the A operand: f16 on the e4m3 route (its B operand, V, is f16), bf16 otherwise.
  const auto pack = [](float lo, float hi) { return kFp8 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi); };
  const uint32_t pa[4] = {pack(sc[0][0], sc[0][1]), pack(sc[0][2], sc[0][3]), pack(sc[1][0], sc[1][1]),
                          pack(sc[1][2], sc[1][3])};
  if constexpr (kFp8)
    pv_e4m3(vs, pa, warp, lane, o);
  else
    pv_bf16(vs, pa, warp, lane, o);
}

// Merge the 4 warps' (m, l, O) of one request segment through shared memory, kPass dims at a time (area: [4 warps]
// [16 rows][kPass + pad] fp32, then mw [64], lw [64]); thread tid gets row tid / 8 and kPass / 8 consecutive dims
// per pass: emit(row, d0, acc, M, L) with acc = O / L (0 where L = 0; e4m3: × v_scale) and the row's (M, L) in the
// log2 domain. kPass = 128: one pass (the cluster schedule, area = the drained ring); 32: four passes in 10 KiB
// beside a ring that keeps streaming (the balanced schedule). Ends with the area free (after a barrier).
template <bool kFp8, int kPass, typename Emit>
__device__ __forceinline__ void merge_warps(float* area, float (&o)[16][4], float m0, float m1, float l0, float l1,
                                            float v_scale, int tid, Emit&& emit) {
  // + 8 floats: the float2 stores of a warp's 8 rows g hit distinct banks, and the reads below conflict 8-way, not
  // 16-way (an unpadded 128-float row put every row in the same banks: the merge took 1.8 µs at B = 8, now 1.3).
  constexpr int kStride = kPass + 8;
  constexpr int kPer = kPass / 8;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2;
  float* mw = area + 4 * 16 * kStride;  // [4][16]
  float* lw = mw + 4 * 16;              // [4][16]
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if ((lane & 3) == 0) {
    mw[warp * 16 + g] = m0, mw[warp * 16 + g + 8] = m1;
    lw[warp * 16 + g] = l0, lw[warp * 16 + g + 8] = l1;
  }
  const int row = tid >> 3, dl = (tid & 7) * kPer;
  float M = -INFINITY, L = 0.f, f[4], inv = 0.f;
#pragma unroll
  for (int p = 0; p < 128 / kPass; ++p) {
    if (p > 0) __syncthreads();  // the previous pass's reads are done
    if constexpr (kFp8) {  // o[2·ch + q] column 2c + e is dim 16·ch + 4c + 2e + q
#pragma unroll
      for (int ch = p * kPass / 16; ch < (p + 1) * kPass / 16; ++ch) {
        const int d = ch * 16 + 4 * (lane & 3) - p * kPass;
        *reinterpret_cast<float4*>(area + (warp * 16 + g) * kStride + d) =
            make_float4(o[2 * ch][0], o[2 * ch + 1][0], o[2 * ch][1], o[2 * ch + 1][1]);
        *reinterpret_cast<float4*>(area + (warp * 16 + g + 8) * kStride + d) =
            make_float4(o[2 * ch][2], o[2 * ch + 1][2], o[2 * ch][3], o[2 * ch + 1][3]);
      }
    } else {
#pragma unroll
      for (int n = p * kPass / 8; n < (p + 1) * kPass / 8; ++n) {
        const int d = n * 8 + 2 * (lane & 3) - p * kPass;
        *reinterpret_cast<float2*>(area + (warp * 16 + g) * kStride + d) = make_float2(o[n][0], o[n][1]);
        *reinterpret_cast<float2*>(area + (warp * 16 + g + 8) * kStride + d) = make_float2(o[n][2], o[n][3]);
      }
    }
    __syncthreads();
    if (p == 0) {
#pragma unroll
      for (int w = 0; w < 4; ++w) M = fmaxf(M, mw[w * 16 + row]);
#pragma unroll
      for (int w = 0; w < 4; ++w) f[w] = M == -INFINITY ? 0.f : exp2f(mw[w * 16 + row] - M), L += f[w] * lw[w * 16 + row];
      inv = L > 0.f ? (kFp8 ? v_scale / L : 1.f / L) : 0.f;
    }
    float acc[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) s += f[w] * area[(w * 16 + row) * kStride + dl + i];
      acc[i] = s * inv;
    }
    emit(row, p * kPass + dl, acc, M, L);
  }
  __syncthreads();
}

// grid (R, splits), 128 threads. The 16 query rows of request r (rows ≥ G are zero) are the M of every mma; a chunk
// of 64 tokens is split over the 4 warps (16 tokens each): S = Q·Kᵀ (2 n-tiles × 8 k-steps), online softmax in
// registers (log2 domain, fp32), O += P·V (P re-packed from the S accumulators as the A operand, V through
// ldmatrix.trans). Each warp keeps its own (m, l, O[16, 128]); the warps are merged through shared memory at the end.
// Split `split` owns chunks [split·per, split·per + per) of the request's token range; rows past the last valid
// token are zero-filled by cp.async and masked to −inf.
// e4m3 K/V (kFp8): the chunk lands as e4m3 (half the bytes) in 128-byte rows (swz64); the codes become exact f16
// in registers after ldmatrix (one cvt.rn.f16x2.e4m3x2 per pair, kv_fp8.cuh) and the mma.sync multiplies f16: q is
// rounded bf16 → f16 once (exact in f16's normal range, saturating beyond ±65504) and P is packed as f16 (finer than
// bf16 in [2^-14, 1]). (Until 2026-12-03e the codes became bf16 — four to five instructions a pair — and the e4m3
// kernel was issue-bound: 49 µs at B = 64 against a 32 µs read floor.) The mma's k order is free, so
//  - S: ldmatrix of K rows gives each lane 4 consecutive dims 16·kk + 4·(lane%4) .. +3 of one token (= the b0, b1
//    pair of k-step kk), and Q's A fragment is read from shared memory in that same dim order;
//  - O += P·V: ldmatrix.trans of V (16-bit words = dim pairs) gives each lane tokens (2·(lane%4), +1) × dims
//    (2g, 2g+1) of a 16-dim chunk; bytes (0, 2) are the b operand of dim 2g, bytes (1, 3) of dim 2g + 1, so chunk
//    ch feeds two n-tiles (even dims → o[2·ch], odd → o[2·ch + 1]) and the epilogue puts the dims back in order.
// k_scale folds into the softmax scale, v_scale into the final normalisation.
// Where a CTA's time goes (bench_decode --trace): slot 0 entry, 1 page list read (after the PDL wait and indptr),
// 2 first chunk landed, 3 last chunk folded into O, 4 the 4 warps merged, 5 the cluster's splits synced (their
// partials readable), 6 this CTA's rows of the split merge stored, 7 exit (after the last cluster barrier). Without
// splits 4–7 are one moment; the balanced schedule stamps 4–6 before its finishing merge and 7 after it. One
// predicated store each when on.
template <typename KvT>
__device__ __forceinline__ void trace_stamp(const PagedDecodeTcArgs<KvT>& a, int slot) {
  if (a.trace != nullptr && threadIdx.x == 0) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    a.trace[(size_t(blockIdx.y) * gridDim.x + blockIdx.x) * PagedDecodeTc::kTraceSlots + slot] = t;
  }
}

// kPair (e4m3, and bf16 in the deep shape where its stages fit): the loop folds two chunks per iteration
// (fold_pair) from a ring of Pipe::stages(kDeep, true) with stages − 2 chunks in flight; a split's odd last chunk is
// paired with a zero-filled stage.
template <typename KvT, bool kDeep, bool kPair = false>
__global__ void __launch_bounds__(kThreads, kDeep ? 1 : 2)
    paged_decode_tc_kernel(PagedDecodeTcArgs<KvT> a, int splits, int per) {
  using P = Pipe<KvT>;
  constexpr bool kFp8 = sizeof(KvT) == 1;
  static_assert(!kPair || kFp8 || kDeep, "bf16 pairs fit the deep ring only");
  constexpr int kStages = P::stages(kDeep, kPair);
  constexpr int kAhead = kPair ? kStages - 2 : kStages - 1;  // chunks the prologue issues
  constexpr int kQOff = P::q_off(kStages);
  constexpr int kStageBytes = P::kStageBytes, kTileBytes = P::kTileBytes;
  static_assert(sizeof(KvT) == 2 || sizeof(KvT) == 1, "bf16 or e4m3 K/V elements");
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_addr(smem);
  const int r = blockIdx.x, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  trace_stamp(a, 0);
  pdl_launch_dependents();
  pdl_wait();  // q and the page list come from the previous kernels
  const int beg = a.indptr[r], npages = a.indptr[r + 1] - beg;
  const int ntok = npages > 0 ? (npages - 1) * PAGE + a.last_len[r] : 0;
  if (a.trace != nullptr && ntok != 0x7fffffff) trace_stamp(a, 1);  // branches on the loaded value: after the load
  const int nchunks = (ntok + CH - 1) / CH;
  if (per <= 0) per = (nchunks + splits - 1) / splits;  // dynamic plan: the request's own chunks cut evenly
  const int c0 = min(nchunks, split * per), c1 = min(nchunks, c0 + per);

  // Page ids: the prologue's are read together; in the loop, the id of the next chunk to load is read one iteration
  // ahead (a register), so no load waits on an L2 round trip for its page id in the steady state.
  // (A chunk past the split's range — the pair loop's odd end — is staged as zeros: valid 0, page 0, no read.)
  auto load_chunk = [&](int c, int stage, int32_t vp) {
    load_tile(a, int64_t(vp) * a.stride_page + int64_t((c & 1) * CH) * a.stride_tok,
              c < c1 ? min(CH, ntok - c * CH) : 0, sbase + stage * kStageBytes, tid);
  };
  auto page_of = [&](int c) { return c < c1 ? a.indices[beg + (c >> 1)] : 0; };
  const int c1e = kPair ? c0 + ((c1 - c0 + 1) & ~1) : c1;  // the pair loop's end: c1 rounded up to a whole pair
  int32_t pv[kAhead];
#pragma unroll
  for (int s = 0; s < kAhead; ++s) pv[s] = page_of(c0 + s);
  // q [16, 128] joins the first commit group (rows ≥ G zero-filled), so the first loads are issued at once.
  for (int i = tid; i < 16 * 16; i += kThreads) {
    const int row = i >> 4, ch = i & 15;
    cp_async16(sbase + kQOff + swz128(row, ch), a.q + (int64_t(r) * a.G + min(row, a.G - 1)) * D + ch * 8,
               row < a.G ? 16 : 0);
  }
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (c0 + s < c1e) load_chunk(c0 + s, s, pv[s]);
    cp_async_commit();
  }
  int32_t next_vp = page_of(c0 + kAhead), next_vp1 = kPair ? page_of(c0 + kAhead + 1) : 0;
  cp_async_wait<kAhead - 1>();
  __syncthreads();  // q staged
  uint32_t qf[8][4];
  if constexpr (kFp8) {
    // k-step kk, lane (g, c = lane % 4): rows g / g + 8, dims 16·kk + 4c + {0, 1} (a0, a1) and + {2, 3} (a2, a3).
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t in_chunk = (c & 1) * 8;
      const uint8_t* q0 = smem + kQOff + swz128(g, 2 * kk + (c >> 1)) + in_chunk;
      const uint8_t* q1 = smem + kQOff + swz128(g + 8, 2 * kk + (c >> 1)) + in_chunk;
      qf[kk][0] = bf16x2_to_f16x2<true>(*reinterpret_cast<const uint32_t*>(q0));
      qf[kk][1] = bf16x2_to_f16x2<true>(*reinterpret_cast<const uint32_t*>(q1));
      qf[kk][2] = bf16x2_to_f16x2<true>(*reinterpret_cast<const uint32_t*>(q0 + 4));
      qf[kk][3] = bf16x2_to_f16x2<true>(*reinterpret_cast<const uint32_t*>(q1 + 4));
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      ldmatrix_x4(sbase + kQOff + swz128((lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)), qf[kk][0],
                  qf[kk][1], qf[kk][2], qf[kk][3]);
  }

  const float sl2 = kFp8 ? a.scale * a.k_scale * kLog2e : a.scale * kLog2e;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g = lane/4 and g + 8
  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  if constexpr (kPair) {
    for (int c = c0; c < c1; c += 2) {
      cp_async_wait<kAhead - 2>();
      __syncthreads();  // chunks c, c + 1 landed; the two stages refilled below were consumed last iteration
      if (c == c0) trace_stamp(a, 2);
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        if (const int cl = c + kAhead + t; cl < c1e) load_chunk(cl, (cl - c0) % kStages, t ? next_vp1 : next_vp);
        cp_async_commit();
      }
      next_vp = page_of(c + kAhead + 2), next_vp1 = page_of(c + kAhead + 3);
      const uint32_t k0 = sbase + ((c - c0) % kStages) * kStageBytes;
      const uint32_t k1 = sbase + ((c + 1 - c0) % kStages) * kStageBytes;
      fold_pair<kFp8>(k0, k1, qf, ntok - c * CH, c + 1 < c1 ? ntok - (c + 1) * CH : 0, sl2, warp, lane, m0, m1, l0,
                     l1, o);
    }
  } else {
    for (int c = c0; c < c1; ++c) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // chunk c landed for every thread; the stage refilled below was consumed last iteration
      if (c == c0) trace_stamp(a, 2);
      if (const int cl = c + kStages - 1; cl < c1) {
        load_chunk(cl, (cl - c0) % kStages, next_vp);
        if (cl + 1 < c1) next_vp = a.indices[beg + ((cl + 1) >> 1)];
      }
      cp_async_commit();
      const uint32_t ks = sbase + ((c - c0) % kStages) * kStageBytes;
      fold_chunk<kFp8>(ks, ks + kTileBytes, qf, ntok - c * CH, sl2, warp, lane, m0, m1, l0, l1, o);
    }
  }
  trace_stamp(a, 3);
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it for the cross-warp merge

  // Split-K inside a thread-block cluster (the request's splits): each CTA leaves its normalised O [16, 128] and
  // LSE (log2 domain; empty split: O = 0, LSE = −inf) in its own shared memory; after the cluster barrier CTA k
  // merges rows k, k + splits, … reading every split's partial through distributed shared memory.
  float* po = reinterpret_cast<float*>(smem + kPartOff);  // [16, 128]
  float* plse = po + 16 * D;                              // [16]
  merge_warps<kFp8, 128>(reinterpret_cast<float*>(smem), o, m0, m1, l0, l1, a.v_scale, tid,
                         [&](int row, int d0, const float* acc, float M, float L) {
                           if (splits == 1) {
                             if (row < a.G) {
                               __nv_bfloat16* dst = a.out + (int64_t(r) * a.G + row) * D + d0;
#pragma unroll
                               for (int i = 0; i < 16; i += 2)
                                 *reinterpret_cast<uint32_t*>(dst + i) = pack_bf16x2(acc[i], acc[i + 1]);
                             }
                           } else {
#pragma unroll
                             for (int i = 0; i < 16; i += 4)
                               *reinterpret_cast<float4*>(po + row * D + d0 + i) =
                                   make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
                             if ((tid & 7) == 0) plse[row] = L > 0.f ? M + log2f(L) : -INFINITY;
                           }
                         });
  trace_stamp(a, 4);
  if (splits == 1) {
    trace_stamp(a, 5), trace_stamp(a, 6), trace_stamp(a, 7);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  trace_stamp(a, 5);
  const int rank = int(cluster.block_rank());
  const float* rpo[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) rpo[s] = s < splits ? cluster.map_shared_rank(po, s) : po;
  // Row mrow's LSEs are read once per row (not per element) and each thread merges 4 consecutive dims with float4
  // loads: the remote reads of one row are independent and in flight together.
  for (int e = tid; e < 16 * (D / 4); e += kThreads) {
    const int mrow = rank + (e / (D / 4)) * splits, d = (e % (D / 4)) * 4;
    if (mrow >= a.G) break;  // e grows: later e only give larger rows
    // Every remote load (LSEs and partials) is issued before any is used: one DSMEM round trip, not two.
    float lse[kMaxSplits], mx = -INFINITY;
    float4 xs[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      lse[s] = s < splits ? rpo[s][16 * D + mrow] : -INFINITY;
      xs[s] = s < splits ? *reinterpret_cast<const float4*>(rpo[s] + mrow * D + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) mx = fmaxf(mx, lse[s]);
    float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
    float den = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < splits && mx != -INFINITY) {
        const float w = exp2f(lse[s] - mx);
        const float4 x = xs[s];
        num.x += w * x.x, num.y += w * x.y, num.z += w * x.z, num.w += w * x.w;
        den += w;
      }
    }
    const float iv = den > 0.f ? 1.f / den : 0.f;
    __nv_bfloat16* dst = a.out + (int64_t(r) * a.G + mrow) * D + d;
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16x2(num.x * iv, num.y * iv), pack_bf16x2(num.z * iv, num.w * iv));
  }
  trace_stamp(a, 6);
  cluster.sync();  // no CTA leaves while its partial may still be read
  trace_stamp(a, 7);
}

// ---- the balanced schedule -----------------------------------------------------------------------------------------
// The cluster schedule gives every (request, split) CTA the same share of one request, so a step's time is set by the
// SMs that drew two CTAs (wide, R > #SMs) or by the 4 SMs left idle (deep, R = 128 on 132), and each CTA ends with a
// merge on the critical path (bench_decode --trace: B = 64 e4m3, the median CTA's last chunk at 33.5 µs, the last
// CTA's at 43 µs; B = 8, the cluster merge 4–6 µs of 16). Here the step's chunks — request by request, in CSR order:
// chunk 2p + half of CSR page p — are one list cut into equal ranges, one per CTA of a persistent grid: CTA b takes
// [W·b/nb, W·(b+1)/nb) of the W = 2·indptr[R] chunks, whichever requests they belong to, and the ring streams across
// request boundaries without draining. A request inside one CTA's range is written directly; one cut by a range
// boundary leaves a partial (O normalised fp32 [16, 128], LSE [16]) in global scratch at slot 2b + (its first chunk
// lies before b's range start ? 1 : 0) — at most one partial per end of a range — and takes a ticket; the CTA
// completing the count merges the partials of CTAs owner(first chunk)..owner(last chunk) (owner(w) = ⌈(w+1)·nb/W⌉
// − 1) and resets the ticket for the next replay. Requests without pages get zeros.
struct BalScratch {
  float* part = nullptr;  // [2·grid][16·128 + 16]
  int* tickets = nullptr;  // [R], zero between launches
};
constexpr int kPartFloats = 16 * D + 16;
constexpr int kMaxBalR = PagedDecodeTc::kMaxBalancedRequests;
constexpr int kBalStride = 32 + 8;
template <typename KvT>
struct BalSmem {
  __host__ __device__ static constexpr int area_off(int stages) { return stages * Pipe<KvT>::kStageBytes; }
  __host__ __device__ static constexpr int ip_off(int stages) { return area_off(stages) + (4 * 16 * kBalStride + 128) * 4; }
  __host__ __device__ static constexpr int bytes(int stages) { return ip_off(stages) + (kMaxBalR + 1) * 4; }
};
static_assert(BalSmem<__nv_bfloat16>::bytes(Pipe<__nv_bfloat16>::kDeepStages) <= 227 * 1024 &&
                  2 * (BalSmem<__nv_bfloat16>::bytes(Pipe<__nv_bfloat16>::kWideStages) + 1024) <= 228 * 1024 &&
                  BalSmem<e4m3_t>::bytes(Pipe<e4m3_t>::kDeepStages) <= 227 * 1024 &&
                  2 * (BalSmem<e4m3_t>::bytes(Pipe<e4m3_t>::kWideStages) + 1024) <= 228 * 1024,
              "balanced schedule: shared memory per pipeline shape");

// The A fragments of request r's q (rows ≥ G zero) straight from global memory, in the order fold_chunk expects
// (the cluster kernel's smem route gives the same registers).
template <bool kFp8>
__device__ __forceinline__ void load_q_frag(const __nv_bfloat16* q, int G, int lane, uint32_t (&qf)[8][4]) {
  const int g = lane >> 2, c = lane & 3;
  const uint32_t* q0 = reinterpret_cast<const uint32_t*>(q + int64_t(g) * D);
  const uint32_t* q1 = reinterpret_cast<const uint32_t*>(q + int64_t(g + 8) * D);
  const bool r0 = g < G, r1 = g + 8 < G;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    // bf16: dims 16kk + 2c (a0, a1) and 16kk + 8 + 2c (a2, a3); e4m3 route: 16kk + 4c and 16kk + 4c + 2.
    const int w0 = kFp8 ? 8 * kk + 2 * c : 8 * kk + c, w2 = kFp8 ? w0 + 1 : w0 + 4;
    qf[kk][0] = r0 ? q0[w0] : 0u;
    qf[kk][1] = r1 ? q1[w0] : 0u;
    qf[kk][2] = r0 ? q0[w2] : 0u;
    qf[kk][3] = r1 ? q1[w2] : 0u;
    if constexpr (kFp8) {  // the e4m3 route multiplies f16 (fold_chunk)
#pragma unroll
      for (int i = 0; i < 4; ++i) qf[kk][i] = bf16x2_to_f16x2<true>(qf[kk][i]);
    }
  }
}

template <typename KvT, bool kDeep>
__global__ void __launch_bounds__(kThreads, kDeep ? 1 : 2)
    paged_decode_bal_kernel(PagedDecodeTcArgs<KvT> a, BalScratch bs) {
  using P = Pipe<KvT>;
  using S = BalSmem<KvT>;
  constexpr bool kFp8 = sizeof(KvT) == 1;
  constexpr int kStages = kDeep ? P::kDeepStages : P::kWideStages;
  constexpr int kStageBytes = P::kStageBytes, kTileBytes = P::kTileBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_addr(smem);
  float* area = reinterpret_cast<float*>(smem + S::area_off(kStages));
  int* s_ip = reinterpret_cast<int*>(smem + S::ip_off(kStages));
  __shared__ int s_valid[kStages], s_flag;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int R = a.R, G = a.G;
  trace_stamp(a, 0);
  pdl_launch_dependents();
  pdl_wait();  // q and the page lists come from the previous kernels
  for (int i = tid; i <= R; i += kThreads) s_ip[i] = a.indptr[i];
  __syncthreads();
  const int W = 2 * s_ip[R];
  const int nb = min(int(gridDim.x), max(W, 1)), b = blockIdx.x;  // every active CTA gets ≥ 1 chunk
  auto start = [&](int cta) { return int(int64_t(W) * cta / nb); };
  auto owner = [&](int w) { return int((int64_t(w + 1) * nb + W - 1) / W) - 1; };
  for (int r = b; r < R; r += gridDim.x)  // requests without pages: zeros (G rows × 128, 16 bytes per thread)
    if (s_ip[r] == s_ip[r + 1])
      for (int i = tid; i < G * D / 8; i += kThreads)
        *reinterpret_cast<uint4*>(a.out + int64_t(r) * G * D + i * 8) = make_uint4(0u, 0u, 0u, 0u);
  if (a.trace != nullptr && W != 0x7fffffff) trace_stamp(a, 1);
  if (b >= nb || W == 0) {
    for (int k = 2; k < PagedDecodeTc::kTraceSlots; ++k) trace_stamp(a, k);
    return;
  }
  const int w0 = start(b), w1 = start(b + 1);
  auto req_of = [&](int page) { return csr_segment_of(s_ip, R, page); };  // page < indptr[R]

  // Load side (uniform over the CTA): chunk lw of request lr; page ids and the request's last-page fill are read one
  // load ahead, so no load waits on them in the steady state.
  int lr = req_of(w0 >> 1);
  int lr_ll = a.last_len[lr];
  auto valid_of = [&](int w, int r, int ll) {
    return (w >> 1) == s_ip[r + 1] - 1 ? min(CH, max(0, ll - (w & 1) * CH)) : CH;
  };
  auto load_unit = [&](int w, int stage, int32_t vp) {
    while ((w >> 1) >= s_ip[lr + 1]) ++lr, lr_ll = a.last_len[lr];
    const int valid = valid_of(w, lr, lr_ll);
    if (tid == 0) s_valid[stage] = valid;  // read by the compute side after the barrier that follows the landing
    load_tile(a, int64_t(vp) * a.stride_page + int64_t((w & 1) * CH) * a.stride_tok, valid,
              sbase + stage * kStageBytes, tid);
  };
  int32_t pv[kStages - 1];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) pv[s] = w0 + s < w1 ? a.indices[(w0 + s) >> 1] : 0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (w0 + s < w1) load_unit(w0 + s, s, pv[s]);
    cp_async_commit();
  }
  int32_t next_vp = w0 + kStages - 1 < w1 ? a.indices[(w0 + kStages - 1) >> 1] : 0;

  // Compute side: request cr, its segment [seg0, seg1) of this range.
  int cr = req_of(w0 >> 1);
  int seg0 = w0, seg1 = min(w1, 2 * s_ip[cr + 1]);
  auto next_request = [&](int r) {  // the next request with pages after r
    ++r;
    while (s_ip[r + 1] == s_ip[r]) ++r;
    return r;
  };
  uint32_t qf[8][4], qn[8][4];
  load_q_frag<kFp8>(a.q + int64_t(cr) * G * D, G, lane, qf);
  if (seg1 < w1) load_q_frag<kFp8>(a.q + int64_t(next_request(cr)) * G * D, G, lane, qn);
  const float sl2 = kFp8 ? a.scale * a.k_scale * kLog2e : a.scale * kLog2e;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  // End of the segment [seg0, seg1) of request cr: write it, or leave a partial and merge if it completes the count.
  auto finish = [&]() {
    const int first = 2 * s_ip[cr], last = 2 * s_ip[cr + 1];  // the request's chunks [first, last)
    const bool whole = seg0 == first && seg1 == last;
    float* part = bs.part + int64_t(2 * b + (w0 < first ? 1 : 0)) * kPartFloats;
    merge_warps<kFp8, 32>(area, o, m0, m1, l0, l1, a.v_scale, tid,
                          [&](int row, int d0, const float* acc, float M, float L) {
                            if (whole) {
                              if (row < G)
                                *reinterpret_cast<uint2*>(a.out + (int64_t(cr) * G + row) * D + d0) =
                                    make_uint2(pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]));
                            } else {
                              *reinterpret_cast<float4*>(part + row * D + d0) = make_float4(acc[0], acc[1], acc[2], acc[3]);
                              if (d0 == 0) part[16 * D + row] = L > 0.f ? M + log2f(L) : -INFINITY;
                            }
                          });
    if (whole) return;
    __threadfence();  // the partial is visible device-wide before the ticket says so
    __syncthreads();
    if (tid == 0) {
      const int parts = owner(last - 1) - owner(first) + 1;
      s_flag = atomicAdd(bs.tickets + cr, 1) + 1 == parts;
    }
    __syncthreads();
    if (!s_flag) return;
    __threadfence();
    // Merge: thread tid takes row tid / 8, dims (tid % 8)·16 .. +15; first the rows' LSE max over the parts, then the
    // weighted sum (partials read from L2: __ldcg, never a stale L1 line).
    const int row = tid >> 3, d0 = (tid & 7) * 16;
    const int b0 = owner(first), b1 = owner(last - 1);
    auto slot = [&](int cta) { return bs.part + int64_t(2 * cta + (start(cta) < first ? 1 : 0)) * kPartFloats; };
    float mx = -INFINITY;
#pragma unroll 8
    for (int c = b0; c <= b1; ++c) mx = fmaxf(mx, __ldcg(slot(c) + 16 * D + row));  // 8 loads in flight
    float num[16] = {}, den = 0.f;
    if (mx != -INFINITY)
#pragma unroll 4
      for (int c = b0; c <= b1; ++c) {
        const float* sp = slot(c);
        const float w = exp2f(__ldcg(sp + 16 * D + row) - mx);
        const float4* x = reinterpret_cast<const float4*>(sp + row * D + d0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 v = __ldcg(x + i);
          num[4 * i] += w * v.x, num[4 * i + 1] += w * v.y, num[4 * i + 2] += w * v.z, num[4 * i + 3] += w * v.w;
        }
        den += w;
      }
    const float iv = den > 0.f ? 1.f / den : 0.f;
    if (row < G) {
      __nv_bfloat16* dst = a.out + (int64_t(cr) * G + row) * D + d0;
#pragma unroll
      for (int i = 0; i < 16; i += 4)
        *reinterpret_cast<uint2*>(dst + i) =
            make_uint2(pack_bf16x2(num[i] * iv, num[i + 1] * iv), pack_bf16x2(num[i + 2] * iv, num[i + 3] * iv));
    }
    if (tid == 0) bs.tickets[cr] = 0;  // every part has arrived: ready for the next launch
  };

  for (int w = w0; w < w1; ++w) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk w landed for every thread; the stage refilled below was consumed last iteration
    if (w == w0) trace_stamp(a, 2);
    if (w == seg1) {  // request boundary inside the range: finish cr, switch to the next request's q and state
      finish();
      cr = next_request(cr), seg0 = w, seg1 = min(w1, 2 * s_ip[cr + 1]);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) qf[kk][j] = qn[kk][j];
      if (seg1 < w1) load_q_frag<kFp8>(a.q + int64_t(next_request(cr)) * G * D, G, lane, qn);
      m0 = m1 = -INFINITY, l0 = l1 = 0.f;
#pragma unroll
      for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    }
    if (const int wl = w + kStages - 1; wl < w1) {
      load_unit(wl, (wl - w0) % kStages, next_vp);
      if (wl + 1 < w1) next_vp = a.indices[(wl + 1) >> 1];
    }
    cp_async_commit();
    const int st = (w - w0) % kStages;
    const uint32_t ks = sbase + st * kStageBytes;
    fold_chunk<kFp8>(ks, ks + kTileBytes, qf, s_valid[st], sl2, warp, lane, m0, m1, l0, l1, o);
  }
  trace_stamp(a, 3);
  cp_async_wait<0>();
  trace_stamp(a, 4), trace_stamp(a, 5), trace_stamp(a, 6);
  finish();
  trace_stamp(a, 7);
}

// How many clusters of `size` CTAs (a request's splits) can be resident at once. A cluster must fit inside one GPC,
// so this is below (slots / size) when the GPCs' SM counts do not divide evenly: on an H200, 32 requests × 8 splits
// at 2 CTAs per SM asks for 32 clusters of 8 when fewer fit, and the last ones run as a second wave (about twice the
// latency of the step). Measured once per (pipeline, size) with the bf16 kernel: the e4m3 pipelines use the same
// (deep) or less (wide: 84 vs 100 KiB) shared memory, so the count holds for them too; an error (or no cluster
// support) leaves the limit open.
int max_active_clusters(int size, bool deep) {
  static int cache[2][kMaxSplits + 1] = {};
  int& c = cache[deep ? 1 : 0][size];
  if (c != 0) return c;
  using P = Pipe<__nv_bfloat16>;
  const void* fn = deep ? reinterpret_cast<const void*>(paged_decode_tc_kernel<__nv_bfloat16, true>)
                        : reinterpret_cast<const void*>(paged_decode_tc_kernel<__nv_bfloat16, false>);
  const int smem = P::smem_bytes(deep ? P::kDeepStages : P::kWideStages);
  int n = 0;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess &&
      cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, unsigned(size));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = size_t(smem);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = unsigned(size), attr.val.clusterDim.z = 1;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) n = 0;
  }
  (void)cudaGetLastError();
  c = n > 0 ? n : std::numeric_limits<int>::max();
  return c;
}

}  // namespace

void PagedDecodeTc::plan(int R, int G, int max_pages, bool allow_split, bool dynamic, Schedule schedule) {
  M3_CUDA_REQUIRE(R >= 0 && G >= 1 && G <= 16, "paged decode (tc): R %d, G %d (supported G: 1..16)", R, G);
  M3_CUDA_REQUIRE(max_pages >= 0 && max_pages < (1 << 24), "paged decode (tc): bad page count %d", max_pages);
  R_ = R, G_ = G;
  const int chunks = std::max(1, max_pages * (PAGE / CH));
  // Opt-in for now: on the H200 it measured slower than the cluster schedule at every shape timed (B = 8 / 32 / 64:
  // 22.6 / 48 / 80 µs against 17.5 / 39 / 70 in bf16; docs/KERNELS.md §9, bench/results/2026-12-03b-decode-h200.md).
  balanced_ = R > 0 && R <= kMaxBalancedRequests && allow_split && schedule == Schedule::kBalanced;
  if (balanced_) {
    M3_CUDA_REQUIRE(int64_t(R) * chunks < (int64_t(1) << 30), "paged decode (tc): step too large (%d × %d chunks)", R,
                    chunks);
    max_units_ = R * chunks;
    splits_ = 1, chunks_per_split_ = 0, deep_ = false;
    const size_t parts = size_t(2 * 2 * sm_count()) * kPartFloats;  // 2 partials per CTA of the wide grid
    if (part_.size() < parts) part_.grow(parts);
    if (tickets_.size() < size_t(kMaxBalancedRequests)) {
      tickets_.grow(size_t(kMaxBalancedRequests));
      M3_CUDA_CHECK(cudaMemset(tickets_.get(), 0, size_t(kMaxBalancedRequests) * sizeof(int)));
      M3_CUDA_CHECK(cudaDeviceSynchronize());  // once per instance: the tickets are zero before any launch reads them
    }
    return;
  }
  // Split only while R·splits stays within one wave (a second, partial wave costs more than the split saves); a
  // request's splits form one cluster, so at most kMaxSplits. The deep pipeline (one CTA per SM) is used where it
  // needs no split, #SMs/2 < R ≤ #SMs (H200, B = 32 at 4 KV heads: 37.7 vs 43.1 µs); with splits the wide one
  // measured faster (B = 8: 22.8 vs 25.0 µs; docs/KERNELS.md §9).
  deep_ = 2 * R > sm_count() && R <= sm_count();
  const int slots = (deep_ ? 1 : 2) * sm_count();
  int want = 1;
  if (allow_split && R > 0) want = std::clamp(slots / R, 1, std::min(chunks, kPortableSplits));
  while (want > 1 && R > max_active_clusters(want, deep_)) --want;  // all clusters in one wave
  // A few long requests (dense decode layers at B = 1–2: R = 4–8 at 4 KV heads): 8 wide splits kept R·8 CTAs on
  // as few as R·4 SMs, and the layer streamed its 123 MB (60k tokens) at 1.45 TB/s (85 µs on the H200,
  // bench/results/2026-12-03-decode-step-h200.md). Deep CTAs (one per SM, 5 chunks in flight each) in clusters of
  // up to 16 put R·16 SMs to work where every cluster is resident at once.
  if (allow_split && R > 0 && chunks >= 4 * kMaxSplits && R * kMaxSplits <= sm_count()) {
    int w = std::min(chunks, kMaxSplits);
    while (w > kPortableSplits && R > max_active_clusters(w, true)) --w;
    if (w > kPortableSplits) deep_ = true, want = w;
  }
  chunks_per_split_ = (chunks + want - 1) / want;
  splits_ = (chunks + chunks_per_split_ - 1) / chunks_per_split_;
  if (dynamic) chunks_per_split_ = 0;  // the kernel cuts each request's chunks over the splits (see the kernel)
}

template <typename KvT>
bool PagedDecodeTc::balanced_deep() const {
  static const int forced = [] {
    const char* e = std::getenv("M3_DECODE_BALANCED_SHAPE");
    return e == nullptr ? 0 : std::strcmp(e, "deep") == 0 ? 1 : std::strcmp(e, "wide") == 0 ? 2 : 0;
  }();
  return forced != 0 ? forced == 1 : sizeof(KvT) == 2;
}

template <typename KvT>
void PagedDecodeTc::run(const PagedDecodeTcArgs<KvT>& a, cudaStream_t s, bool pdl) {
  if (a.R == 0) return;
  M3_CUDA_REQUIRE(a.R == R_ && a.G == G_, "paged decode (tc): run R %d G %d does not match the plan (%d, %d)", a.R,
                  a.G, R_, G_);
  constexpr int64_t kVec = 16 / int64_t(sizeof(KvT));  // elements per 16 bytes
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0 &&
                      a.stride_page % kVec == 0 && a.stride_tok % kVec == 0 && a.stride_tok >= D,
                  "paged decode (tc): q/K/V/out must be 16-byte aligned, strides multiples of 16 bytes");
  using P = Pipe<KvT>;
  cudaLaunchAttribute attrs[2];
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  if (balanced_) {
    using S = BalSmem<KvT>;
    static const cudaError_t bal_wide = cudaFuncSetAttribute(
        paged_decode_bal_kernel<KvT, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::bytes(P::kWideStages));
    static const cudaError_t bal_deep = cudaFuncSetAttribute(
        paged_decode_bal_kernel<KvT, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::bytes(P::kDeepStages));
    M3_CUDA_CHECK(bal_wide);
    M3_CUDA_CHECK(bal_deep);
    const bool deep = balanced_deep<KvT>();
    // A fixed grid (CUDA graphs: the launch depends on R and the capacity only), at most one chunk per CTA.
    const int grid = std::max(1, std::min((deep ? 1 : 2) * sm_count(), max_units_));
    cfg.gridDim = dim3(unsigned(grid));
    cfg.dynamicSmemBytes = S::bytes(deep ? P::kDeepStages : P::kWideStages);
    cfg.attrs = &attrs[1], cfg.numAttrs = pdl ? 1 : 0;
    const BalScratch bs{part_.get(), tickets_.get()};
    if (deep) M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, paged_decode_bal_kernel<KvT, true>, a, bs));
    else M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, paged_decode_bal_kernel<KvT, false>, a, bs));
    return;
  }
  // The pair loop (two chunks per iteration) where it measured faster: e4m3 in the deep shape (H200, B = 32 at 16k:
  // 28.3 → 25.5 µs; bench/results/2026-12-03f-h200.md). e4m3 wide measured the same at B = 64 (41.5 / 41.3) and
  // slower at B = 8 (13.3 / 13.9: 7 splits of 4–5 chunks), bf16 deep the same at B = 32 (38.4 / 38.6).
  // M3_DECODE_PAIR=0: never; =1: wherever it compiles (e4m3 both shapes, bf16 deep) — A/B.
  static const int pair_env = [] {
    const char* e = std::getenv("M3_DECODE_PAIR");
    return e == nullptr ? -1 : std::strcmp(e, "0") == 0 ? 0 : std::strcmp(e, "1") == 0 ? 1 : -1;
  }();
  constexpr bool kFp8 = sizeof(KvT) == 1;
  const bool pair = pair_env == 1 ? (kFp8 || deep_) : pair_env == -1 && kFp8 && deep_;
  // Each instantiation gets its shared-memory limit once; the non-portable cluster size (> 8 splits) is checked only
  // where a launch needs it. prepare() returns that attribute's status.
  const auto prepare = [&](auto kernel, int stages) {
    M3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, P::smem_bytes(stages)));
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  };
  static const cudaError_t np[2][2] = {
      {prepare(paged_decode_tc_kernel<KvT, false>, P::stages(false, false)),
       prepare(paged_decode_tc_kernel<KvT, true>, P::stages(true, false))},
      {kFp8 ? prepare(paged_decode_tc_kernel<KvT, false, kFp8>, P::stages(false, true)) : cudaSuccess,
       prepare(paged_decode_tc_kernel<KvT, true, true>, P::stages(true, true))}};
  if (splits_ > kPortableSplits) M3_CUDA_CHECK(np[pair ? 1 : 0][deep_ ? 1 : 0]);
  cfg.gridDim = dim3(unsigned(a.R), unsigned(splits_));
  cfg.dynamicSmemBytes = P::smem_bytes(P::stages(deep_, pair));
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1, attrs[0].val.clusterDim.y = unsigned(splits_), attrs[0].val.clusterDim.z = 1;
  cfg.attrs = attrs, cfg.numAttrs = pdl ? 2 : 1;
  const auto launch = [&](auto kernel) {
    M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, splits_, chunks_per_split_));
  };
  if (pair)
    deep_ ? launch(paged_decode_tc_kernel<KvT, true, true>) : launch(paged_decode_tc_kernel<KvT, false, kFp8>);
  else
    deep_ ? launch(paged_decode_tc_kernel<KvT, true>) : launch(paged_decode_tc_kernel<KvT, false>);
}

template void PagedDecodeTc::run<__nv_bfloat16>(const PagedDecodeTcArgs<__nv_bfloat16>&, cudaStream_t, bool);
template void PagedDecodeTc::run<e4m3_t>(const PagedDecodeTcArgs<e4m3_t>&, cudaStream_t, bool);
template bool PagedDecodeTc::balanced_deep<__nv_bfloat16>() const;
template bool PagedDecodeTc::balanced_deep<e4m3_t>() const;

}  // namespace m3::cuda
