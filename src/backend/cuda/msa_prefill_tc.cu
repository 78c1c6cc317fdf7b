// Union-tile query-major MSA prefill on tensor cores (msa_prefill_tc.cuh). CTA = (8 query tokens, KV head h),
// 3 warpgroups:
//   prologue (warpgroup 0): the 8·top_k selections of the tile → physical pages through each row's page table →
//     the deduplicated union U (≤ 128 pages) and lim[u][token] = visible keys of page u for that token (0: not
//     selected, 128: a history page, p % 128 + 1: the token's local page);
//   producer (one thread of warpgroup 0): Q tile [8 tokens × 16 heads, 128] once, then per union page K and V
//     [128 keys, 128] (two 64-channel 128B-swizzled TMA boxes each) into a 3-stage ring;
//   consumers (warpgroups 1, 2 = tokens 0–3, 4–7; warp w of a consumer = one token, its 16 heads): per page the
//     consumer skips it when none of its 4 tokens selected it; else S = Q·Kᵀ (8 × wgmma m64n128k16, K-major smem
//     operands), mask keys ≥ lim, online softmax in the log2 domain (fp32), P packed to bf16 in registers,
//     O += P·V (8 × wgmma m64n128k16 with A from registers and V read N-major, no transpose).
// Rows are finished in one pass (no partials, no combine); efficiency = Σ selected / (4 · |U of the warpgroup|).
#include "backend/cuda/msa_prefill_tc.cuh"

#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"

namespace m3::cuda {
namespace {

using namespace hopper;

constexpr int kTok = 8, kG = 16, kD = 128, kB = 128, kStages = 3, kMaxUnion = kTok * 16;
constexpr int kThreads = 384;
constexpr uint32_t kAtom = 128 * 128;        // one [128 rows, 64 bf16] 128B-swizzled box: 16 KiB
constexpr uint32_t kStageBytes = 4 * kAtom;  // K (2 boxes) + V (2 boxes)
constexpr size_t kSmem = 1024 /*alignment*/ + 2 * kAtom /*Q*/ + kStages * kStageBytes + kMaxUnion * 4 /*pages*/ +
                         kMaxUnion * kTok /*lim*/ + 2 * kStages * 8 + 8 /*barriers*/ + 16 /*union size*/;
static_assert(kSmem <= 232448, "shared memory over the sm_90 per-block limit");

struct Params {
  const int32_t* selection;  // [Hkv, T, top_k]
  const int32_t* pos;
  const int32_t* row_seq;
  const int32_t* pt_indptr;
  const int32_t* pt_pages;
  float* out;                // [T, Hq, D] fp32, or null when out_bf16 is given
  __nv_bfloat16* out_bf16;   // [T, Hq, D] bf16, or null
  int* error;
  const uint8_t* route;  // [⌈T / 8⌉, Hkv]: 1 = this tile is served by the KV-block-major kernel, skip it; or null
  int T, Hkv, top_k;
  float scale_log2;
  int pingpong;  // 1: the two consumer warpgroups take turns issuing their MMAs (below)
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Warpgroup 0 builds the tile's page union. scratch: ≥ 128·4 + 4·4 bytes of free shared memory.
__device__ __forceinline__ void build_union(const Params& p, int t0, int h, int32_t* pages, uint8_t* lim,
                                           int* union_size, uint8_t* scratch) {
  int32_t* key = reinterpret_cast<int32_t*>(scratch);   // [128] page of entry i, −1 when none
  int32_t* uidx = key + kMaxUnion;                      // [128] union slot of entry i (first occurrences)
  int32_t* warp_count = uidx + kMaxUnion;               // [4]
  const int i = threadIdx.x, lane = i % 32, warp = i / 32;
  const int tl = i / p.top_k, slot = i % p.top_k, t = t0 + tl;
  int page = -1, visible = 0;
  if (tl < kTok && t < p.T) {
    const int b = p.selection[(int64_t(h) * p.T + t) * p.top_k + slot];
    const int pos = p.pos[t], local = pos / kB;
    if (b > local) {
      atomicOr(p.error, 1);
    } else if (b >= 0) {
      page = p.pt_pages[p.pt_indptr[p.row_seq[t]] + b];
      visible = b == local ? pos % kB + 1 : kB;
    }
  }
  key[i] = page;
  reinterpret_cast<uint32_t*>(lim)[i] = 0u;  // lim is [128][8] bytes = 256 words; clear both halves
  reinterpret_cast<uint32_t*>(lim)[i + 128] = 0u;
  named_barrier_sync(1, 128);
  int first = i;
  for (int j = 0; j < kMaxUnion; ++j)  // j is warp-uniform: broadcast reads
    if (j < first && key[j] == page) first = j;
  const bool is_first = page >= 0 && first == i;
  const uint32_t ballot = __ballot_sync(0xffffffffu, is_first);
  if (lane == 0) warp_count[warp] = __popc(ballot);
  named_barrier_sync(1, 128);
  int base = 0;
  for (int w = 0; w < warp; ++w) base += warp_count[w];
  if (is_first) {
    const int u = base + __popc(ballot & ((1u << lane) - 1u));
    uidx[i] = u;
    pages[u] = page;
  }
  if (i == 0) *union_size = warp_count[0] + warp_count[1] + warp_count[2] + warp_count[3];
  named_barrier_sync(1, 128);
  if (page >= 0) lim[uidx[first] * kTok + tl] = uint8_t(visible);
}

// Dense causal mode: no selection; the tile walks pages 0..local of each sequence its rows belong to (rows of one
// sequence are contiguous, so ≤ 8 runs). seg: [0, 8) sequence id, [8, 16) page-table offset, [16, 24) pages
// (max local + 1); the union is their concatenation. One thread.
__device__ __forceinline__ void build_segments(const Params& p, int t0, int32_t* seg, int* union_size) {
  int n = 0, total = 0;
  for (int tl = 0; tl < kTok && t0 + tl < p.T; ++tl) {
    const int t = t0 + tl, sq = p.row_seq[t], nb = p.pos[t] / kB + 1;
    if (n > 0 && seg[n - 1] == sq) {
      seg[16 + n - 1] = max(seg[16 + n - 1], nb);
    } else {
      seg[n] = sq, seg[8 + n] = p.pt_indptr[sq], seg[16 + n] = nb;
      ++n;
    }
  }
  for (int i = 0; i < n; ++i) total += seg[16 + i];
  *union_size = total;
}

template <bool kDense>
__global__ void __launch_bounds__(kThreads, 1)
    msa_prefill_union_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                             const __grid_constant__ CUtensorMap map_v, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* q_tile = smem;                        // [2 boxes][128 rows = token·16 + g][64]
  uint8_t* stages = smem + 2 * kAtom;            // [kStages][K box 0, K box 1, V box 0, V box 1]
  int32_t* pages = reinterpret_cast<int32_t*>(stages + kStages * kStageBytes);  // [kMaxUnion]
  uint8_t* lim = reinterpret_cast<uint8_t*>(pages + kMaxUnion);                 // [kMaxUnion][kTok]
  uint64_t* full = reinterpret_cast<uint64_t*>(lim + kMaxUnion * kTok);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;
  int* union_size = reinterpret_cast<int*>(q_full + 1);

  const int t0 = blockIdx.x * kTok, h = blockIdx.y;
  if (p.route && p.route[blockIdx.x * p.Hkv + h]) return;  // the whole CTA: routed to the KV-block-major kernel
  const int wg = warpgroup_index();
  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_q);
    tma_prefetch_map(&map_k);
    tma_prefetch_map(&map_v);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each consumer warp
    }
    mbar_init(q_full, 1);
    fence_barrier_init();
  }
  pdl_grid_dependency_wait();
  // The ring is still empty: its first stage is the prologue's scratch space.
  if constexpr (kDense) {
    if (threadIdx.x == 0) build_segments(p, t0, pages, union_size);
  } else {
    if (wg == 0) build_union(p, t0, h, pages, lim, union_size, stages);
  }
  fence_proxy_async_smem();  // scratch writes (generic proxy) before TMA (async proxy) overwrites them
  __syncthreads();
  const int n_union = *union_size;

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(q_full, 2 * kAtom);
      for (int b = 0; b < 2; ++b) tma_load_3d(q_tile + b * kAtom, &map_q, q_full, 64 * b, h * kG, t0);
      PipeState<kStages> ps;
      int si = 0, blk = 0;  // dense mode: position in the segment list
      for (int u = 0; u < n_union; ++u) {
        int page;
        if constexpr (kDense) {
          page = p.pt_pages[pages[8 + si] + blk];
          if (++blk == pages[16 + si]) ++si, blk = 0;
        } else {
          page = pages[u];
        }
        mbar_wait(&empty[ps.stage], ps.phase ^ 1u);
        mbar_arrive_expect_tx(&full[ps.stage], kStageBytes);
        uint8_t* st = stages + ps.stage * kStageBytes;
        for (int b = 0; b < 2; ++b) {
          tma_load_3d(st + b * kAtom, &map_k, &full[ps.stage], 64 * b, h * kB, page);
          tma_load_3d(st + (2 + b) * kAtom, &map_v, &full[ps.stage], 64 * b, h * kB, page);
        }
        ps.advance();
      }
    }
    pdl_launch_dependents();
  } else {
    setmaxnreg_inc<232>();
    const int c = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows lane/4 and lane/4 + 8 of this warp's token
    const uint64_t dq = smem_desc_sw128(q_tile + c * (64 * 128));
    // Dense mode: this warpgroup's 4 tokens (sequence, local block, fill of the local block).
    int rs[4] = {-1, -1, -1, -1}, lp[4] = {0, 0, 0, 0}, vl[4] = {0, 0, 0, 0};
    if constexpr (kDense) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int t = t0 + 4 * c + w;
        if (t < p.T) rs[w] = p.row_seq[t], lp[w] = p.pos[t] / kB, vl[w] = p.pos[t] % kB + 1;
      }
    }
    int si = 0, blk = 0;
    mbar_wait(q_full, 0);
    // Ping-pong (FlashAttention-3's warpgroup scheduling): named barrier 2 + c is warpgroup c's turn to issue MMAs.
    // The two consumers alternate S₀ S₁ PV₀ PV₁ …, so one's softmax runs while the other's MMAs keep the tensor
    // cores busy. Every page costs each warpgroup two turns, issued or not (a skipped page still passes the turn on),
    // so the alternation never deadlocks; warpgroup 1 hands the first turn to warpgroup 0 and takes none back at
    // the end (no arrival is left pending on a barrier when the CTA exits).
    const bool pp = p.pingpong != 0;
    const int last_turn = 2 * n_union - 1;
    int turn = 0;
    auto take_turn = [&] {
      if (pp) named_barrier_sync(2 + c, 256);
    };
    auto pass_turn = [&] {
      if (pp && !(c == 1 && turn == last_turn)) named_barrier_arrive(3 - c, 256);
      ++turn;
    };
    if (pp && c == 1 && n_union > 0) named_barrier_arrive(2, 256);
    PipeState<kStages> ps;
    for (int u = 0; u < n_union; ++u) {
      mbar_wait(&full[ps.stage], ps.phase);
      uint32_t lim4;
      if constexpr (kDense) {  // visible keys of page (seq, blk) for each token; the same in every warp
        const int sq = pages[si];
        lim4 = 0u;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const int v = rs[w] != sq ? 0 : blk < lp[w] ? kB : blk == lp[w] ? vl[w] : 0;
          lim4 |= uint32_t(v) << (8 * w);
        }
        if (++blk == pages[16 + si]) ++si, blk = 0;
      } else {
        lim4 = reinterpret_cast<const uint32_t*>(lim)[u * 2 + c];
      }
      const bool work = lim4 != 0u;  // warpgroup-uniform: some token of this warpgroup selected page u
      const uint8_t* st = stages + ps.stage * kStageBytes;
      if (work) {
        float s[64];
        take_turn();
        const uint64_t dk = smem_desc_sw128(st);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          Wgmma<bf16_t, 128>::mma_ss(s, desc_advance(dq, (kk / 4) * kAtom + (kk % 4) * 32),
                                     desc_advance(dk, (kk / 4) * kAtom + (kk % 4) * 32), kk > 0);
        wgmma_commit();
        pass_turn();
        wgmma_wait<0>();
        fence_regs(s);

        const int visible = int((lim4 >> (8 * warp)) & 0xFFu);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
          s[i] = col < visible ? s[i] * p.scale_log2 : -INFINITY;
          if ((i / 2) % 2 == 0)
            mx0 = fmaxf(mx0, s[i]);
          else
            mx1 = fmaxf(mx1, s[i]);
        }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
          mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
          mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
        }
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
        const float a0 = exp2f(m0 - u0), a1 = exp2f(m1 - u1);
        m0 = n0;
        m1 = n1;
        float sum0 = 0.f, sum1 = 0.f;
        uint32_t pa[8][4];
#pragma unroll
        for (int i = 0; i < 64; i += 2) {
          const bool r0 = (i / 2) % 2 == 0;
          const float e0 = exp2f(s[i] - (r0 ? u0 : u1)), e1 = exp2f(s[i + 1] - (r0 ? u0 : u1));
          if (r0)
            sum0 += e0 + e1;
          else
            sum1 += e0 + e1;
          pa[i / 8][(i % 8) / 2] = pack_bf16(e0, e1);
        }
        l0 = l0 * a0 + sum0;
        l1 = l1 * a1 + sum1;
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] *= ((i / 2) % 2 == 0) ? a0 : a1;

        take_turn();
        const uint64_t dv = smem_desc_sw128_mn(st + 2 * kAtom, kAtom);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) Wgmma<bf16_t, 128>::mma_rs_nmajor(o, pa[kk], desc_advance(dv, kk * 2048));
        wgmma_commit();
        pass_turn();
        wgmma_wait<0>();
        fence_regs(o);
      } else {  // a skipped page still passes both of its turns on
        take_turn();
        pass_turn();
        take_turn();
        pass_turn();
      }
      if (lane == 0) mbar_arrive(&empty[ps.stage]);
      ps.advance();
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, x);
      l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    const int t = t0 + 4 * c + warp;
    if (t < p.T) {
      const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
      const int Hq = p.Hkv * kG;
      const int64_t e0 = (int64_t(t) * Hq + h * kG + lane / 4) * kD + 2 * (lane % 4), e1 = e0 + 8 * kD;
      if (p.out_bf16) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<uint32_t*>(p.out_bf16 + e0 + 8 * j) = pack_bf16(o[4 * j] * i0, o[4 * j + 1] * i0);
          *reinterpret_cast<uint32_t*>(p.out_bf16 + e1 + 8 * j) = pack_bf16(o[4 * j + 2] * i1, o[4 * j + 3] * i1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<float2*>(p.out + e0 + 8 * j) = make_float2(o[4 * j] * i0, o[4 * j + 1] * i0);
          *reinterpret_cast<float2*>(p.out + e1 + 8 * j) = make_float2(o[4 * j + 2] * i1, o[4 * j + 3] * i1);
        }
      }
    }
  }
}

}  // namespace

void MsaPrefillUnion::plan(int64_t T, int num_kv_heads, int group, int head_dim, int block_size, int top_k) {
  M3_CUDA_REQUIRE(head_dim == kD && block_size == kB && group == kG && top_k >= 1 && top_k <= 16,
                  "MsaPrefillUnion supports D 128, block 128, 16 query heads per KV head, top_k <= 16 (got D %d, "
                  "block %d, group %d, top_k %d)",
                  head_dim, block_size, group, top_k);
  M3_CUDA_REQUIRE(T >= 0 && T < (int64_t(1) << 30) && num_kv_heads >= 1, "MsaPrefillUnion: bad T %lld / Hkv %d",
                  (long long)T, num_kv_heads);
  T_ = T;
  Hkv_ = num_kv_heads;
  G_ = group;
  K_ = top_k;
  if (error_.size() == 0) {
    error_.grow(1);
    M3_CUDA_CHECK(cudaMemset(error_.get(), 0, sizeof(int)));
  }
}

void MsaPrefillUnion::run(const uint16_t* q, const int32_t* selection, const DevStepRows& rows,
                          const DevPagedKVBf16& kv, float scale, float* out, cudaStream_t s, const uint8_t* route,
                          uint16_t* out_bf16) {
  M3_CUDA_REQUIRE(rows.T == T_, "MsaPrefillUnion::run: %d rows, planned for %lld", rows.T, (long long)T_);
  M3_CUDA_REQUIRE(kv.num_kv_heads == Hkv_ && kv.head_dim == kD && kv.block_size == kB && kv.num_pages > 0,
                  "MsaPrefillUnion::run: cache shape does not match the plan");
  if (T_ == 0) return;
  static const bool configured = [] {
    M3_CUDA_CHECK(cudaFuncSetAttribute(msa_prefill_union_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kSmem)));
    M3_CUDA_CHECK(cudaFuncSetAttribute(msa_prefill_union_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kSmem)));
    return true;
  }();
  (void)configured;
  const int Hq = Hkv_ * G_;
  const uint64_t qdims[3] = {uint64_t(kD), uint64_t(Hq), uint64_t(T_)}, qstr[2] = {uint64_t(kD), uint64_t(Hq) * kD};
  const uint32_t qbox[3] = {64, uint32_t(kG), uint32_t(kTok)};
  const CUtensorMap mq = make_tma_map_3d(q, TmaDtype::BF16, qdims, qstr, qbox, TmaSwizzle::B128);
  const uint64_t kdims[3] = {uint64_t(kD), uint64_t(Hkv_) * kB, uint64_t(kv.num_pages)};
  const uint64_t kstr[2] = {uint64_t(kD), uint64_t(kv.page_stride)};
  const uint32_t kbox[3] = {64, uint32_t(kB), 1};
  const CUtensorMap mk = make_tma_map_3d(kv.k, TmaDtype::BF16, kdims, kstr, kbox, TmaSwizzle::B128);
  const CUtensorMap mv = make_tma_map_3d(kv.v, TmaDtype::BF16, kdims, kstr, kbox, TmaSwizzle::B128);
  Params p{selection,
           rows.pos,
           rows.row_seq,
           rows.pt_indptr,
           rows.pt_pages,
           out_bf16 ? nullptr : out,
           reinterpret_cast<__nv_bfloat16*>(out_bf16),
           error_.get(),
           route,
           int(T_),
           Hkv_,
           K_,
           float(scale * 1.4426950408889634),
           pingpong_ ? 1 : 0};
  const dim3 grid(unsigned((T_ + kTok - 1) / kTok), unsigned(Hkv_));
  if (selection)
    msa_prefill_union_kernel<false><<<grid, kThreads, kSmem, s>>>(mq, mk, mv, p);
  else
    msa_prefill_union_kernel<true><<<grid, kThreads, kSmem, s>>>(mq, mk, mv, p);
  M3_CUDA_LAUNCH_CHECK();
}

void MsaPrefillUnion::run_dense(const uint16_t* q, const DevStepRows& rows, const DevPagedKVBf16& kv, float scale,
                                float* out, cudaStream_t s, uint16_t* out_bf16) {
  run(q, nullptr, rows, kv, scale, out, s, nullptr, out_bf16);
}

void MsaPrefillUnion::check(cudaStream_t s) {
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
