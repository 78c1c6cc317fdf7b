#include "backend/cuda/msa_decode_index.cuh"

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/warp_mma.cuh"

namespace m3::cuda {

namespace {

constexpr int B = MsaDecodeIndex::kBlock, Di = MsaDecodeIndex::kDim;
constexpr int kHeads = MsaDecodeIndex::kMaxHeads, kList = MsaDecodeIndex::kMaxTopK - 1;
constexpr int kWarps = B / 16, kThreads = 32 * kWarps;  // one 16-key M-tile per warp
constexpr int kCtasPerSm = 2;
// The ring of one element type: bf16 pages are 32 KiB, 3 stages (2 × 2 pages = 128 KiB in flight per SM); e4m3
// pages 16 KiB, 6 stages (2 × 5 pages = 160 KiB in flight; 2 × (96 + 9) KiB of shared memory per SM).
template <typename KT>
struct Ring {
  static constexpr int kPageBytes = B * Di * int(sizeof(KT));
  static constexpr int kStages = sizeof(KT) == 2 ? 3 : 6;
  static constexpr int kSmem = kStages * kPageBytes;
};
constexpr int kPlanThreads = 1024;
constexpr int kRadixRegs = 16;  // rows of ≤ 512 history blocks can take the radix top-k (topk_radix)
// Rows of ≤ this many history blocks take the radix top-k by default, longer ones the insertion network. Measured on
// the H200 (bench_decode --fp8 --index-only, bf16 keys, graph): radix wins at 128 blocks (16k context, B = 1: 8.9 vs
// 9.7 µs) but loses from 192 up (B = 1 at 24k / 32k / 48k / 60k: 12.4 / 13.1 / 15.0 / 16.1 µs with radix up to 512
// blocks against 10.7 / 11.7 / 14.0 / 15.2 with the insertion network; B = 8: 22.9 / 27.2 / 35.5 / 42.2 against
// 21.3 / 25.9 / 34.9 / 42.3): bench/results/2026-12-03d-fp8-moe-wgmma-h200.md.
constexpr int kRadixDefaultMax = 128;
constexpr int kMaxRows = MsaDecodeIndex::kMaxRows;

// One CTA. Per row t: work(t) = local when local + 1 > K (history pages to rank) else 0; n_valid(t) =
// min(K, local + 1). work_indptr = exclusive prefix of work; attention request r = t·H + h starts at
// H·NV(t) + h·n_valid(t) with NV the exclusive prefix of n_valid. Rows are cut into per-thread segments. Also
// zeroes the rows' tickets (no memset node in the decode graph).
__global__ void __launch_bounds__(kPlanThreads) decode_index_plan_kernel(DevStepRows rows, int H, int K,
                                                                         int32_t* __restrict__ work_indptr,
                                                                         int32_t* __restrict__ attn_indptr,
                                                                         int32_t* __restrict__ attn_last,
                                                                         int32_t* __restrict__ row_done) {
  __shared__ int2 wsum[kPlanThreads / 32];
  const int T = rows.T, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int seg = (T + kPlanThreads - 1) / kPlanThreads, t0 = min(T, tid * seg), t1 = min(T, t0 + seg);
  auto work_of = [&](int t, int& nv) {
    const int local = rows.pos[t] / B;
    nv = min(K, local + 1);
    return local + 1 > K ? local : 0;
  };
  int sw = 0, sn = 0;
  for (int t = t0; t < t1; ++t) {
    int nv;
    sw += work_of(t, nv);
    sn += nv;
  }
  int iw = sw, in = sn;  // inclusive warp scan
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, iw, o), b = __shfl_up_sync(0xffffffffu, in, o);
    if (lane >= o) iw += a, in += b;
  }
  if (lane == 31) wsum[warp] = make_int2(iw, in);
  __syncthreads();
  if (warp == 0) {
    int2 v = wsum[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, v.x, o), b = __shfl_up_sync(0xffffffffu, v.y, o);
      if (lane >= o) v.x += a, v.y += b;
    }
    wsum[lane] = v;
  }
  __syncthreads();
  int ew = iw - sw + (warp ? wsum[warp - 1].x : 0), en = in - sn + (warp ? wsum[warp - 1].y : 0);
  for (int t = t0; t < t1; ++t) {
    int nv;
    const int w = work_of(t, nv);
    work_indptr[t] = ew;
    row_done[t] = 0;  // the scorer's per-row tickets (it resets them after each use; this covers a fresh buffer)
    for (int h = 0; h < H; ++h) {
      attn_indptr[t * H + h] = H * en + h * nv;
      attn_last[t * H + h] = rows.pos[t] % B + 1;
    }
    ew += w, en += nv;
  }
  if (tid == kPlanThreads - 1) work_indptr[T] = ew, attn_indptr[T * H] = H * en;
}

// One thread per work item i: work_pages[i] = physical page of (row, history page) item i. Page tables are shared by
// all layers, so this runs once per step and the scorer's loads depend on a single coalesced read.
// W < 0: the count is the plan kernel's work_indptr[T] (device plan); the grid is then a fixed size and strides.
__global__ void decode_index_pages_kernel(DevStepRows rows, const int32_t* __restrict__ work_indptr, int W,
                                          int32_t* __restrict__ work_pages) {
  if (W < 0) W = work_indptr[rows.T];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < W; i += gridDim.x * blockDim.x) {
    const int lo = csr_segment_of(work_indptr, rows.T, i);  // the row of item i
    work_pages[i] = rows.pt_pages[rows.pt_indptr[rows.row_seq[lo]] + (i - work_indptr[lo])];
  }
}

struct ScoreArgs {
  const __nv_bfloat16* iq;
  const void* ik;
  int64_t ik_stride;
  float ik_scale;  // e4m3: key = e4m3 · ik_scale (> 0), applied to the block max
  DevStepRows rows;
  int H, K, W;  // W: work items of the step
  int radix_max;  // rows of ≤ this many history blocks take the radix top-k (≤ 32 · kRadixRegs)
  int64_t ppu, max_cols;
  const int32_t* work_indptr;
  const int32_t* work_pages;
  const int32_t* attn_indptr;
  float* scores;
  int32_t* selection;
  int32_t* attn_indices;
  int* row_done;
  uint64_t* trace;  // bench only (MsaDecodeIndex::set_trace): kTraceSlots globaltimer stamps per CTA, or null
};

// Where a CTA's time goes (bench_decode --trace): slot 0 entry, 1 plan read (after the PDL wait), 2 first page
// landed, 3 last page scored, 4 exit (after the row's top-k when this CTA ran it); a CTA that completes a row also
// stamps 5 when its ticket says so (after the fences and the atomic) and 6 after that row's top-k and page list (the
// latest such row). One predicated store each when on.
__device__ __forceinline__ void trace_stamp(const ScoreArgs& a, int slot) {
  if (a.trace != nullptr && threadIdx.x == 0) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    a.trace[size_t(blockIdx.x) * MsaDecodeIndex::kTraceSlots + slot] = t;
  }
}

__device__ __forceinline__ const int32_t* row_pages(const DevStepRows& rows, int t) {
  return rows.pt_pages + rows.pt_indptr[rows.row_seq[t]];
}

// Order-preserving bits of a score (NaN ranks as −inf): an unsigned compare orders them as the floats; never 0.
__device__ __forceinline__ uint32_t score_key(float x) {
  if (isnan(x)) x = -INFINITY;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Rows of ≤ 32·kR history columns (kR = 16: 64k context): a radix select instead of the insertion network. Every
// lane holds its columns b = lane + 32j as keys u (0 past the row: never selected, every real key is > 0) and the
// pages of those columns (loaded together with the scores, so no load waits on the selection). The (K−1)-th largest
// key thr is found MSB first, two bits per round: the warp counts the keys ≥ thr | d·2^bit for d = 1, 2, 3 packed
// in 10-bit fields of one redux.sync (counts ≤ 512). Then the picks are the keys > thr and, of the keys == thr, the
// lowest columns (the CPU twin's tie order) — both by ballots in column order (j-major, then lane), which also gives
// every pick its slot in ascending column order: no sort, no rank pass.
template <int kR>
__device__ __forceinline__ void topk_radix(const ScoreArgs& a, const float* sr, int wbeg, int local, int h,
                                           int32_t* sel, int32_t* idx, int lane) {
  const int Kt = a.K - 1;
  uint32_t u[kR];
  int32_t pg[kR];
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    const int b = lane + 32 * j;
    const bool in = b < local;
    u[j] = in ? score_key(__ldcg(sr + b)) : 0u;
    pg[j] = in ? __ldcg(a.work_pages + wbeg + b) : 0;
  }
  uint32_t thr = 0;
#pragma unroll 1
  for (int bit = 30; bit >= 0; bit -= 2) {
    const uint32_t t1 = thr | (1u << bit), t2 = thr | (2u << bit), t3 = thr | (3u << bit);
    uint32_t c = 0;
#pragma unroll
    for (int j = 0; j < kR; ++j)
      c += uint32_t(u[j] >= t1) + (uint32_t(u[j] >= t2) << 10) + (uint32_t(u[j] >= t3) << 20);
    c = __reduce_add_sync(0xffffffffu, c);
    const uint32_t k = uint32_t(Kt);
    thr = (c >> 20) >= k ? t3 : ((c >> 10) & 1023u) >= k ? t2 : (c & 1023u) >= k ? t1 : thr;
  }
  uint32_t gt = 0;
#pragma unroll
  for (int j = 0; j < kR; ++j) gt += u[j] > thr;
  const int need = Kt - int(__reduce_add_sync(0xffffffffu, gt));  // ≥ 1: thr itself is among the picks
  const uint32_t below = (1u << lane) - 1u;
  int ties = 0, out = 0;
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    if (32 * j >= local) break;  // warp-uniform
    const bool eq = u[j] == thr;
    const uint32_t em = __ballot_sync(0xffffffffu, eq);
    const bool take = u[j] > thr || (eq && ties + __popc(em & below) < need);
    ties += __popc(em);
    const uint32_t tm = __ballot_sync(0xffffffffu, take);
    if (take) {
      const int slot = out + __popc(tm & below);
      sel[slot] = lane + 32 * j;
      idx[slot] = int32_t(pg[j] * a.ppu + h);
    }
    out += __popc(tm);
  }
}

// Top-(K−1) of row t's history scores for index head h (one warp), then the selection (ascending ids, local last)
// and the page list. Keys: order-preserving score bits << 32 | (~col): an integer max picks the higher score and,
// on ties, the lower column — the CPU twin's order (NaN ranks as −inf). Rows of ≤ radix_max history blocks (128 by
// default: kRadixDefaultMax) take the radix select above; longer ones an insertion network (each lane keeps its best
// kList keys sorted).
// local = the row's history page count (its work, fend − fbeg in the caller), so nothing is read before the scores.
// This runs after the row's last page, on the step's critical path (bench_decode --trace: "top-k + page list"), so
// it is built around latency: the scores, the local page's chain and the attention offset are loaded at once (no
// pos → scores → … → row_seq → pt_indptr → page chain), each of the K − 1 selection rounds is two redux.sync max
// instead of five 64-bit shuffle steps, and the only dependent read after the selection is the picked pages' ids
// from the flattened work list (wbeg = the row's first work item).
__device__ void topk_emit(const ScoreArgs& a, int t, int h, int wbeg, int local, int lane) {
  const int T = a.rows.T, K = a.K;
  const float* sr = a.scores + (int64_t(h) * T + t) * a.max_cols;
  // The local block's page: a three-load chain (row → sequence → page-table row → page), started first so that it
  // runs under the scores' load and the selection; a history pick's page is work_pages[wbeg + b] (one load). (Reading
  // it from a per-step array written by the plan kernel measured the same top-k time, 3.4 µs at B = 8 16k:
  // bench/results/2026-12-03c-fp8-decode-h200.md.)
  const int32_t local_page = a.rows.pt_pages[a.rows.pt_indptr[a.rows.row_seq[t]] + local];
  const int32_t dst_off = a.attn_indptr[t * a.H + h];
  if (local <= a.radix_max) {
    int32_t* sel = a.selection + (int64_t(h) * T + t) * K;
    int32_t* idx = a.attn_indices + dst_off;
    if (local <= 128)
      topk_radix<4>(a, sr, wbeg, local, h, sel, idx, lane);
    else
      topk_radix<kRadixRegs>(a, sr, wbeg, local, h, sel, idx, lane);
    if (lane == 0) {
      sel[K - 1] = local;
      idx[K - 1] = int32_t(local_page * a.ppu + h);
    }
    return;
  }
  // Longer rows: each lane keeps its best kList keys sorted (an insertion network), then K − 1 selection rounds.
  uint64_t top[kList];
#pragma unroll
  for (int j = 0; j < kList; ++j) top[j] = 0;
  // The row's scores come from L2 (other CTAs wrote them): kBatch loads per lane are issued before the first is
  // inserted, so a 512-column row (64k context) costs two L2 round trips instead of sixteen. Same insertion order.
  constexpr int kBatch = 8;
  float xs[kBatch];
#pragma unroll
  for (int j = 0; j < kBatch; ++j) xs[j] = lane + 32 * j < local ? __ldcg(sr + lane + 32 * j) : 0.f;
  for (int b0 = lane; b0 < local; b0 += 32 * kBatch) {
    if (b0 != lane) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) xs[j] = b0 + 32 * j < local ? __ldcg(sr + b0 + 32 * j) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int b = b0 + 32 * j;
      if (b >= local) break;
      const uint64_t key = (uint64_t(score_key(xs[j])) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(b));
      if (key > top[kList - 1]) {
#pragma unroll
        for (int q = kList - 1; q > 0; --q) top[q] = key > top[q - 1] ? top[q - 1] : (key > top[q] ? key : top[q]);
        top[0] = key > top[0] ? key : top[0];
      }
    }
  }
  // Round k: the warp's best head key; its owner pops it. The high words (score) decide, the low word (~column,
  // unique) breaks ties; a key is never 0 (u ≥ 0x007FFFFF), so popped-out slots (0) never win while K − 1 ≤ local
  // candidates remain (local ≥ K for every row with work).
  int pick = 0x7fffffff;
  for (int k = 0; k < K - 1; ++k) {
    const uint32_t hi = uint32_t(top[0] >> 32), lo = uint32_t(top[0]);
    const uint32_t mhi = __reduce_max_sync(0xffffffffu, hi);
    const uint32_t mlo = __reduce_max_sync(0xffffffffu, hi == mhi ? lo : 0u);
    if (hi == mhi && lo == mlo) {
#pragma unroll
      for (int j = 0; j < kList - 1; ++j) top[j] = top[j + 1];
      top[kList - 1] = 0;
    }
    if (lane == k) pick = int(0xFFFFFFFFu - mlo);
  }
  int rank = 0;
#pragma unroll
  for (int j = 0; j < kList; ++j)
    if (j < K - 1) rank += __shfl_sync(0xffffffffu, pick, j) < pick;
  int32_t* sel = a.selection + (int64_t(h) * T + t) * K;
  int32_t* idx = a.attn_indices + dst_off;
  if (lane < K - 1) {
    sel[rank] = pick;
    idx[rank] = int32_t(a.work_pages[wbeg + pick] * a.ppu + h);
  }
  if (lane == 0) {
    sel[K - 1] = local;
    idx[K - 1] = int32_t(local_page * a.ppu + h);
  }
}

// Persistent CTA c scores work items [W·c/grid, W·(c+1)/grid) of the flattened (row, history page) list. Warp w
// owns keys 16w..16w+15 of every page: S[16 keys, 8] = K_tile · Q_rowᵀ (heads ≥ H are zero columns), max over the
// 16 keys by shuffles, then over the 8 warps in shared memory (red, double-buffered by item parity).
// e4m3 keys (kFp8): pages land as [128, 128 B] (swz64); ldmatrix gives each lane 4 consecutive dims
// 16·kk + 4·(lane%4) .. +3 of one key, converted exactly to f16 in registers (one cvt per pair, kv_fp8.cuh): bytes
// 0–1 are the A fragment's k pair 2c, 2c+1, bytes 2–3 the pair 2c+8, 2c+9 (the mma's k order is free), and the
// query's B fragment is loaded in that same dim order and rounded bf16 → f16 (exact for the RMS-normed index query
// in f16's normal range; the products stay exact, so the scores equal the bf16 route's but for query elements
// below 2^-14). The per-tensor scale multiplies the block max (max commutes with s > 0).
template <typename KT>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) decode_index_kernel(ScoreArgs a) {
  static_assert(sizeof(KT) == 2 || sizeof(KT) == 1, "bf16 or e4m3 index keys");
  constexpr bool kFp8 = sizeof(KT) == 1;
  constexpr int kStages = Ring<KT>::kStages, kPageBytes = Ring<KT>::kPageBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float red[2][kWarps][kHeads];
  __shared__ int s_last;
  __shared__ int s_wi[kMaxRows + 1];  // work_indptr
  const KT* ik = static_cast<const KT*>(a.ik);
  const int T = a.rows.T, H = a.H, K = a.K;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t sbase = smem_addr(smem);
  trace_stamp(a, 0);

  // Known at plan time (the first loads need no device read but their page ids), or, for a device plan (a captured
  // graph), the plan kernel's total — written by an earlier, completed launch, like the page ids.
  const int W = a.W >= 0 ? a.W : a.work_indptr[T];
  const int i0 = int(int64_t(W) * blockIdx.x / gridDim.x), i1 = int(int64_t(W) * (blockIdx.x + 1) / gridDim.x);
  pdl_launch_dependents();
  const uint64_t policy = l2_evict_first_policy();
  auto load = [&](int i, int stage) {
    const KT* src = ik + int64_t(a.work_pages[i]) * a.ik_stride;
    const uint32_t dst = sbase + stage * kPageBytes;
    if constexpr (kFp8) {
#pragma unroll
      for (int k = 0; k < B * 8 / kThreads; ++k) {
        const int idx = tid + k * kThreads, row = idx >> 3, ch = idx & 7;
        cp_async16_policy(dst + swz64(row, ch), src + row * Di + ch * 16, policy);
      }
    } else {
#pragma unroll
      for (int k = 0; k < B * 16 / kThreads; ++k) {
        const int idx = tid + k * kThreads, row = idx >> 4, ch = idx & 15;
        cp_async16_policy(dst + swz128(row, ch), src + row * Di + ch * 8, policy);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {  // the ring starts filling before anything else
    if (i0 + s < i1) load(i0 + s, s);
    cp_async_commit();
  }
  // Everything above reads only the step plan and history index-K pages (written by earlier steps); the query and
  // this layer's outputs (still read by the previous layer's attention) wait for the previous kernel.
  pdl_wait();
  for (int t = tid; t <= T; t += kThreads) s_wi[t] = a.work_indptr[t];
  __syncthreads();
  // Rows whose selection is fixed (local + 1 ≤ K): 0..local, −1 padding.
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    if (s_wi[t + 1] != s_wi[t]) continue;
    const int local = a.rows.pos[t] / B, n = min(K, local + 1);
    const int32_t* pt = row_pages(a.rows, t);
    for (int i = tid; i < H * K; i += kThreads) {
      const int h = i / K, s = i % K;
      a.selection[(int64_t(h) * T + t) * K + s] = s < n ? s : -1;
      if (s < n) a.attn_indices[a.attn_indptr[t * H + h] + s] = int32_t(pt[s] * a.ppu + h);
    }
  }
  trace_stamp(a, 1);
  if (i0 >= i1) {
    trace_stamp(a, 2), trace_stamp(a, 3), trace_stamp(a, 4);
    return;
  }
  auto row_of = [&](int i) { return csr_segment_of(s_wi, T, i); };  // that row has work, since i < W
  // Compute side: row ct covers items up to cend; qb = its query as the mma B operand (k = dim, n = head).
  int ct = -1, cend = i0;
  uint32_t qb[8][2];
  // Finishing side: the block max of item i − 1 is reduced at the top of iteration i (red complete after the sync).
  int ft = -1, fbeg = 0, fend = 0, fcount = 0;
  auto finish = [&](int i) {
    if (i >= fend) {
      ft = row_of(i), fbeg = s_wi[ft], fend = s_wi[ft + 1], fcount = 0;
    }
    if (tid < H) {
      float v = red[i & 1][0][tid];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) v = fmaxf(v, red[i & 1][w][tid]);
      if constexpr (kFp8) v *= a.ik_scale;
      a.scores[(int64_t(tid) * T + ft) * a.max_cols + (i - fbeg)] = v;
    }
    ++fcount;
    if (i == fend - 1 || i == i1 - 1) {  // this CTA's part of row ft is done: publish its scores, take a ticket
      // Message passing at GPU scope with acquire-release fences (not fence.sc): the barrier orders the score
      // stores before thread 0's release fence (cumulative), the ticket is a relaxed atomic, and the CTA that
      // completes the row acquires before reading the other CTAs' scores (from L2, __ldcg).
      __syncthreads();
      if (tid == 0) {
        fence_acq_rel_gpu();
        const int old = atomicAdd(a.row_done + ft, fcount);
        s_last = old + fcount == fend - fbeg;
      }
      __syncthreads();
      if (s_last) {
        trace_stamp(a, 5);
        fence_acq_rel_gpu();
        if (warp < H) topk_emit(a, ft, warp, fbeg, fend - fbeg, lane);
        if (tid == 0) a.row_done[ft] = 0;  // ready for the next run (graph replays)
        trace_stamp(a, 6);
      }
    }
  };

  for (int i = i0; i < i1; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (i == i0) trace_stamp(a, 2);
    if (i > i0) finish(i - 1);
    if (i + kStages - 1 < i1) load(i + kStages - 1, (i + kStages - 1 - i0) % kStages);
    cp_async_commit();
    if (i >= cend) {
      ct = row_of(i), cend = s_wi[ct + 1];
      const int n = lane >> 2;
      if constexpr (kFp8) {  // k-step kk: dims 16·kk + 4c + {0, 1} (b0) and + {2, 3} (b1)
        const __nv_bfloat16* q = a.iq + (int64_t(ct) * H + n) * Di + 4 * (lane & 3);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const uint2 w = n < H ? *reinterpret_cast<const uint2*>(q + kk * 16) : make_uint2(0u, 0u);
          qb[kk][0] = bf16x2_to_f16x2(w.x), qb[kk][1] = bf16x2_to_f16x2(w.y);
        }
      } else {
        const __nv_bfloat16* q = a.iq + (int64_t(ct) * H + n) * Di + 2 * (lane & 3);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          qb[kk][0] = n < H ? *reinterpret_cast<const uint32_t*>(q + kk * 16) : 0u;
          qb[kk][1] = n < H ? *reinterpret_cast<const uint32_t*>(q + kk * 16 + 8) : 0u;
        }
      }
    }
    const uint32_t st = sbase + ((i - i0) % kStages) * kPageBytes;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (kFp8) {
#pragma unroll
      for (int h = 0; h < 4; ++h) {  // k-steps 2h, 2h + 1; matrices (keys 0–7 | 8–15) × chunk
        uint32_t w[4];
        ldmatrix_x4(st + swz64(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * h + (lane >> 4)), w[0], w[1],
                    w[2], w[3]);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const uint32_t af[4] = {e4m3x2_to_f16x2<false>(w[2 * q]), e4m3x2_to_f16x2<false>(w[2 * q + 1]),
                                  e4m3x2_to_f16x2<true>(w[2 * q]), e4m3x2_to_f16x2<true>(w[2 * q + 1])};
          mma_f16_16816(c, af, qb[2 * h + q][0], qb[2 * h + q][1]);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        uint32_t af[4];
        ldmatrix_x4(st + swz128(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)), af[0], af[1],
                    af[2], af[3]);
        mma_bf16_16816(c, af, qb[kk][0], qb[kk][1]);
      }
    }
    // c0, c1: key g = lane/4, heads 2·(lane%4) + {0, 1}; c2, c3: key g + 8.
    float h0 = fmaxf(c[0], c[2]), h1 = fmaxf(c[1], c[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      h0 = fmaxf(h0, __shfl_xor_sync(0xffffffffu, h0, o));
      h1 = fmaxf(h1, __shfl_xor_sync(0xffffffffu, h1, o));
    }
    if (lane < 2) {  // heads 0..3 live in lanes 0 and 1
      red[i & 1][warp][2 * lane] = h0;
      red[i & 1][warp][2 * lane + 1] = h1;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  trace_stamp(a, 3);
  finish(i1 - 1);
  trace_stamp(a, 4);
}

}  // namespace

// The part both plans share: buffers (work_pages sized work_cap), the ticket reset, the plan kernel and the page
// flatten kernel — over W items known here (W ≥ 0), or over the count the plan kernel leaves in work_indptr[T]
// with a fixed grid (W < 0: the device plan).
void MsaDecodeIndex::launch_plan(const DevStepRows& rows, size_t work_cap, int W, cudaStream_t s) {
  work_indptr_.grow(size_t(T_) + 1);
  attn_indptr_.grow(size_t(T_) * H_ + 1);
  attn_last_.grow(size_t(T_) * H_);
  attn_indices_.grow(size_t(T_) * H_ * K_);
  selection_.grow(size_t(T_) * H_ * K_);
  scores_.grow(size_t(H_) * T_ * max_cols_);
  row_done_.grow(size_t(T_));
  work_pages_.grow(std::max<size_t>(work_cap, 1));
  grid_ = kCtasPerSm * sm_count();
  decode_index_plan_kernel<<<1, kPlanThreads, 0, s>>>(rows, H_, K_, work_indptr_.get(), attn_indptr_.get(),
                                                      attn_last_.get(), row_done_.get());
  M3_CUDA_LAUNCH_CHECK();
  if (W == 0) return;
  const unsigned blocks = W > 0 ? unsigned((W + 255) / 256) : unsigned(2 * sm_count());
  decode_index_pages_kernel<<<blocks, 256, 0, s>>>(rows, work_indptr_.get(), W, work_pages_.get());
  M3_CUDA_LAUNCH_CHECK();
}

void MsaDecodeIndex::plan_device(const DevStepRows& rows, int num_heads, int top_k, int64_t kv_pages_per_unit,
                                 int64_t max_cols, cudaStream_t s) {
  M3_CUDA_REQUIRE(num_heads >= 1 && num_heads <= kMaxHeads, "msa decode index: %d index heads (supported: 1..%d)",
                  num_heads, kMaxHeads);
  M3_CUDA_REQUIRE(top_k >= 2 && top_k <= kMaxTopK, "msa decode index: top_k %d (supported: 2..%d)", top_k, kMaxTopK);
  M3_CUDA_REQUIRE(rows.T >= 0 && rows.T <= kMaxRows, "msa decode index: %d rows (supported: ≤ %d)", rows.T,
                  kMaxRows);
  M3_CUDA_REQUIRE(kv_pages_per_unit >= 1 && max_cols >= 1, "msa decode index: bad capacity");
  M3_CUDA_REQUIRE(int64_t(rows.T) * max_cols < (int64_t(1) << 31), "msa decode index: capacity too large");
  T_ = rows.T, H_ = num_heads, K_ = top_k, ppu_ = kv_pages_per_unit;
  max_cols_ = max_cols, max_pages_ = top_k, W_ = -1;  // the work count stays on the device
  if (T_ == 0) return;
  launch_plan(rows, size_t(T_) * size_t(max_cols_), -1, s);  // ≤ max_cols history pages per row
}

void MsaDecodeIndex::plan(const std::vector<int32_t>& pos, const DevStepRows& rows, int num_heads, int top_k,
                          int64_t kv_pages_per_unit, cudaStream_t s) {
  M3_CUDA_REQUIRE(num_heads >= 1 && num_heads <= kMaxHeads, "msa decode index: %d index heads (supported: 1..%d)",
                  num_heads, kMaxHeads);
  M3_CUDA_REQUIRE(top_k >= 2 && top_k <= kMaxTopK, "msa decode index: top_k %d (supported: 2..%d)", top_k, kMaxTopK);
  M3_CUDA_REQUIRE(rows.T == int(pos.size()), "msa decode index: %d device rows for %zu positions", rows.T, pos.size());
  M3_CUDA_REQUIRE(kv_pages_per_unit >= 1, "msa decode index: pages per unit must be ≥ 1");
  M3_CUDA_REQUIRE(pos.size() <= size_t(kMaxRows), "msa decode index: %zu rows (supported: ≤ %d)", pos.size(),
                  kMaxRows);
  T_ = int(pos.size()), H_ = num_heads, K_ = top_k, ppu_ = kv_pages_per_unit;
  max_cols_ = 1, max_pages_ = 0;
  int64_t work = 0;
  for (int32_t p : pos) {  // work counted here and in decode_index_plan_kernel alike
    M3_CUDA_REQUIRE(p >= 0, "msa decode index: negative position %d", p);
    const int local = p / kBlock;
    max_cols_ = std::max<int64_t>(max_cols_, local);
    max_pages_ = std::max(max_pages_, std::min(top_k, local + 1));
    work += local + 1 > top_k ? local : 0;
  }
  M3_CUDA_REQUIRE(work < (int64_t(1) << 31) && int64_t(T_) * H_ * top_k < (int64_t(1) << 31),
                  "msa decode index: step too large (%lld pages to score)", (long long)work);
  W_ = int(work);
  if (T_ == 0) return;
  launch_plan(rows, size_t(work), W_, s);
}

template <typename KT>
void MsaDecodeIndex::run(const __nv_bfloat16* iq, const DevPagedIndexKT<KT>& cache, const DevStepRows& rows,
                         cudaStream_t s, bool pdl) {
  if (T_ == 0) return;
  M3_CUDA_REQUIRE(rows.T == T_, "msa decode index: %d rows, plan has %d", rows.T, T_);
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(iq) % 16 == 0 && reinterpret_cast<uintptr_t>(cache.ik) % 16 == 0 &&
                      cache.page_stride % (16 / int64_t(sizeof(KT))) == 0 &&
                      cache.page_stride >= int64_t(kBlock) * kDim && cache.scale > 0.f,
                  "msa decode index: iq / index-K must be 16-byte aligned with a page stride ≥ 128·128 elements "
                  "(a multiple of 16 bytes) and a scale > 0");
  constexpr int kSmem = Ring<KT>::kSmem;
  static const cudaError_t attr =
      cudaFuncSetAttribute(decode_index_kernel<KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  M3_CUDA_CHECK(attr);
  // M3_DECODE_TOPK_RADIX_MAX (bench / A-B only): the longest row (history blocks) that takes the radix select, up to
  // 512 (default kRadixDefaultMax).
  static const int radix_max = [] {
    const char* e = std::getenv("M3_DECODE_TOPK_RADIX_MAX");
    return e ? std::clamp(std::atoi(e), 0, 32 * kRadixRegs) : kRadixDefaultMax;
  }();
  const int rmax = radix_max_ >= 0 ? std::min(radix_max_, 32 * kRadixRegs) : radix_max;
  ScoreArgs a{iq, cache.ik, cache.page_stride, cache.scale, rows, H_, K_, W_, rmax, ppu_, max_cols_,
              work_indptr_.get(), work_pages_.get(), attn_indptr_.get(), scores_.get(), selection_.get(),
              attn_indices_.get(), row_done_.get(), trace_};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid_));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr_pdl;
  attr_pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr_pdl.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr_pdl, cfg.numAttrs = pdl ? 1 : 0;
  M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_index_kernel<KT>, a));
}

template void MsaDecodeIndex::run<__nv_bfloat16>(const __nv_bfloat16*, const DevPagedIndexKT<__nv_bfloat16>&,
                                                 const DevStepRows&, cudaStream_t, bool);
template void MsaDecodeIndex::run<e4m3_t>(const __nv_bfloat16*, const DevPagedIndexKT<e4m3_t>&, const DevStepRows&,
                                          cudaStream_t, bool);

}  // namespace m3::cuda
