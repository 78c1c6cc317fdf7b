#include "backend/cuda/paged_decode_mq.cuh"

#include <algorithm>
#include <atomic>

#include <cooperative_groups.h>

#include "backend/cuda/warp_mma.cuh"

namespace cg = cooperative_groups;

namespace m3::cuda {

namespace {

constexpr int D = PagedDecodeMq::kHeadDim, PAGE = PagedDecodeMq::kPage;
constexpr int kMaxQ = PagedDecodeMq::kMaxRows, kMaxE = PagedDecodeMq::kMaxEntries;
constexpr int CH = 64;  // tokens per pipeline stage (half a page) = 4 slices of 16 tokens
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kTileBytes = CH * D * 2;       // K or V of one chunk: [64, 128] bf16 = 16 KiB
constexpr int kStageBytes = 2 * kTileBytes;  // K then V
constexpr int kStages = 6;                   // 192 KiB ring, 1 CTA per SM, 5 chunks in flight
constexpr int kRingBytes = kStages * kStageBytes;
constexpr int kMaxSplits = 8;  // one portable cluster
constexpr float kLog2e = 1.4426950408889634f;
// After the main loop the ring holds the cross-warp merge: per-warp O [8][16][128] fp32, m and l [8][16], then the
// split partial O [8 rows · 16][128] fp32 and its LSE [128].
constexpr int kMergeM = kWarps * 16 * D * 4, kMergeL = kMergeM + kWarps * 16 * 4;
constexpr int kPartOff = kMergeL + kWarps * 16 * 4 + 1024;
static_assert(kPartOff + (kMaxQ * 16 * D + kMaxQ * 16) * 4 <= kRingBytes, "the merges reuse the ring");
static_assert(kMaxQ * 16 * D * 2 == kStageBytes, "the q tile of 8 rows × 16 heads fills the last stage");

// The union of a (request, KV head)'s page lists, built in shared memory after the ring.
struct Meta {
  int32_t ent_v[kMaxE];        // entry e (rows' lists concatenated): virtual page
  int32_t ent_u[kMaxE];        // union slot of a first occurrence
  int32_t uni_v[kMaxE];        // union slot u: virtual page
  int32_t uni_max[kMaxE];      // longest visible length of page u over the rows (zero-fill beyond)
  uint8_t vlen[kMaxQ][kMaxE];  // tokens of page u visible to row q (0: not selected; 128, or the last-page fill)
  int32_t row_beg[kMaxQ], row_n[kMaxQ], row_last[kMaxQ], row_off[kMaxQ + 1];
  int32_t warp_cnt[kWarps];
  int32_t nuni;
};
constexpr int kSmemBytes = kRingBytes + int(sizeof(Meta));

// One warp step over tokens [t, t + 16·NS) of the chunk at ks / vs for the warp's row (its G heads are the mma M):
// S = Q·Kᵀ as 2·NS n-tiles (the NS slices' k-chains interleave, so NS·2 independent mma chains are in flight),
// online softmax once per step (log2 domain, fp32), O += P·V over NS k-steps (P re-packed from the S accumulators,
// V through ldmatrix.trans). Tokens ≥ vis (the row's visible tokens in this chunk) are masked to −inf.
template <int NS>
__device__ __forceinline__ void attend_step(uint32_t ks, uint32_t vs, int t, int vis, float sl2,
                                            const uint32_t (&qf)[8][4], float (&o)[16][4], float& m0, float& m1,
                                            float& l0, float& l1, int lane) {
  float sc[2 * NS][4];
#pragma unroll
  for (int j = 0; j < 2 * NS; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(ks + swz128(t + s * 16 + ((lane >> 4) << 3) + (lane & 7), 2 * kk + ((lane >> 3) & 1)), b0, b1, b2,
                  b3);
      mma_bf16_16816(sc[2 * s], qf[kk], b0, b1);
      mma_bf16_16816(sc[2 * s + 1], qf[kk], b2, b3);
    }
  online_softmax_step(sc, t + 2 * (lane & 3), vis, sl2, m0, m1, l0, l1, o);
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const uint32_t pa[4] = {pack_bf16x2(sc[2 * s][0], sc[2 * s][1]), pack_bf16x2(sc[2 * s][2], sc[2 * s][3]),
                            pack_bf16x2(sc[2 * s + 1][0], sc[2 * s + 1][1]),
                            pack_bf16x2(sc[2 * s + 1][2], sc[2 * s + 1][3])};
#pragma unroll
    for (int nd = 0; nd < 8; ++nd) {
      uint32_t v0, v1, v2, v3;
      ldmatrix_x4_trans(vs + swz128(t + s * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * nd + (lane >> 4)), v0, v1,
                        v2, v3);
      mma_bf16_16816(o[2 * nd], pa, v0, v1);
      mma_bf16_16816(o[2 * nd + 1], pa, v2, v3);
    }
  }
}

// grid (N·Hkv, splits), 256 threads, cluster (1, splits). CTA (request n, KV head h, split):
//   1. union: the rows' page lists are concatenated (≤ 128 entries, row 0's first); an entry is a first occurrence
//      when no earlier row lists its page; first occurrences are compacted (ballot prefix) into union slots, so row 0's
//      pages are slots 0..n0−1. vlen[q][u] = the row's visible tokens on u (128, or its fill on its last page).
//   2. the union's chunks (2 per page, 64 tokens) stream once through a 6-stage cp.async ring, rows past every
//      row's visible length zero-filled; the split owns chunks [split·per, +per), per = ⌈2U / splits⌉.
//   3. warp w serves row q = w / wpr (wpr = 8 / Q rounded up to a power of two: Q = 8 one warp per row, Q = 1 all
//      8 warps); the row's G query heads are the mma M (rows ≥ G zero). The row's warps cut each chunk into
//      contiguous ranges of 64 / wpr tokens and take one attend_step over the whole range (Q 5–8: 64 tokens,
//      Q 3–4: 32, Q 2: 16; Q = 1: 16-token slices, the warps alternating chunks). One step per chunk keeps 2·NS
//      independent mma chains in flight (the first version, one 16-token slice at a time, was latency-bound:
//      bench/results/2026-12-02b-decode-mq-h200.md). A warp skips chunks its row did not select or cannot see
//      (warp-uniform: vlen is per row), so no mma is spent on another row's pages.
//   4. warps of a row merge in smem; with splits, the CTAs of the cluster merge (O, LSE) through DSMEM.
template <typename KvT>
__global__ void __launch_bounds__(kThreads, 1) paged_decode_mq_kernel(PagedDecodeMqArgs<KvT> a, int splits) {
  static_assert(sizeof(KvT) == 2, "16-bit K/V elements (bf16)");
  extern __shared__ __align__(128) uint8_t smem[];
  Meta& mt = *reinterpret_cast<Meta*>(smem + kRingBytes);
  const uint32_t sbase = smem_addr(smem);
  const int n = blockIdx.x / a.Hkv, h = blockIdx.x % a.Hkv, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  pdl_launch_dependents();
  pdl_wait();  // q and the page lists come from the previous kernels
  const int t0 = a.req_indptr[n], Q = min(a.req_indptr[n + 1] - t0, kMaxQ);

  // q of the Q rows → the last stage as a [8·16, 128] tile, row q·16 + g (rows g ≥ G, q ≥ Q zero): first group.
  const uint32_t qs = sbase + (kStages - 1) * kStageBytes;
#pragma unroll
  for (int i = 0; i < kMaxQ * 16 * 16 / kThreads; ++i) {
    const int idx = tid + i * kThreads, row = idx >> 4, ch = idx & 15, qq = row >> 4, g = row & 15;
    const bool ok = qq < Q && g < a.G;
    const int64_t src = ((int64_t(t0) + (ok ? qq : 0)) * a.Hkv + h) * a.G + (ok ? g : 0);
    cp_async16(qs + swz128(row, ch), a.q + src * D + ch * 8, ok ? 16 : 0);
  }
  cp_async_commit();

  // ---- 1. the union ----
  if (warp == 0) {
    int b = 0, cnt = 0, last = 0;
    if (lane < Q) {
      const int r = (t0 + lane) * a.Hkv + h;
      b = a.indptr[r], cnt = a.indptr[r + 1] - b, last = a.last_len[r];
    }
    int incl = cnt;  // inclusive prefix over the ≤ 8 rows
#pragma unroll
    for (int o = 1; o < kMaxQ; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane < kMaxQ) {
      mt.row_beg[lane] = b, mt.row_n[lane] = cnt, mt.row_last[lane] = last;
      mt.row_off[lane + 1] = min(incl, kMaxE);  // over capacity (a broken contract): later entries are dropped
    }
    if (lane == 0) mt.row_off[0] = 0;
  }
  for (int i = tid; i < kMaxQ * kMaxE / 4; i += kThreads) reinterpret_cast<uint32_t*>(&mt.vlen[0][0])[i] = 0u;
  __syncthreads();
  const int E = mt.row_off[kMaxQ];
  int my_q = 0, my_v = -1, my_len = 0, dup = tid;
  if (tid < E) {
    while (tid >= mt.row_off[my_q + 1]) ++my_q;
    const int s = tid - mt.row_off[my_q];
    my_v = a.indices[mt.row_beg[my_q] + s];
    my_len = s == mt.row_n[my_q] - 1 ? mt.row_last[my_q] : PAGE;
    mt.ent_v[tid] = my_v;
  }
  __syncthreads();
  if (tid < E) {  // first earlier-row entry of the same page (a row's own list is not deduplicated)
    const int lim = mt.row_off[my_q];
    // 16-byte broadcast reads, no early exit: the loads of a warp's lanes pipeline (≤ 28 steps at 128 entries).
#pragma unroll 4
    for (int e = lim - 1 - ((lim - 1) & 3); e >= 0; e -= 4) {  // backwards: the last match written is the first
      const int4 v4 = *reinterpret_cast<const int4*>(&mt.ent_v[e]);
      if (e + 3 < lim && v4.w == my_v) dup = e + 3;
      if (e + 2 < lim && v4.z == my_v) dup = e + 2;
      if (e + 1 < lim && v4.y == my_v) dup = e + 1;
      if (v4.x == my_v) dup = e;
    }
  }
  const bool first = tid < E && dup == tid;
  const unsigned bal = __ballot_sync(0xffffffffu, first);
  if (lane == 0) mt.warp_cnt[warp] = __popc(bal);
  __syncthreads();
  {
    int u = __popc(bal & ((1u << lane) - 1u)), tot = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) u += mt.warp_cnt[w];
      tot += mt.warp_cnt[w];
    }
    if (first) mt.ent_u[tid] = u, mt.uni_v[u] = my_v;
    if (tid == 0) mt.nuni = tot;
  }
  __syncthreads();
  if (tid < E) mt.vlen[my_q][mt.ent_u[dup]] = uint8_t(my_len);
  __syncthreads();
  const int U = mt.nuni;
  if (tid < U) {
    int mx = 0;
    for (int q = 0; q < Q; ++q) mx = max(mx, int(mt.vlen[q][tid]));
    mt.uni_max[tid] = mx;
  }
  __syncthreads();

  // ---- 2. the ring over the union's chunks ----
  const int nchunks = 2 * U, per = (nchunks + splits - 1) / splits;
  const int c0 = min(nchunks, split * per), c1 = min(nchunks, c0 + per);
  auto load_chunk = [&](int c, int stage) {
    const int u = c >> 1, half = c & 1;
    const int valid = min(CH, mt.uni_max[u] - half * CH);
    if (valid <= 0) return;  // no row sees these tokens, so no warp reads the stage
    const int64_t off = int64_t(mt.uni_v[u]) * a.stride_page + int64_t(half * CH) * a.stride_tok;
    const uint32_t ks = sbase + stage * kStageBytes, vs = ks + kTileBytes;
#pragma unroll
    for (int i = 0; i < CH * 16 / kThreads; ++i) {
      const int idx = tid + i * kThreads, row = idx >> 4, ch = idx & 15;
      const bool ok = row < valid;
      const int64_t src = off + int64_t(ok ? row : 0) * a.stride_tok + ch * 8;
      cp_async16(ks + swz128(row, ch), a.k + src, ok ? 16 : 0);
      cp_async16(vs + swz128(row, ch), a.v + src, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (c0 + s < c1) load_chunk(c0 + s, s);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();  // q (and chunk c0) landed
  __syncthreads();

  // ---- 3. rows on warps ----
  const int qp = Q <= 1 ? 1 : Q <= 2 ? 2 : Q <= 4 ? 4 : 8;
  const int wpr = kWarps / qp, row = warp / wpr, wi = warp % wpr;
  const bool active = row < Q;
  const int ns = wpr >= 4 ? 1 : 4 / wpr;  // 16-token slices per warp step: Q ≤ 2 → 1, Q 3–4 → 2, Q 5–8 → 4
  uint32_t qf[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    ldmatrix_x4(qs + swz128(row * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)), qf[kk][0],
                qf[kk][1], qf[kk][2], qf[kk][3]);

  const float sl2 = a.scale * kLog2e;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads g = lane/4 and g + 8 of the warp's row
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  for (int c = c0; c < c1; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk c landed for every thread; the stage refilled below was consumed last iteration
    if (c + kStages - 1 < c1) load_chunk(c + kStages - 1, (c + kStages - 1 - c0) % kStages);
    cp_async_commit();
    const int vis = active ? int(mt.vlen[row][c >> 1]) - (c & 1) * CH : 0;  // the row's tokens in this chunk
    if (vis <= 0) continue;
    const uint32_t ks = sbase + ((c - c0) % kStages) * kStageBytes, vs = ks + kTileBytes;
    if (wpr == kWarps) {  // Q = 1: slice wi & 3 of the chunks of parity wi >> 2
      const int t = (wi & 3) * 16;
      if (((c - c0) & 1) == (wi >> 2) && t < vis) attend_step<1>(ks, vs, t, vis, sl2, qf, o, m0, m1, l0, l1, lane);
    } else {  // the row's warps cut the chunk into contiguous ranges of 64 / wpr tokens
      const int t = wi * ns * 16;
      if (t < vis) {
        if (ns == 4) attend_step<4>(ks, vs, t, vis, sl2, qf, o, m0, m1, l0, l1, lane);
        else if (ns == 2) attend_step<2>(ks, vs, t, vis, sl2, qf, o, m0, m1, l0, l1, lane);
        else attend_step<1>(ks, vs, t, vis, sl2, qf, o, m0, m1, l0, l1, lane);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it for the merges

  // ---- 4. merge the warps of a row, then the splits ----
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  float* ow = reinterpret_cast<float*>(smem);                // [8 warps][16][128]
  float* mw = reinterpret_cast<float*>(smem + kMergeM);      // [8][16]
  float* lw = reinterpret_cast<float*>(smem + kMergeL);      // [8][16]
  float* po = reinterpret_cast<float*>(smem + kPartOff);     // [8 rows · 16][128] the split partial
  float* plse = po + kMaxQ * 16 * D;                         // [8 · 16]
  const int g4 = lane >> 2;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int d = i * 8 + 2 * (lane & 3);
    *reinterpret_cast<float2*>(ow + (warp * 16 + g4) * D + d) = make_float2(o[i][0], o[i][1]);
    *reinterpret_cast<float2*>(ow + (warp * 16 + g4 + 8) * D + d) = make_float2(o[i][2], o[i][3]);
  }
  if ((lane & 3) == 0) {
    mw[warp * 16 + g4] = m0, mw[warp * 16 + g4 + 8] = m1;
    lw[warp * 16 + g4] = l0, lw[warp * 16 + g4 + 8] = l1;
  }
  __syncthreads();
  const int d0 = (tid & 7) * 16;
  for (int line = tid >> 3; line < Q * 16; line += kThreads / 8) {  // line = row q · 16 + head g
    const int q = line >> 4, g = line & 15;
    float M = -INFINITY;
    for (int w = q * wpr; w < (q + 1) * wpr; ++w) M = fmaxf(M, mw[w * 16 + g]);
    float L = 0.f, acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    for (int w = q * wpr; w < (q + 1) * wpr; ++w) {
      const float f = M == -INFINITY ? 0.f : exp2f(mw[w * 16 + g] - M);
      L += f * lw[w * 16 + g];
      const float* src = ow + (w * 16 + g) * D + d0;
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[i] += f * src[i];
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    if (splits == 1) {
      if (g < a.G) {
        __nv_bfloat16* dst = a.out + ((int64_t(t0 + q) * a.Hkv + h) * a.G + g) * D + d0;
#pragma unroll
        for (int i = 0; i < 16; i += 2) *reinterpret_cast<uint32_t*>(dst + i) = pack_bf16x2(acc[i] * inv, acc[i + 1] * inv);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; i += 4)
        *reinterpret_cast<float4*>(po + line * D + d0 + i) =
            make_float4(acc[i] * inv, acc[i + 1] * inv, acc[i + 2] * inv, acc[i + 3] * inv);
      if ((tid & 7) == 0) plse[line] = L > 0.f ? M + log2f(L) : -INFINITY;
    }
  }
  if (splits == 1) return;
  // Split-K inside the cluster: CTA k merges the (row, head) lines k, k + splits, … of every split's partial.
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = int(cluster.block_rank());
  const float* rpo[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) rpo[s] = s < splits ? cluster.map_shared_rank(po, s) : po;
  const int lines = Q * a.G;
  for (int e = tid;; e += kThreads) {
    const int li = rank + (e / D) * splits, d = e % D;
    if (li >= lines) break;  // e / D grows with e: later e only give larger lines
    const int q = li / a.G, g = li % a.G, line = q * 16 + g;
    float lse[kMaxSplits], mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      lse[s] = s < splits ? rpo[s][kMaxQ * 16 * D + line] : -INFINITY;
      mx = fmaxf(mx, lse[s]);
    }
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < splits && mx != -INFINITY) {
        const float w = exp2f(lse[s] - mx);
        num += w * rpo[s][line * D + d];
        den += w;
      }
    }
    a.out[((int64_t(t0 + q) * a.Hkv + h) * a.G + g) * D + d] = __float2bfloat16(den > 0.f ? num / den : 0.f);
  }
  cluster.sync();  // no CTA leaves while its partial may still be read
}

}  // namespace

void PagedDecodeMq::plan(int N, int Hkv, int G, int max_q, int max_pages, bool allow_split) {
  M3_CUDA_REQUIRE(N >= 0 && Hkv >= 1 && G >= 1 && G <= 16, "paged decode (mq): N %d, Hkv %d, G %d (G: 1..16)", N,
                  Hkv, G);
  M3_CUDA_REQUIRE(max_q >= 1 && max_q <= kMaxRows && max_pages >= 0 && max_q * max_pages <= kMaxEntries,
                  "paged decode (mq): %d rows × %d pages per request exceed the %d-entry union (rows ≤ %d)", max_q,
                  max_pages, kMaxEntries, kMaxRows);
  N_ = N, Hkv_ = Hkv, G_ = G;
  // Union capacity in chunks; split while N·Hkv·splits stays one wave (1 CTA per SM), each split keeping ≥ 2 chunks.
  const int chunks = std::max(2, 2 * max_q * max_pages);
  const int ctas = N * Hkv;
  splits_ = 1;
  if (allow_split && ctas > 0) splits_ = std::clamp(sm_count() / ctas, 1, std::min(kMaxSplits, chunks / 2));
  // All N·Hkv clusters must be resident at once: a cluster of `splits` CTAs at ~195 KiB of shared memory each needs
  // `splits` SMs of one GPC, so fewer clusters fit than #SMs / splits (H200, measured: 30 of 4, 15 of 8). A second
  // wave of clusters doubles the time (B = 8 at 4 splits: 32 clusters for 30 slots, bench/results/
  // 2026-12-02b-decode-mq-h200.md), so shrink the cluster until they fit.
  while (splits_ > 1 && max_active_clusters(splits_) < ctas) --splits_;
}

int PagedDecodeMq::max_active_clusters(int splits) {
  static std::atomic<int> cache[kMaxSplits + 1] = {};  // per split count, queried once (plan() runs per step)
  if (splits >= 1 && splits <= kMaxSplits && cache[splits] > 0) return cache[splits];
  M3_CUDA_CHECK(cudaFuncSetAttribute(paged_decode_mq_kernel<__nv_bfloat16>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, unsigned(splits));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1, attr.val.clusterDim.y = unsigned(splits), attr.val.clusterDim.z = 1;
  cfg.attrs = &attr, cfg.numAttrs = 1;
  int n = 0;
  M3_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, paged_decode_mq_kernel<__nv_bfloat16>, &cfg));
  if (splits >= 1 && splits <= kMaxSplits) cache[splits] = n;
  return n;
}

template <typename KvT>
void PagedDecodeMq::run(const PagedDecodeMqArgs<KvT>& a, cudaStream_t s, bool pdl) {
  if (a.N == 0) return;
  M3_CUDA_REQUIRE(a.N == N_ && a.Hkv == Hkv_ && a.G == G_,
                  "paged decode (mq): run N %d Hkv %d G %d does not match the plan (%d, %d, %d)", a.N, a.Hkv, a.G, N_,
                  Hkv_, G_);
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0 &&
                      a.stride_page % 8 == 0 && a.stride_tok % 8 == 0 && a.stride_tok >= D,
                  "paged decode (mq): q/K/V/out must be 16-byte aligned, strides multiples of 8 elements");
  static const cudaError_t attr = cudaFuncSetAttribute(
      paged_decode_mq_kernel<KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  M3_CUDA_CHECK(attr);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(a.N * a.Hkv), unsigned(splits_));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = s;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1, attrs[0].val.clusterDim.y = unsigned(splits_), attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs, cfg.numAttrs = pdl ? 2 : 1;
  M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, paged_decode_mq_kernel<KvT>, a, splits_));
}

template void PagedDecodeMq::run<__nv_bfloat16>(const PagedDecodeMqArgs<__nv_bfloat16>&, cudaStream_t, bool);

}  // namespace m3::cuda
