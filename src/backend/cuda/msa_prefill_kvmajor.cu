// KV-block-major MSA prefill on tensor cores (msa_prefill_kvmajor.cuh). Per run, all on the device:
//   1. count:   one thread per selection entry (h, t, slot): logical block → physical page through the row's page
//               table; CSR row r = (h · windows + t / window) · P + page (one window unless set_order asks for
//               more); rank = atomicAdd(cnt[r]) (its place in the row).
//   2. pack + exclusive scan (CUB) of (cnt[r], tiles[r] = ⌈cnt[r] / 4⌉) packed in one 64-bit word: row offsets
//      and tile offsets in one pass (the low half never carries: Σ cnt < 2^32).
//   3. scatter: csr[off[r] + rank] = t | slot << 24;  tile emit: tiles[toff[r] + j] = (r, j); n_tiles on device.
//   4. attention: persistent grid (one CTA per SM, 4 warpgroups); CTA c takes runs of `chunk` tiles c·chunk,
//      (c + grid)·chunk, …, so the CTAs work on neighbouring tiles of one page at a time; a CTA keeps a page's K
//      and V in shared memory while its consecutive tiles share the page (Q alone is gathered per tile).
//      Warpgroup 0: warps 1–3 resolve the metadata of groups of 8 tiles (lane = tile · 4 + entry) into a
//      shared-memory ring; the TMA warp (warp 0), when a tile's row differs from the previous one, loads the page's
//      K and V [128 keys, 128] (two 64-channel 128B-swizzled TMA boxes each) into the next slot of a 2-slot K/V
//      ring — once every tile that read the slot's previous page is done — and per tile gathers the Q rows
//      [16 heads, 128] of each of the ≤ 4 queries (one TMA box pair per query) into a 6-stage Q ring, with
//      (t, slot, visible, h | K/V slot | its load parity) in shared memory.
//      Consumers: warpgroups 1–3 take the CTA's tiles in turn (tile j → warpgroup 1 + j % 3; warp = one query, its
//      16 heads = 16 MMA rows): S = Q·Kᵀ (8 × wgmma m64n128k16), keys ≥ the query's visible count masked (its
//      local page: p % 128 + 1), single-pass softmax in the log2 domain, O = P·V (8 × wgmma, P from registers, V
//      read N-major), then O / l as bf16 staged in the warp's dead Q rows and stored as one contiguous 4 KiB block
//      to o_part[slot, t, h·16 .. +15], m + log2 l to lse_part[slot, t, head].
//   5. combine: one CTA per 8 rows × KV head: M = max over valid slots of LSE, w = 2^(LSE − M), out = Σ w·O / Σ w;
//      the ≤ 16 partial loads of a thread are all issued before the first is used (bytes in flight, not latency,
//      bound it).
// Rows of the CSR are keyed by physical page, so queries of different sequences that share a cached prefix page
// are served by one load of it. Tiles are ordered by row: CTAs that run at the same time mostly share pages in L2.
#include "backend/cuda/msa_prefill_kvmajor.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cub/cub.cuh>

#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"

namespace m3::cuda {
namespace {

using namespace hopper;

// Attention tiles are kTok queries × 16 heads = 64 MMA rows (one m64 wgmma row block, one consumer warpgroup);
// the router (msa_prefill_sparse.cuh) and the combine work on tiles of kRouteRows step rows.
constexpr int kTok = 4, kRouteRows = 8, kG = 16, kD = 128, kB = 128;
// Three consumer warpgroups, each on its own tiles (CTA-local tile j → consumer j % 3): while one waits for its
// MMAs, the others run softmax or store partials. Every tile is one S, one softmax, one P·V and a full 16 KiB
// partial store, so unlike a flash-attention loop nothing amortises the per-tile tail; more warpgroups in flight
// hide it (2 consumer warpgroups: 3.2 ms at 16k, ncu 52 % issue-busy, 38 % DRAM).
// (The consumer count is a template parameter so the benchmark can compare 2 and 3.)
constexpr int kQStages = 6, kKvStages = 2;
template <int Consumers>
constexpr int kThreadsFor = 128 * (1 + Consumers);
// Registers per consumer thread: 65536 / (128 threads) = 512 per warpgroup slot, 40 for the producer warpgroup.
template <int Consumers>
constexpr uint32_t kConsumerRegs = Consumers == 2 ? 232u : 152u;
constexpr uint32_t kQBox = kTok * kG * 128;     // [64 rows, 64 bf16] 128B-swizzled: 8 KiB
constexpr uint32_t kKvBox = kB * 128;           // [128 keys, 64 bf16] 128B-swizzled: 16 KiB
constexpr uint32_t kQTokBytes = kG * 128;       // one query's [16 heads, 64 channels] box: 2 KiB
constexpr uint32_t kQStageBytes = 2 * kQBox;    // Q of 4 queries, 2 channel boxes
constexpr uint32_t kKvStageBytes = 4 * kKvBox;  // K (2 boxes) + V (2 boxes) of one page
// Tile metadata is resolved by kMetaWarps warps of warpgroup 0, one group of kGroupTiles tiles each in turn (lane =
// tile · kTok + entry), into a ring of kMetaWarps groups (warp w always fills slot w − 1): (t | slot << 24 or −1,
// visible) per entry and (n, h, page, row) per tile.
constexpr int kMetaWarps = 3, kGroupTiles = 32 / kTok;
struct MetaGroup {
  int2 e[kGroupTiles][kTok];
  int4 info[kGroupTiles];
};
constexpr size_t kSmem = 1024 + kQStages * kQStageBytes + kKvStages * kKvStageBytes +
                         8 * (2 * kQStages + kKvStages + 2 * kMetaWarps) + kQStages * kTok * 16 +
                         kMetaWarps * sizeof(MetaGroup);
static_assert(kSmem <= 232448, "shared memory over the sm_90 per-block limit");
// Bits of the meta .w word above the KV head: the tile's K/V slot and the parity of that slot's load.
constexpr int kMetaSlotShift = 16, kMetaParityShift = 20;

// ---- CSR build --------------------------------------------------------------------------------------------------

struct EdgeParams {
  const int32_t* selection;  // [Hkv, T, K]
  const int32_t* pos;
  const int32_t* row_seq;
  const int32_t* pt_indptr;
  const int32_t* pt_pages;
  int* cnt;       // [Hkv · P]
  int* rank;      // [E]: place of the entry in its row, −1 when not an edge
  int* edge_row;  // [E]
  int* error;
  const uint8_t* route;  // [⌈T / 8⌉, Hkv]: 0 = the union-tile kernel serves this tile (no edges here); or null
  const int* routed;     // tiles routed here (0: nothing to do), or null
  int64_t E;
  int T, K, P, Hkv;
  int window, n_windows;  // CSR rows are (h, t / window, page); window = T, n_windows = 1 without windows
};

// Grid-stride over the entries with a grid of a few CTAs per SM: a step whose tiles all went to the union-tile
// kernel (routed == 0) then costs a few hundred CTAs that read one int, not one CTA per 256 entries.
__global__ void kvm_count_kernel(const EdgeParams p) {
  if (p.routed && *p.routed == 0) return;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < p.E; e += int64_t(gridDim.x) * blockDim.x) {
    const int b = p.selection[e];
    int rank = -1;
    if (b >= 0) {
      const int64_t ht = e / p.K;
      const int t = int(ht % p.T), h = int(ht / p.T);
      const int local = p.pos[t] / kB;
      if (p.route && !p.route[(t / kRouteRows) * p.Hkv + h]) {
        // served by the union-tile kernel, which checks the contract itself
      } else if (b > local) {
        atomicOr(p.error, 1);
      } else {
        const int page = p.pt_pages[p.pt_indptr[p.row_seq[t]] + b];
        const int r = (h * p.n_windows + t / p.window) * p.P + page;
        p.edge_row[e] = r;
        rank = atomicAdd(&p.cnt[r], 1);
      }
    }
    p.rank[e] = rank;
  }
}

__global__ void kvm_pack_kernel(const int* cnt, unsigned long long* packed, int64_t rows, const int* routed) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows || (routed && *routed == 0)) return;  // the scan then reads stale words; nothing uses its result
  const unsigned c = unsigned(cnt[r]);
  packed[r] = (unsigned long long)c | ((unsigned long long)((c + kTok - 1) / kTok) << 32);
}

__global__ void kvm_scatter_kernel(const EdgeParams p, const unsigned long long* off, int* csr) {
  if (p.routed && *p.routed == 0) return;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < p.E; e += int64_t(gridDim.x) * blockDim.x) {
    const int rank = p.rank[e];
    if (rank < 0) continue;
    const int64_t ht = e / p.K;
    const int t = int(ht % p.T), slot = int(e % p.K);
    csr[uint32_t(off[p.edge_row[e]]) + rank] = t | (slot << 24);
  }
}

__global__ void kvm_tiles_kernel(const int* cnt, const unsigned long long* off, int64_t rows, int2* tiles,
                                 int* n_tiles, const int* routed) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  if (routed && *routed == 0) {  // no tile: the attention kernel must see 0, not the previous run's count
    if (r == 0) *n_tiles = 0;
    return;
  }
  const int c = cnt[r], nt = (c + kTok - 1) / kTok;
  const int toff = int(off[r] >> 32);
  for (int j = 0; j < nt; ++j) tiles[toff + j] = make_int2(int(r), j);
  if (r == rows - 1) *n_tiles = toff + nt;
}

// ---- attention --------------------------------------------------------------------------------------------------

struct Params {
  const int32_t* selection;  // [Hkv, T, K]
  const int32_t* pos;
  const int* cnt;
  const unsigned long long* off;
  const int* csr;
  const int2* tiles;
  const int* n_tiles;
  __nv_bfloat16* o_part;  // [K, T, Hq, D]
  float* lse_part;        // [K, T, Hq] (log2 domain)
  int T, Hkv, K, P;
  int rows_per_head;  // n_windows · P: row r is KV head r / rows_per_head, page r % P
  int chunk;          // consecutive tiles per CTA turn
  float scale_log2;
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// kTmaStore: each warp's staged 4 KiB partial block leaves by two TMA stores (one thread) instead of 8 shared loads
// and 8 global stores per lane — fewer instructions in the per-tile tail (an A/B knob until measured).
template <int kConsumers, bool kTmaStore>
__global__ void __launch_bounds__(kThreadsFor<kConsumers>, 1)
    msa_prefill_kvmajor_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                               const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o,
                               const Params p) {
  static_assert(kQStages % kConsumers == 0, "a consumer's tiles always use the same Q stages");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q_ring = smem;                                   // [kQStages][Q box 0, Q box 1]
  uint8_t* kv_ring = q_ring + kQStages * kQStageBytes;      // [kKvStages][K box 0, K box 1, V box 0, V box 1]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(kv_ring + kKvStages * kKvStageBytes);
  uint64_t* q_empty = q_full + kQStages;
  uint64_t* kv_full = q_empty + kQStages;
  uint64_t* meta_full = kv_full + kKvStages;
  uint64_t* meta_empty = meta_full + kMetaWarps;
  int4* meta = reinterpret_cast<int4*>(meta_empty + kMetaWarps);  // [kQStages][kTok]: (t or −1, slot, visible, h|bits)
  MetaGroup* groups = reinterpret_cast<MetaGroup*>(meta + kQStages * kTok);  // [kMetaWarps]

  const int wg = warpgroup_index();
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
    if (kTmaStore) tma_prefetch_map(&map_o);
    for (int s = 0; s < kQStages; ++s) {
      mbar_init(&q_full[s], 1);
      mbar_init(&q_empty[s], 4);  // lane 0 of each warp of the tile's consumer warpgroup
    }
    for (int s = 0; s < kKvStages; ++s) mbar_init(&kv_full[s], 1);
    for (int s = 0; s < kMetaWarps; ++s) {
      mbar_init(&meta_full[s], 1);
      mbar_init(&meta_empty[s], 1);
    }
    fence_barrier_init();
  }
  __syncthreads();
  pdl_grid_dependency_wait();
  const int n_tiles = *p.n_tiles;
  // This CTA's tiles, j = 0 .. n_my − 1: runs of p.chunk consecutive tiles, the runs dealt round-robin to the CTAs,
  // so the CTAs work on neighbouring tiles at the same time (a page and a window's Q are read from HBM about once
  // and served to the others from L2) while a CTA keeps a page's K and V across the tiles of its run.
  const int span = int(gridDim.x) * p.chunk, rounds = n_tiles / span;
  const int n_my = rounds * p.chunk + min(max(n_tiles - rounds * span - int(blockIdx.x) * p.chunk, 0), p.chunk);
  auto tile_of = [&](int j) { return (j / p.chunk) * span + int(blockIdx.x) * p.chunk + j % p.chunk; };

  if (wg == 0) {
    setmaxnreg_dec<40>();
    const int warp0 = threadIdx.x / 32;
    if (warp0 >= 1 && warp0 <= kMetaWarps) {
      // Metadata warps. A tile's metadata is a chain of dependent loads (tile → row offset/count → CSR entry →
      // selection/position); a warp resolves kGroupTiles tiles at once, and kMetaWarps warps work on consecutive
      // groups at the same time, so the chain's latency is hidden from the TMA warp.
      const int ms = warp0 - 1, k = lane / kTok, i = lane % kTok;
      MetaGroup* g = &groups[ms];
      uint32_t parity = 1u;  // a fresh barrier counts as a completed previous phase
      for (int jb = kGroupTiles * ms; jb < n_my; jb += kGroupTiles * kMetaWarps) {
        const bool mine = jb + k < n_my;
        const int tile = mine ? tile_of(jb + k) : 0;
        int n = 0, h = 0, page = 0, row = -1, packed = -1, visible = 0;
        if (mine) {
          const int2 tj = p.tiles[tile];
          row = tj.x;
          h = tj.x / p.rows_per_head;
          page = tj.x % p.P;
          n = min(kTok, p.cnt[tj.x] - tj.y * kTok);
          if (i < n) {
            const int e = p.csr[int(uint32_t(p.off[tj.x])) + tj.y * kTok + i];
            const int t = e & 0xFFFFFF, slot = e >> 24;
            const int b = p.selection[(int64_t(h) * p.T + t) * p.K + slot];
            const int pos = p.pos[t];
            visible = b == pos / kB ? pos % kB + 1 : kB;
            packed = e;
          }
        }
        if (lane == 0) mbar_wait(&meta_empty[ms], parity);
        parity ^= 1u;
        __syncwarp();
        if (mine) {
          g->e[k][i] = make_int2(packed, visible);
          if (i == 0) g->info[k] = make_int4(n, h, page, row);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&meta_full[ms]);
      }
    } else if (warp0 == 0) {
      // TMA warp: per tile, the page's K and V when the row changes, and the Q gather, from the resolved groups.
      // A K/V slot is refilled only when every tile that read its previous page is done. Those tiles ran on the
      // consumers in turn and each consumer finishes its tiles in order, so it is enough that the last (up to)
      // kConsumers of them released their Q stages; older ones are known done when their Q stage was refilled.
      static_assert(kKvStages == 2, "the slot state below is two registers per field");
      PipeState<kQStages> qs;
      int cur_row = -1, kv_slot = kKvStages - 1;
      // Per K/V slot (selected by kv_slot, kept in registers): first and last CTA-local tile on its current page,
      // and how many pages it has been loaded with (its kv_full parity).
      int first0 = -1, first1 = -1, last0 = -1, last1 = -1, loads0 = 0, loads1 = 0;
      for (int jb = 0, gi = 0; jb < n_my; jb += kGroupTiles, ++gi) {
        const int ms = gi % kMetaWarps;
        mbar_wait(&meta_full[ms], uint32_t(gi / kMetaWarps) & 1u);
        const MetaGroup* g = &groups[ms];
        for (int kk = 0; kk < kGroupTiles; ++kk) {
          const int j = jb + kk;
          if (j >= n_my) break;  // warp-uniform
          const int4 info = g->info[kk];
          const int nk = info.x, hk = info.y, pk = info.z, rk = info.w;
          if (rk != cur_row) {  // a new page: its K and V into the next slot of the K/V ring
            kv_slot ^= 1;
            if (lane == 0) {
              const int first = kv_slot ? first1 : first0, last = kv_slot ? last1 : last0;
              for (int i = max(first, last - (kConsumers - 1)); i >= 0 && i <= last; ++i)
                if (i + kQStages >= j) mbar_wait(&q_empty[i % kQStages], uint32_t(i / kQStages) & 1u);
              mbar_arrive_expect_tx(&kv_full[kv_slot], 4 * kKvBox);
              uint8_t* kvs = kv_ring + kv_slot * kKvStageBytes;
              for (int b = 0; b < 2; ++b) {
                tma_load_3d(kvs + b * kKvBox, &map_k, &kv_full[kv_slot], 64 * b, hk * kB, pk);
                tma_load_3d(kvs + (2 + b) * kKvBox, &map_v, &kv_full[kv_slot], 64 * b, hk * kB, pk);
              }
            }
            if (kv_slot) {
              ++loads1;
              first1 = j;
            } else {
              ++loads0;
              first0 = j;
            }
            cur_row = rk;
          }
          if (kv_slot)
            last1 = j;
          else
            last0 = j;
          const int parity = ((kv_slot ? loads1 : loads0) - 1) & 1;
          const int hw = hk | (kv_slot << kMetaSlotShift) | (parity << kMetaParityShift);
          uint8_t* st = q_ring + qs.stage * kQStageBytes;
          if (lane == 0) mbar_wait(&q_empty[qs.stage], qs.phase ^ 1u);
          __syncwarp();
          int t = -1;
          if (lane < kTok) {
            const int2 e = g->e[kk][lane];
            t = e.x < 0 ? -1 : e.x & 0xFFFFFF;
            meta[qs.stage * kTok + lane] = make_int4(t, e.x < 0 ? 0 : e.x >> 24, e.y, hw);
          }
          __syncwarp();
          if (lane == 0) mbar_arrive_expect_tx(&q_full[qs.stage], uint32_t(nk) * 2 * kQTokBytes);
          __syncwarp();
          // The Q gather: lane i loads query i's [16 heads, 128] (two boxes).
          if (lane < nk)
            for (int b = 0; b < 2; ++b)
              tma_load_3d(st + b * kQBox + lane * kQTokBytes, &map_q, &q_full[qs.stage], 64 * b, hk * kG, t);
          qs.advance();
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&meta_empty[ms]);
      }
    }
    pdl_launch_dependents();
  } else {
    setmaxnreg_inc<kConsumerRegs<kConsumers>>();
    const int c = wg - 1, warp = (threadIdx.x % 128) / 32;
    const int Hq = p.Hkv * kG;
    for (int j = c; j < n_my; j += kConsumers) {
      const int stage = j % kQStages;
      mbar_wait(&q_full[stage], uint32_t(j / kQStages) & 1u);
      const int4 mine = meta[stage * kTok + warp];  // this warp's query: (t, slot, visible, h | bits)
      const int4 lead = meta[stage * kTok];         // warpgroup-uniform: query 0 of a tile is always present
      const int kv_slot = (lead.w >> kMetaSlotShift) & 0xF;
      mbar_wait(&kv_full[kv_slot], uint32_t(lead.w >> kMetaParityShift) & 1u);
      uint8_t* st = q_ring + stage * kQStageBytes;
      uint8_t* kvs = kv_ring + kv_slot * kKvStageBytes;
      // A warp without a query (tiles of < 4) computes on stale Q rows; its rows are independent and not stored.
      const int visible = mine.x >= 0 ? mine.z : 0;
      const uint64_t dq = smem_desc_sw128(st);
      const uint64_t dk = smem_desc_sw128(kvs);
      float s[64];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        Wgmma<bf16_t, 128>::mma_ss(s, desc_advance(dq, (kk / 4) * kQBox + (kk % 4) * 32),
                                   desc_advance(dk, (kk / 4) * kKvBox + (kk % 4) * 32), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);

      // Single-pass softmax in the log2 domain: m over the raw scores, then 2^(s·c − m·c) as one FMA + ex2.
      // Keys ≥ visible exist only on a query's local page (warp-uniform: a warp is one query).
      if (visible < kB) {
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
          if (col >= visible) s[i] = -INFINITY;
        }
      }
      float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < 64; i += 4) {
        m0 = fmaxf(m0, fmaxf(s[i], s[i + 1]));
        m1 = fmaxf(m1, fmaxf(s[i + 2], s[i + 3]));
      }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
      }
      const float c2 = p.scale_log2;
      const float nb0 = m0 == -INFINITY ? 0.f : -m0 * c2, nb1 = m1 == -INFINITY ? 0.f : -m1 * c2;
      float l0 = 0.f, l1 = 0.f;
      uint32_t pa[8][4];
#pragma unroll
      for (int i = 0; i < 64; i += 2) {
        const bool r0 = (i / 2) % 2 == 0;
        const float e0 = exp2f(fmaf(s[i], c2, r0 ? nb0 : nb1)), e1 = exp2f(fmaf(s[i + 1], c2, r0 ? nb0 : nb1));
        if (r0)
          l0 += e0 + e1;
        else
          l1 += e0 + e1;
        pa[i / 8][(i % 8) / 2] = pack_bf16(e0, e1);
      }
      float o[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] = 0.f;
      const uint64_t dv = smem_desc_sw128_mn(kvs + 2 * kKvBox, kKvBox);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) Wgmma<bf16_t, 128>::mma_rs_nmajor(o, pa[kk], desc_advance(dv, kk * 2048));
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);

#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
      }
      // Stage this warp's normalised [16 heads, 128] bf16 in its own (now dead) Q rows of the stage, 16-byte
      // chunks XOR-swizzled by row so the 4-byte fragment writes hit 32 distinct banks, then write the 4 KiB
      // partial row block with coalesced 16-byte stores (o_part[slot, t, h·16 .. h·16 + 15, :] is contiguous).
      uint8_t* stage_o = st + warp * (kG * 128);  // box 0 rows of this warp: 2 KiB; box 1: +kQBox
      if (mine.x >= 0) {
        const float i0 = 1.f / l0, i1 = 1.f / l1;  // visible ≥ 1: l ≥ 1
        const int r0 = lane / 4, r1 = r0 + 8;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {  // channels 8jj .. 8jj + 7: chunk jj % 8 of box jj / 8
          uint8_t* box = stage_o + (jj / 8) * kQBox;
          const int ch = jj % 8;
          *reinterpret_cast<uint32_t*>(box + r0 * 128 + ((ch ^ (r0 % 8)) * 16) + 4 * (lane % 4)) =
              pack_bf16(o[4 * jj] * i0, o[4 * jj + 1] * i0);
          *reinterpret_cast<uint32_t*>(box + r1 * 128 + ((ch ^ (r1 % 8)) * 16) + 4 * (lane % 4)) =
              pack_bf16(o[4 * jj + 2] * i1, o[4 * jj + 3] * i1);
        }
        const int64_t row = (int64_t(mine.y) * p.T + mine.x) * Hq + (mine.w & 0xFFFF) * kG;
        if (lane % 4 == 0) {
          p.lse_part[row + r0] = -nb0 + log2f(l0);
          p.lse_part[row + r1] = -nb1 + log2f(l1);
        }
        if constexpr (kTmaStore) {
          // The staging layout is the 128B-swizzled box layout: o_part viewed as [K·T rows, Hq, D], box [1, 16, 64].
          fence_proxy_async_smem();
          __syncwarp();
          if (lane == 0) {
            const int orow = mine.y * p.T + mine.x, h16 = (mine.w & 0xFFFF) * kG;
            tma_store_3d(&map_o, stage_o, 0, h16, orow);
            tma_store_3d(&map_o, stage_o + kQBox, 64, h16, orow);
            tma_store_commit();
          }
        } else {
          __syncwarp();
          uint4* dst = reinterpret_cast<uint4*>(p.o_part + row * kD);  // 16 rows × 16 chunks of 16 bytes
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const int idx = q * 32 + lane, r = idx / 16, ch16 = idx % 16;  // row r, 16-byte chunk ch16 of 256 B
            const uint8_t* box = stage_o + (ch16 / 8) * kQBox;
            dst[idx] = *reinterpret_cast<const uint4*>(box + r * 128 + (((ch16 % 8) ^ (r % 8)) * 16));
          }
        }
      }
      __syncwarp();
      fence_proxy_async_smem();  // generic writes to the stage before the next TMA fill of it
      if (lane == 0) {
        if constexpr (kTmaStore) tma_store_wait_read<0>();  // the stores have read the stage (none pending: no wait)
        mbar_arrive(&q_empty[stage]);
      }
    }
  }
}

// ---- combine ----------------------------------------------------------------------------------------------------

struct CombineParams {
  const int32_t* selection;  // [Hkv, T, K]
  const int32_t* pos;
  const __nv_bfloat16* o_part;
  const float* lse_part;
  float* out;                 // [T, Hq, D] fp32, or null when out_bf16 is given
  __nv_bfloat16* out_bf16;    // [T, Hq, D] bf16 (what the O projection reads), or null
  const uint8_t* route;
  int T, Hq, K;
};

// One CTA (256 threads) per (tile of 8 rows, KV head h) — the router's unit, so a routed-away tile costs one byte
// read. (1) validity of each (row, slot): a selected block at or before the row's local block; (2) per (row, head)
// the slot weights w = 2^(LSE − max) in shared memory (0 for slots that are not edges) and 1 / Σ w; (3) per row,
// thread i owns channels 8i .. 8i + 7 of the row's 16 heads × 128 (head i / 16) and requests all of its ≤ 16
// partial pieces (16 bytes each) before it uses the first: 64 KiB in flight per CTA, so the kernel runs at the
// memory system's rate instead of one round trip per slot. A row with no edge gets O = 0.
__global__ void __launch_bounds__(256) kvm_combine_kernel(const CombineParams p) {
  __shared__ float w_s[kRouteRows][kG][16];  // [row][head][slot]
  __shared__ float inv_s[kRouteRows][kG];
  __shared__ uint32_t valid_s[kRouteRows];
  pdl_grid_dependency_wait();
  const int tile = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int Hkv = p.Hq / kG;
  if (p.route && !p.route[tile * Hkv + h]) return;  // the union-tile kernel wrote these rows
  if (tid < kRouteRows * 16) {  // thread = (row tid / 16, slot tid % 16); a warp covers two rows
    const int rl = tid / 16, sl = tid % 16, t = tile * kRouteRows + rl;
    bool v = false;
    if (t < p.T && sl < p.K) {
      const int b = p.selection[(int64_t(h) * p.T + t) * p.K + sl];
      v = b >= 0 && b <= p.pos[t] / kB;
    }
    const uint32_t m = __ballot_sync(0xffffffffu, v);
    if (sl == 0) valid_s[rl] = (m >> (16 * (rl % 2))) & 0xFFFFu;
  }
  __syncthreads();
  {  // thread = (row tid / 32, head (tid % 32) / 2, slots 8·(tid % 2) .. +7)
    const int rl = tid / 32, g = (tid % 32) / 2, half = tid % 2, t = tile * kRouteRows + rl;
    const uint32_t valid = valid_s[rl];
    float lse[8], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int sl = 8 * half + j;
      lse[j] = valid >> sl & 1u ? __ldcs(p.lse_part + (int64_t(sl) * p.T + t) * p.Hq + h * kG + g) : -INFINITY;
      mx = fmaxf(mx, lse[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float den = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float w = valid >> (8 * half + j) & 1u ? exp2f(lse[j] - mx) : 0.f;
      w_s[rl][g][8 * half + j] = w;
      den += w;
    }
    den += __shfl_xor_sync(0xffffffffu, den, 1);
    if (half == 0) inv_s[rl][g] = den > 0.f ? 1.f / den : 0.f;
  }
  __syncthreads();
  const int g = tid / 16;  // this thread's head; channels 8·(tid % 16) .. +7 of it
  for (int rl = 0; rl < kRouteRows; ++rl) {
    const int t = tile * kRouteRows + rl;
    if (t >= p.T) break;
    const uint32_t valid = valid_s[rl];
    const int64_t col = (int64_t(h) * kG) * kD + 8 * tid;  // element offset of this thread's piece in a row
    uint4 raw[16];
#pragma unroll
    for (int sl = 0; sl < 16; ++sl) {
      raw[sl] = make_uint4(0u, 0u, 0u, 0u);
      if (valid >> sl & 1u)
        raw[sl] = __ldcs(reinterpret_cast<const uint4*>(p.o_part + (int64_t(sl) * p.T + t) * p.Hq * kD + col));
    }
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int sl = 0; sl < 16; ++sl) {
      if (!(valid >> sl & 1u)) continue;
      const float w = w_s[rl][g][sl];
      const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&raw[sl]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(v2[j]);
        acc[2 * j] += w * f.x;
        acc[2 * j + 1] += w * f.y;
      }
    }
    const float inv = inv_s[rl][g];
    const int64_t o = int64_t(t) * p.Hq * kD + col;
    if (p.out_bf16) {
      uint4 packed;
      uint32_t* pw = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
      for (int j = 0; j < 4; ++j) pw[j] = pack_bf16(acc[2 * j] * inv, acc[2 * j + 1] * inv);
      *reinterpret_cast<uint4*>(p.out_bf16 + o) = packed;
    } else {
      float4* dst = reinterpret_cast<float4*>(p.out + o);
      dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
    }
  }
}

// The attention kernel for 2 or 3 consumer warpgroups (launched with kThreadsFor<consumers> threads) and either
// epilogue.
using AttentionKernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, Params);
AttentionKernel attention_kernel(int consumers, bool tma_store) {
  if (consumers == 2) return tma_store ? msa_prefill_kvmajor_kernel<2, true> : msa_prefill_kvmajor_kernel<2, false>;
  return tma_store ? msa_prefill_kvmajor_kernel<3, true> : msa_prefill_kvmajor_kernel<3, false>;
}

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void MsaPrefillKvMajor::plan(int64_t T, int num_kv_heads, int group, int head_dim, int block_size, int top_k,
                             int64_t num_pages) {
  M3_CUDA_REQUIRE(head_dim == kD && block_size == kB && group == kG && top_k >= 1 && top_k <= 16,
                  "MsaPrefillKvMajor supports D 128, block 128, 16 query heads per KV head, top_k <= 16 (got D %d, "
                  "block %d, group %d, top_k %d)",
                  head_dim, block_size, group, top_k);
  M3_CUDA_REQUIRE(T >= 0 && T < (int64_t(1) << 24) && num_kv_heads >= 1 && num_pages >= 1 &&
                      int64_t(num_kv_heads) * num_pages < (int64_t(1) << 31),
                  "MsaPrefillKvMajor: bad T %lld / Hkv %d / pages %lld", (long long)T, num_kv_heads,
                  (long long)num_pages);
  n_windows_ = window_ > 0 ? int((T + window_ - 1) / window_) : 1;
  M3_CUDA_REQUIRE(int64_t(num_kv_heads) * n_windows_ * num_pages < (int64_t(1) << 31),
                  "MsaPrefillKvMajor: %d KV heads x %d windows x %lld pages is too many CSR rows", num_kv_heads,
                  n_windows_, (long long)num_pages);
  T_ = T;
  P_ = num_pages;
  Hkv_ = num_kv_heads;
  G_ = group;
  K_ = top_k;
  if (error_.size() == 0) {
    error_.grow(1);
    M3_CUDA_CHECK(cudaMemset(error_.get(), 0, sizeof(int)));
    n_tiles_.grow(1);
    int dev = 0;
    M3_CUDA_CHECK(cudaGetDevice(&dev));
    M3_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
  }
  const int64_t rows = int64_t(Hkv_) * n_windows_ * P_, E = int64_t(Hkv_) * T_ * K_;
  cnt_.grow(size_t(rows));
  packed_.grow(size_t(rows));
  packed_off_.grow(size_t(rows));
  rank_.grow(size_t(std::max<int64_t>(E, 1)));
  edge_row_.grow(size_t(std::max<int64_t>(E, 1)));
  csr_.grow(size_t(std::max<int64_t>(E, 1)));
  // Σ ⌈cnt / 8⌉ ≤ E / 8 + (rows with an edge) ≤ E / 8 + min(E, rows).
  tiles_.grow(size_t(E / kTok + std::min(E, rows) + 1));
  const int64_t Hq = int64_t(Hkv_) * G_;
  o_part_.grow(size_t(std::max<int64_t>(int64_t(K_) * T_ * Hq * kD, 1)));
  lse_part_.grow(size_t(std::max<int64_t>(int64_t(K_) * T_ * Hq, 1)));
  size_t need = 0;
  M3_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, need, packed_.get(), packed_off_.get(), int(rows)));
  if (need > scan_tmp_bytes_) {
    scan_tmp_.grow(need);
    scan_tmp_bytes_ = need;
  }
}

size_t MsaPrefillKvMajor::workspace_bytes() const {
  return cnt_.size() * 4 + packed_.size() * 16 + rank_.size() * 12 + tiles_.size() * 8 + o_part_.size() * 2 +
         lse_part_.size() * 4 + scan_tmp_bytes_;
}

void MsaPrefillKvMajor::run(const uint16_t* q, const int32_t* selection, const DevStepRows& rows,
                            const DevPagedKVBf16& kv, float scale, float* out, cudaStream_t s, const uint8_t* route,
                            const int* routed, uint16_t* out_bf16) {
  M3_CUDA_REQUIRE(rows.T == T_, "MsaPrefillKvMajor::run: %d rows, planned for %lld", rows.T, (long long)T_);
  M3_CUDA_REQUIRE(kv.num_kv_heads == Hkv_ && kv.head_dim == kD && kv.block_size == kB && kv.num_pages == P_,
                  "MsaPrefillKvMajor::run: cache shape does not match the plan");
  M3_CUDA_REQUIRE(selection != nullptr, "MsaPrefillKvMajor::run: no selection");
  if (T_ == 0) return;
  static const bool configured = [] {
    for (int c : {2, 3})
      for (bool tma : {false, true})
        M3_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel(c, tma), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(kSmem)));
    return true;
  }();
  (void)configured;
  const int64_t nrows = int64_t(Hkv_) * n_windows_ * P_, E = int64_t(Hkv_) * T_ * K_;
  const int Hq = Hkv_ * G_;
  const int window = window_ > 0 ? window_ : int(std::max<int64_t>(T_, 1));

  if (profile_) M3_CUDA_CHECK(cudaEventRecord(ev_.e[0], s));
  // 1–3: the block → queries CSR and the tile list.
  M3_CUDA_CHECK(cudaMemsetAsync(cnt_.get(), 0, size_t(nrows) * 4, s));
  const EdgeParams ep{selection,   rows.pos,        rows.row_seq, rows.pt_indptr, rows.pt_pages, cnt_.get(),
                      rank_.get(), edge_row_.get(), error_.get(), route,          routed, E,             int(T_),
                      K_,          int(P_),         Hkv_,         window,         n_windows_};
  const unsigned edge_grid = unsigned(std::min<int64_t>(blocks_for(E, 256), int64_t(8) * sms_));
  kvm_count_kernel<<<edge_grid, 256, 0, s>>>(ep);
  M3_CUDA_LAUNCH_CHECK();
  kvm_pack_kernel<<<blocks_for(nrows, 256), 256, 0, s>>>(cnt_.get(), packed_.get(), nrows, routed);
  M3_CUDA_LAUNCH_CHECK();
  size_t tmp = scan_tmp_bytes_;
  M3_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(scan_tmp_.get(), tmp, packed_.get(), packed_off_.get(), int(nrows), s));
  kvm_scatter_kernel<<<edge_grid, 256, 0, s>>>(ep, packed_off_.get(), csr_.get());
  M3_CUDA_LAUNCH_CHECK();
  kvm_tiles_kernel<<<blocks_for(nrows, 256), 256, 0, s>>>(cnt_.get(), packed_off_.get(), nrows, tiles_.get(),
                                                          n_tiles_.get(), routed);
  M3_CUDA_LAUNCH_CHECK();

  if (profile_) M3_CUDA_CHECK(cudaEventRecord(ev_.e[1], s));
  // 4: attention over the tiles.
  const uint64_t qdims[3] = {uint64_t(kD), uint64_t(Hq), uint64_t(T_)}, qstr[2] = {uint64_t(kD), uint64_t(Hq) * kD};
  const uint32_t qbox[3] = {64, uint32_t(kG), 1};
  const CUtensorMap mq = make_tma_map_3d(q, TmaDtype::BF16, qdims, qstr, qbox, TmaSwizzle::B128);
  const uint64_t kdims[3] = {uint64_t(kD), uint64_t(Hkv_) * kB, uint64_t(kv.num_pages)};
  const uint64_t kstr[2] = {uint64_t(kD), uint64_t(kv.page_stride)};
  const uint32_t kbox[3] = {64, uint32_t(kB), 1};
  const CUtensorMap mk = make_tma_map_3d(kv.k, TmaDtype::BF16, kdims, kstr, kbox, TmaSwizzle::B128);
  const CUtensorMap mv = make_tma_map_3d(kv.v, TmaDtype::BF16, kdims, kstr, kbox, TmaSwizzle::B128);
  const Params p{selection,       rows.pos,           cnt_.get(),        packed_off_.get(),
                 csr_.get(),      tiles_.get(),       n_tiles_.get(),    reinterpret_cast<__nv_bfloat16*>(o_part_.get()),
                 lse_part_.get(), int(T_),            Hkv_,              K_,
                 int(P_),         int(n_windows_ * P_), chunk_,         float(scale * 1.4426950408889634)};
  // o_part [K·T, Hq, D] for the TMA-store epilogue: a box is one (slot, t) row's 16 heads × 64 channels. The other
  // epilogue never reads the map (any valid map fills the parameter).
  CUtensorMap mo = mq;
  if (tma_store_) {
    const uint64_t odims[3] = {uint64_t(kD), uint64_t(Hq), uint64_t(K_) * uint64_t(T_)};
    const uint64_t ostr[2] = {uint64_t(kD), uint64_t(Hq) * kD};
    const uint32_t obox[3] = {64, uint32_t(kG), 1};
    mo = make_tma_map_3d(o_part_.get(), TmaDtype::BF16, odims, ostr, obox, TmaSwizzle::B128);
  }
  attention_kernel(consumers_, tma_store_)<<<unsigned(sms_), 128 * (1 + consumers_), kSmem, s>>>(mq, mk, mv, mo, p);
  M3_CUDA_LAUNCH_CHECK();
  if (profile_) M3_CUDA_CHECK(cudaEventRecord(ev_.e[2], s));

  // 5: combine, chained by programmatic dependent launch (its prologue overlaps the attention's tail).
  const CombineParams cp{selection, rows.pos, reinterpret_cast<const __nv_bfloat16*>(o_part_.get()),
                         lse_part_.get(), out_bf16 ? nullptr : out, reinterpret_cast<__nv_bfloat16*>(out_bf16), route,
                         int(T_), Hq, K_};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned((T_ + kRouteRows - 1) / kRouteRows), unsigned(Hkv_));
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kvm_combine_kernel, cp));
  if (profile_) M3_CUDA_CHECK(cudaEventRecord(ev_.e[3], s));
}

void MsaPrefillKvMajor::set_order(int window, int chunk, int consumers, bool tma_store) {
  tma_store_ = tma_store;
  M3_CUDA_REQUIRE(window >= 0 && chunk >= 1 && chunk <= 64 && (consumers == 2 || consumers == 3),
                  "MsaPrefillKvMajor::set_order: window %d (>= 0, 0 = none), chunk %d (1..64), consumers %d (2 or 3)",
                  window, chunk, consumers);
  window_ = window;
  chunk_ = chunk;
  consumers_ = consumers;
  if (P_ > 0) plan(T_, Hkv_, G_, kD, kB, K_, P_);  // the CSR rows depend on the window count
}

void MsaPrefillKvMajor::profile_phases(bool on) {
  if (on && !ev_.e[0])
    for (cudaEvent_t& e : ev_.e) M3_CUDA_CHECK(cudaEventCreate(&e));
  profile_ = on;
}

void MsaPrefillKvMajor::phase_ms(float ms[3]) {
  M3_CUDA_REQUIRE(profile_, "MsaPrefillKvMajor::phase_ms: profiling is off");
  M3_CUDA_CHECK(cudaEventSynchronize(ev_.e[3]));
  for (int i = 0; i < 3; ++i) M3_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev_.e[i], ev_.e[i + 1]));
}


void MsaPrefillKvMajor::check(cudaStream_t s) {
  if (error_.size() == 0) return;
  int e = 0;
  M3_CUDA_CHECK(cudaMemcpyAsync(&e, error_.get(), sizeof e, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  if (e) {
    M3_CUDA_CHECK(cudaMemset(error_.get(), 0, sizeof(int)));
    failf("MSA selection violates the contract (a block after the row's local block)");
  }
}

}  // namespace m3::cuda
