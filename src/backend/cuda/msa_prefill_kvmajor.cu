// KV-block-major MSA prefill on tensor cores (msa_prefill_kvmajor.cuh). Per run, all on the device:
//   1. count:   one thread per selection entry (h, t, slot): logical block → physical page through the row's page
//               table; CSR row r = h·P + page; rank = atomicAdd(cnt[r]) (its place in the row).
//   2. pack + exclusive scan (CUB) of (cnt[r], tiles[r] = ⌈cnt[r] / 8⌉) packed in one 64-bit word: row offsets
//      and tile offsets in one pass (the low half never carries: Σ cnt < 2^32).
//   3. scatter: csr[off[r] + rank] = t | slot << 24;  tile emit: tiles[toff[r] + j] = (r, j); n_tiles on device.
//   4. attention: persistent grid (one CTA per SM, 3 warpgroups). Producer (warp 0): resolves the metadata of 4
//      tiles at once (lane = tile · 8 + entry), then per tile K and V of the page [128 keys, 128] (two 64-channel
//      128B-swizzled TMA boxes each) and the Q rows [16 heads, 128] of each of the ≤ 8 queries (one TMA box pair
//      per query, issued by the query's lane: the gather) into a 2-stage ring, with (t, slot, visible, h) of the
//      8 entries in shared memory beside the stage.
//      Consumers (warpgroups 1, 2 = queries 0–3, 4–7 of the tile; warp = one query, its 16 heads = 16 MMA rows):
//      S = Q·Kᵀ (8 × wgmma m64n128k16), keys ≥ the query's visible count masked (its local page: p % 128 + 1),
//      single-pass softmax in the log2 domain, O = P·V (8 × wgmma, P from registers, V read N-major), then
//      O / l as bf16 staged in the warp's dead Q rows and stored as one contiguous 4 KiB block to
//      o_part[slot, t, h·16 .. +15], m + log2 l to lse_part[slot, t, head].
//   5. combine: one warp per (t, head): M = max over valid slots of LSE, w = 2^(LSE − M), out = Σ w·O / Σ w.
// Rows of the CSR are keyed by physical page, so queries of different sequences that share a cached prefix page
// are served by one load of it. Tiles are ordered by row: CTAs that run at the same time mostly share pages in L2.
#include "backend/cuda/msa_prefill_kvmajor.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cub/cub.cuh>

#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"

namespace m3::cuda {
namespace {

using namespace hopper;

constexpr int kTok = 8, kG = 16, kD = 128, kB = 128, kStages = 2, kThreads = 384;
constexpr uint32_t kAtom = 128 * 128;        // [128 rows, 64 bf16] 128B-swizzled: 16 KiB
constexpr uint32_t kQTokBytes = kG * 128;    // one query's [16 heads, 64 channels] box: 2 KiB
constexpr uint32_t kStageBytes = 6 * kAtom;  // Q (2 boxes of 8 queries) + K (2) + V (2)
constexpr size_t kSmem = 1024 + kStages * kStageBytes + 2 * kStages * 8 + kStages * kTok * 16;
static_assert(kSmem <= 232448, "shared memory over the sm_90 per-block limit");

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
  int64_t E;
  int T, K, P, Hkv;
};

__global__ void kvm_count_kernel(const EdgeParams p) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.E) return;
  const int b = p.selection[e];
  int rank = -1;
  if (b >= 0) {
    const int64_t ht = e / p.K;
    const int t = int(ht % p.T), h = int(ht / p.T);
    const int local = p.pos[t] / kB;
    if (p.route && !p.route[(t / kTok) * p.Hkv + h]) {
      // served by the union-tile kernel, which checks the contract itself
    } else if (b > local) {
      atomicOr(p.error, 1);
    } else {
      const int page = p.pt_pages[p.pt_indptr[p.row_seq[t]] + b];
      const int r = h * p.P + page;
      p.edge_row[e] = r;
      rank = atomicAdd(&p.cnt[r], 1);
    }
  }
  p.rank[e] = rank;
}

__global__ void kvm_pack_kernel(const int* cnt, unsigned long long* packed, int64_t rows) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const unsigned c = unsigned(cnt[r]);
  packed[r] = (unsigned long long)c | ((unsigned long long)((c + kTok - 1) / kTok) << 32);
}

__global__ void kvm_scatter_kernel(const EdgeParams p, const unsigned long long* off, int* csr) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.E) return;
  const int rank = p.rank[e];
  if (rank < 0) return;
  const int64_t ht = e / p.K;
  const int t = int(ht % p.T), slot = int(e % p.K);
  csr[uint32_t(off[p.edge_row[e]]) + rank] = t | (slot << 24);
}

__global__ void kvm_tiles_kernel(const int* cnt, const unsigned long long* off, int64_t rows, int2* tiles,
                                 int* n_tiles) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
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
  float scale_log2;
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__global__ void __launch_bounds__(kThreads, 1)
    msa_prefill_kvmajor_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                               const __grid_constant__ CUtensorMap map_v, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* stages = smem;  // [kStages][Q box 0, Q box 1, K box 0, K box 1, V box 0, V box 1]
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  int4* meta = reinterpret_cast<int4*>(empty + kStages);  // [kStages][kTok]: (t or −1, slot, visible keys, h)

  const int wg = warpgroup_index();
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();
  pdl_grid_dependency_wait();
  const int n_tiles = *p.n_tiles;

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x < 32) {
      // Producer warp. The metadata of a tile is a chain of dependent loads (tile → row offset/count → CSR entry →
      // selection/position); the warp resolves 4 tiles at once (lane = 8·k + entry) so the chain is paid once per
      // 4 tiles, then hands each tile's (t, slot, visible, h) to the consumers through shared memory with the stage.
      PipeState<kStages> ps;
      const int k = lane / kTok, i = lane % kTok;
      for (int base = blockIdx.x; base < n_tiles; base += 4 * gridDim.x) {
        const int tile = base + k * gridDim.x;
        int n = 0, h = 0, page = 0, t = -1, slot = 0, visible = 0;
        if (tile < n_tiles) {
          const int2 tj = p.tiles[tile];
          h = tj.x / p.P;
          page = tj.x % p.P;
          n = min(kTok, p.cnt[tj.x] - tj.y * kTok);
          if (i < n) {
            const int e = p.csr[int(uint32_t(p.off[tj.x])) + tj.y * kTok + i];
            t = e & 0xFFFFFF;
            slot = e >> 24;
            const int b = p.selection[(int64_t(h) * p.T + t) * p.K + slot];
            const int pos = p.pos[t];
            visible = b == pos / kB ? pos % kB + 1 : kB;
          }
        }
        for (int kk = 0; kk < 4; ++kk) {
          if (base + kk * gridDim.x >= n_tiles) break;  // warp-uniform
          const int nk = __shfl_sync(0xffffffffu, n, kk * kTok);
          const int hk = __shfl_sync(0xffffffffu, h, kk * kTok);
          const int pk = __shfl_sync(0xffffffffu, page, kk * kTok);
          uint8_t* st = stages + ps.stage * kStageBytes;
          if (lane == 0) mbar_wait(&empty[ps.stage], ps.phase ^ 1u);
          __syncwarp();
          // (Few registers here: warpgroup 0 runs under setmaxnreg 40, so entries go through lane 0 one by one.)
#pragma unroll 1
          for (int j = 0; j < kTok; ++j) {
            const int tj = __shfl_sync(0xffffffffu, t, kk * kTok + j);
            const int sj = __shfl_sync(0xffffffffu, slot, kk * kTok + j);
            const int vj = __shfl_sync(0xffffffffu, visible, kk * kTok + j);
            if (lane == 0) meta[ps.stage * kTok + j] = make_int4(tj, sj, vj, hk);
          }
          if (lane == 0) {
            mbar_arrive_expect_tx(&full[ps.stage], 4 * kAtom + uint32_t(nk) * 2 * kQTokBytes);
            for (int b = 0; b < 2; ++b) {
              tma_load_3d(st + (2 + b) * kAtom, &map_k, &full[ps.stage], 64 * b, hk * kB, pk);
              tma_load_3d(st + (4 + b) * kAtom, &map_v, &full[ps.stage], 64 * b, hk * kB, pk);
            }
          }
          __syncwarp();
          // The Q gather: each of the tile's lanes loads its own query's [16 heads, 128] (two boxes).
          if (k == kk && i < nk)
            for (int b = 0; b < 2; ++b)
              tma_load_3d(st + b * kAtom + i * kQTokBytes, &map_q, &full[ps.stage], 64 * b, hk * kG, t);
          ps.advance();
        }
      }
    }
    pdl_launch_dependents();
  } else {
    setmaxnreg_inc<232>();
    const int c = wg - 1, tid = threadIdx.x % 128, warp = tid / 32;
    const int Hq = p.Hkv * kG;
    PipeState<kStages> ps;
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
      mbar_wait(&full[ps.stage], ps.phase);
      const int4 mine = meta[ps.stage * kTok + 4 * c + warp];  // this warp's query: (t, slot, visible, h)
      const bool active = meta[ps.stage * kTok + 4 * c].x >= 0;  // warpgroup-uniform: entries are a prefix
      uint8_t* st = stages + ps.stage * kStageBytes;
      if (active) {
        const int visible = mine.z;
        const uint64_t dq = smem_desc_sw128(st + c * (64 * 128));
        const uint64_t dk = smem_desc_sw128(st + 2 * kAtom);
        float s[64];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          Wgmma<bf16_t, 128>::mma_ss(s, desc_advance(dq, (kk / 4) * kAtom + (kk % 4) * 32),
                                     desc_advance(dk, (kk / 4) * kAtom + (kk % 4) * 32), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(s);

        float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
          s[i] = col < visible ? s[i] * p.scale_log2 : -INFINITY;
          if ((i / 2) % 2 == 0)
            m0 = fmaxf(m0, s[i]);
          else
            m1 = fmaxf(m1, s[i]);
        }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
          m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x));
          m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x));
        }
        const float u0 = m0 == -INFINITY ? 0.f : m0, u1 = m1 == -INFINITY ? 0.f : m1;
        float l0 = 0.f, l1 = 0.f;
        uint32_t pa[8][4];
#pragma unroll
        for (int i = 0; i < 64; i += 2) {
          const bool r0 = (i / 2) % 2 == 0;
          const float e0 = exp2f(s[i] - (r0 ? u0 : u1)), e1 = exp2f(s[i + 1] - (r0 ? u0 : u1));
          if (r0)
            l0 += e0 + e1;
          else
            l1 += e0 + e1;
          pa[i / 8][(i % 8) / 2] = pack_bf16(e0, e1);
        }
        float o[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] = 0.f;
        const uint64_t dv = smem_desc_sw128_mn(st + 4 * kAtom, kAtom);
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
        uint8_t* stage_o = st + c * (64 * 128) + warp * (16 * 128);  // box 0 rows of this warp: 2 KiB; box 1: +kAtom
        if (mine.x >= 0) {
          const float i0 = 1.f / l0, i1 = 1.f / l1;  // visible ≥ 1: l ≥ 1
          const int r0 = lane / 4, r1 = r0 + 8;
#pragma unroll
          for (int j = 0; j < 16; ++j) {  // channels 8j .. 8j + 7: chunk j % 8 of box j / 8
            uint8_t* box = stage_o + (j / 8) * kAtom;
            const int ch = j % 8;
            *reinterpret_cast<uint32_t*>(box + r0 * 128 + ((ch ^ (r0 % 8)) * 16) + 4 * (lane % 4)) =
                pack_bf16(o[4 * j] * i0, o[4 * j + 1] * i0);
            *reinterpret_cast<uint32_t*>(box + r1 * 128 + ((ch ^ (r1 % 8)) * 16) + 4 * (lane % 4)) =
                pack_bf16(o[4 * j + 2] * i1, o[4 * j + 3] * i1);
          }
          const int64_t row = (int64_t(mine.y) * p.T + mine.x) * Hq + mine.w * kG;
          if (lane % 4 == 0) {
            p.lse_part[row + r0] = m0 + log2f(l0);
            p.lse_part[row + r1] = m1 + log2f(l1);
          }
          __syncwarp();
          uint4* dst = reinterpret_cast<uint4*>(p.o_part + row * kD);  // 16 rows × 16 chunks of 16 bytes
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const int idx = q * 32 + lane, r = idx / 16, ch16 = idx % 16;  // row r, 16-byte chunk ch16 of 256 B
            const uint8_t* box = stage_o + (ch16 / 8) * kAtom;
            dst[idx] = *reinterpret_cast<const uint4*>(box + r * 128 + (((ch16 % 8) ^ (r % 8)) * 16));
          }
        }
        __syncwarp();
        fence_proxy_async_smem();  // generic writes to the stage before the next TMA fill of it
      }
      if (lane == 0) mbar_arrive(&empty[ps.stage]);
      ps.advance();
    }
  }
}

// ---- combine ----------------------------------------------------------------------------------------------------

struct CombineParams {
  const int32_t* selection;  // [Hkv, T, K]
  const int32_t* pos;
  const __nv_bfloat16* o_part;
  const float* lse_part;
  float* out;  // [T, Hq, D]
  const uint8_t* route;
  int T, Hq, K;
};

// One warp per (t, head m); lane l owns channels 4l .. 4l + 3. Slots that are not edges (−1, or after the local
// block: reported by the count kernel) are skipped; a row with none gets O = 0.
__global__ void kvm_combine_kernel(const CombineParams p) {
  pdl_grid_dependency_wait();
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= int64_t(p.T) * p.Hq) return;
  const int t = int(w / p.Hq), m = int(w % p.Hq), h = m / kG;
  if (p.route && !p.route[(t / kTok) * (p.Hq / kG) + h]) return;  // the union-tile kernel wrote this row
  const int local = p.pos[t] / kB;
  int b = -1;
  if (lane < p.K) b = p.selection[(int64_t(h) * p.T + t) * p.K + lane];
  const bool valid = b >= 0 && b <= local;
  const uint32_t mask = __ballot_sync(0xffffffffu, valid);
  const float lse = valid ? p.lse_part[(int64_t(lane) * p.T + t) * p.Hq + m] : -INFINITY;
  float mx = lse;
#pragma unroll
  for (int x = 16; x >= 1; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
  const float wl = valid ? exp2f(lse - mx) : 0.f;
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, den = 0.f;
  for (uint32_t bits = mask; bits; bits &= bits - 1) {
    const int sl = __ffs(bits) - 1;
    const float ws = __shfl_sync(0xffffffffu, wl, sl);
    const uint2 raw = *reinterpret_cast<const uint2*>(p.o_part + ((int64_t(sl) * p.T + t) * p.Hq + m) * kD + 4 * lane);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 c = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    acc[0] += ws * a.x;
    acc[1] += ws * a.y;
    acc[2] += ws * c.x;
    acc[3] += ws * c.y;
    den += ws;
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  *reinterpret_cast<float4*>(p.out + (int64_t(t) * p.Hq + m) * kD + 4 * lane) =
      make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
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
  const int64_t rows = int64_t(Hkv_) * P_, E = int64_t(Hkv_) * T_ * K_;
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
                            const DevPagedKVBf16& kv, float scale, float* out, cudaStream_t s, const uint8_t* route) {
  M3_CUDA_REQUIRE(rows.T == T_, "MsaPrefillKvMajor::run: %d rows, planned for %lld", rows.T, (long long)T_);
  M3_CUDA_REQUIRE(kv.num_kv_heads == Hkv_ && kv.head_dim == kD && kv.block_size == kB && kv.num_pages == P_,
                  "MsaPrefillKvMajor::run: cache shape does not match the plan");
  M3_CUDA_REQUIRE(selection != nullptr, "MsaPrefillKvMajor::run: no selection");
  if (T_ == 0) return;
  static const bool configured = [] {
    M3_CUDA_CHECK(cudaFuncSetAttribute(msa_prefill_kvmajor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kSmem)));
    return true;
  }();
  (void)configured;
  const int64_t nrows = int64_t(Hkv_) * P_, E = int64_t(Hkv_) * T_ * K_;
  const int Hq = Hkv_ * G_;

  // 1–3: the block → queries CSR and the tile list.
  M3_CUDA_CHECK(cudaMemsetAsync(cnt_.get(), 0, size_t(nrows) * 4, s));
  const EdgeParams ep{selection,   rows.pos,        rows.row_seq, rows.pt_indptr, rows.pt_pages, cnt_.get(),
                      rank_.get(), edge_row_.get(), error_.get(), route,          E,             int(T_),
                      K_,          int(P_),         Hkv_};
  kvm_count_kernel<<<blocks_for(E, 256), 256, 0, s>>>(ep);
  M3_CUDA_LAUNCH_CHECK();
  kvm_pack_kernel<<<blocks_for(nrows, 256), 256, 0, s>>>(cnt_.get(), packed_.get(), nrows);
  M3_CUDA_LAUNCH_CHECK();
  size_t tmp = scan_tmp_bytes_;
  M3_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(scan_tmp_.get(), tmp, packed_.get(), packed_off_.get(), int(nrows), s));
  kvm_scatter_kernel<<<blocks_for(E, 256), 256, 0, s>>>(ep, packed_off_.get(), csr_.get());
  M3_CUDA_LAUNCH_CHECK();
  kvm_tiles_kernel<<<blocks_for(nrows, 256), 256, 0, s>>>(cnt_.get(), packed_off_.get(), nrows, tiles_.get(),
                                                          n_tiles_.get());
  M3_CUDA_LAUNCH_CHECK();

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
                 int(P_),         float(scale * 1.4426950408889634)};
  msa_prefill_kvmajor_kernel<<<unsigned(sms_), kThreads, kSmem, s>>>(mq, mk, mv, p);
  M3_CUDA_LAUNCH_CHECK();

  // 5: combine, chained by programmatic dependent launch (its prologue overlaps the attention's tail).
  const CombineParams cp{selection, rows.pos, reinterpret_cast<const __nv_bfloat16*>(o_part_.get()),
                         lse_part_.get(), out, route, int(T_), Hq, K_};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks_for(T_ * Hq * 32, 256));
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kvm_combine_kernel, cp));
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
