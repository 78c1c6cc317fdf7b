// Grouped MoE GEMMs on wgmma (moe_grouped_wgmma.cuh). CTA = 3 warpgroups (384 threads, one CTA per SM, persistent):
//   warpgroup 0, producer: one thread walks the CTA's work tiles and K blocks, waits for a free ring stage and issues
//     the TMA copies into it (A [128, 64]; B [256, 64] as one box (down) or two 128-row boxes (gate, up)), 128B
//     swizzle, completing on the stage's full barrier;
//   warpgroups 1, 2, consumers: rows 0–63 / 64–127 of the tile; per K block 4 × wgmma m64n256k16 into 128 fp32
//     registers per thread, one group kept in flight, the previous stage released on its empty barrier; at a tile's
//     end the epilogue (SwiGLU-OAI → bf16 act, or fp32 y rows by slot) goes straight to global while the producer
//     already fills the next tile.
// Work items go group by group, column tile by column tile, row tile fastest (work_tile), so the row tiles of one
// expert that read the same weight tile run on neighbouring CTAs at the same time. Measured: no faster than row-tile-
// major order, and the kernel still reads ≈ 2.9× its unique bytes from DRAM (docs/KERNELS.md §10.1).
#include "backend/cuda/moe_grouped_wgmma.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/hopper/gemm_consumer.cuh"
#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"
#include "backend/cuda/moe_wgmma_tiles.cuh"

namespace m3::cuda {
namespace {

using namespace hopper;

constexpr int kBM = kMoeWgmmaRows, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kTileA = kBM * kBK * 2, kTileB = kBN * kBK * 2, kHalfB = kTileB / 2;  // bytes per stage
constexpr size_t kSmem = size_t(kStages) * (kTileA + kTileB) + 1024 /*alignment*/ + 256 /*barriers*/;

struct KernelParams {
  const int32_t* offsets;
  const int32_t* row_slot;
  const int32_t* tiles;
  const int32_t* counters;
  int* queue;  // the dynamic order's item counter (moe_wgmma::work_counter), or null
  int E, H, I, Is;
  int NN;  // column tiles per row tile
  __nv_bfloat16* act;
  int64_t ld_act;
  float* y;
  float alpha, limit;
};

__device__ __forceinline__ moe_wgmma::WorkTile work_tile(const KernelParams& p, int w) {
  return moe_wgmma::work_tile(p.tiles, p.offsets, p.NN, w);
}
using moe_wgmma::swiglu_oai;

template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1)
    moe_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                     const __grid_constant__ CUtensorMap map_ws, const KernelParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles_a = smem;                     // [kStages][128][64] bf16
  uint8_t* tiles_b = smem + kStages * kTileA;  // [kStages][256][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles_b + kStages * kTileB);
  uint64_t* empty = full + kStages;
  auto* queue = reinterpret_cast<moe_wgmma::WorkQueue*>(empty + kStages);

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
        const moe_wgmma::WorkTile wt = work_tile(p, w);
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
            // Gate rows n·128 … and the matching up rows Ig + n·128 … of expert g ([E·2I, H] or shared [2Is, H]).
            const int base = shared ? 0 : g * 2 * p.I;
            tma_load_2d(b, mw, &full[ps.stage], kb * kBK, base + n * (kBN / 2));
            tma_load_2d(b + kHalfB, mw, &full[ps.stage], kb * kBK, base + Ig + n * (kBN / 2));
          } else {
            const int base = shared ? 0 : g * p.H;  // [E·H, I] or shared [H, Is]
            tma_load_2d(b, mw, &full[ps.stage], kb * kBK, base + n * kBN);
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
    float d[128];
    PipeState<kStages> ps;
    for (int i = 0;; ++i) {
      const int w = moe_wgmma::queue_pop(queue, i, lane);
      if (w >= num_work) break;
      const moe_wgmma::WorkTile wt = work_tile(p, w);
      const int g = wt.g, r0 = wt.r0, n = wt.n;
      const int Ig = g == p.E ? p.Is : p.I;
      if (kGateUp && n * (kBN / 2) >= Ig) continue;
      const int num_k = (kGateUp ? p.H : Ig) / kBK;
      const int nrows = min(kBM, p.offsets[g + 1] - r0);
      if (half * 64 >= nrows) {
        // Every row of this half is past the group's end: no MMA, hand each stage straight back. (A separate loop,
        // not a condition around the MMAs: ptxas would otherwise wait for every wgmma group at the branch's join.)
        for (int kb = 0; kb < num_k; ++kb) {
          mbar_wait(&full[ps.stage], ps.phase);
          if (lane == 0) mbar_arrive(&empty[ps.stage]);
          ps.advance();
        }
        continue;
      }
      consume_tile_64x256<kStages, kTileA, kTileB>(d, ps, full, empty, tiles_a, tiles_b, half, num_k, lane);

      // Accumulator d[4j + e]: tile row half·64 + warp·16 + lane/4 (+8 for e ≥ 2), column 8j + 2·(lane%4) + e%2.
      const int row_a = half * 64 + warp * 16 + lane / 4, row_b = row_a + 8;
      const int c0 = 2 * (lane % 4);
      if (kGateUp) {
        // Columns 0–127 are gate, 128–255 the matching up: d[4j + e] pairs with d[4(j + 16) + e].
        __nv_bfloat16* a0 = p.act + int64_t(r0 + row_a) * p.ld_act + n * (kBN / 2) + c0;
        __nv_bfloat16* a1 = p.act + int64_t(r0 + row_b) * p.ld_act + n * (kBN / 2) + c0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float v0 = swiglu_oai(d[4 * j], d[4 * (j + 16)], p.alpha, p.limit);
          const float v1 = swiglu_oai(d[4 * j + 1], d[4 * (j + 16) + 1], p.alpha, p.limit);
          const float v2 = swiglu_oai(d[4 * j + 2], d[4 * (j + 16) + 2], p.alpha, p.limit);
          const float v3 = swiglu_oai(d[4 * j + 3], d[4 * (j + 16) + 3], p.alpha, p.limit);
          if (row_a < nrows) *reinterpret_cast<__nv_bfloat162*>(a0 + 8 * j) = __floats2bfloat162_rn(v0, v1);
          if (row_b < nrows) *reinterpret_cast<__nv_bfloat162*>(a1 + 8 * j) = __floats2bfloat162_rn(v2, v3);
        }
      } else {
        float* y0 = row_a < nrows ? p.y + int64_t(p.row_slot[r0 + row_a]) * p.H + n * kBN + c0 : nullptr;
        float* y1 = row_b < nrows ? p.y + int64_t(p.row_slot[r0 + row_b]) * p.H + n * kBN + c0 : nullptr;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          if (y0) *reinterpret_cast<float2*>(y0 + 8 * j) = make_float2(d[4 * j], d[4 * j + 1]);
          if (y1) *reinterpret_cast<float2*>(y1 + 8 * j) = make_float2(d[4 * j + 2], d[4 * j + 3]);
        }
      }
    }
  }
}

// One warp per grouped row, 16-byte copies; CTAs past the device row count exit.
__global__ void __launch_bounds__(256) gather_rows_kernel(const uint4* __restrict__ xb, int64_t row_u4,
                                                          const int32_t* __restrict__ row_tok,
                                                          const int32_t* __restrict__ offsets, int E,
                                                          uint4* __restrict__ xg) {
  const int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (r >= offsets[E + 1]) return;
  const uint4* src = xb + int64_t(row_tok[r]) * row_u4;
  uint4* dst = xg + r * row_u4;
  for (int64_t i = threadIdx.x % 32; i < row_u4; i += 32) dst[i] = src[i];
}

template <bool kGateUp>
void launch(const CUtensorMap& ma, const CUtensorMap& mw, const CUtensorMap& mws, const KernelParams& p,
            int64_t cap_tiles, cudaStream_t s) {
  static const bool configured = [] {
    M3_CUDA_CHECK(cudaFuncSetAttribute(moe_wgmma_kernel<kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kSmem)));
    return true;
  }();
  (void)configured;
  const int64_t work = std::max<int64_t>(1, cap_tiles * p.NN);
  moe_wgmma_kernel<kGateUp><<<unsigned(std::min<int64_t>(work, sm_count())), kThreads, kSmem, s>>>(ma, mw, mws, p);
  M3_CUDA_LAUNCH_CHECK();
}

KernelParams params_of(const MoeWgmmaRouting& rt, int64_t H, int64_t I, int64_t Is, int NN) {
  KernelParams p{};
  p.offsets = rt.offsets, p.row_slot = rt.row_slot, p.tiles = rt.tiles, p.counters = rt.counters;
  p.E = rt.E, p.H = int(H), p.I = int(I), p.Is = int(Is), p.NN = NN;
  return p;
}

}  // namespace

namespace moe_wgmma {
int* work_counter(const int32_t* counters, int which) {
  static const bool static_order = [] {
    const char* e = std::getenv("M3_MOE_STATIC_ORDER");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return static_order ? nullptr : const_cast<int*>(counters) + 2 + which;
}
}  // namespace moe_wgmma

bool moe_wgmma_supported(int64_t H, int64_t I, int64_t Is) {
  return H > 0 && H % kBN == 0 && I > 0 && I % (kBN / 2) == 0 && Is >= 0 && Is % (kBN / 2) == 0 &&
         H < (int64_t(1) << 20) && I < (int64_t(1) << 20) && Is < (int64_t(1) << 20);
}

void moe_gather_rows(const __nv_bfloat16* xb, int64_t H, const MoeWgmmaRouting& rt, __nv_bfloat16* xg,
                     cudaStream_t s) {
  M3_CUDA_REQUIRE(H % 8 == 0, "moe_gather_rows: H %lld is not a multiple of 8", (long long)H);
  if (rt.cap_rows <= 0) return;
  gather_rows_kernel<<<unsigned((rt.cap_rows + 7) / 8), 256, 0, s>>>(
      reinterpret_cast<const uint4*>(xb), H / 8, rt.row_tok, rt.offsets, rt.E, reinterpret_cast<uint4*>(xg));
  M3_CUDA_LAUNCH_CHECK();
}

template <typename WT>
void moe_gate_up_wgmma(const __nv_bfloat16* xg, int64_t H, const WT* gate_up, const WT* shared_gate_up, int64_t I,
                       int64_t Is, float alpha, float limit, const MoeWgmmaRouting& rt, __nv_bfloat16* act,
                       int64_t ld_act, cudaStream_t s) {
  static_assert(std::is_same_v<WT, __nv_bfloat16>, "bf16 weights only so far");
  const bool shared = shared_gate_up != nullptr && Is > 0;
  M3_CUDA_REQUIRE(moe_wgmma_supported(H, I, shared ? Is : 0) && ld_act >= std::max(I, shared ? Is : 0),
                  "moe_gate_up_wgmma: unsupported widths H %lld, I %lld, shared I %lld", (long long)H, (long long)I,
                  (long long)Is);
  if (rt.cap_rows <= 0 || rt.cap_tiles <= 0) return;
  const CUtensorMap ma = make_tma_map_2d(xg, TmaDtype::BF16, uint64_t(rt.cap_rows), uint64_t(H), uint64_t(H), kBM,
                                         kBK, TmaSwizzle::B128);
  const CUtensorMap mw = make_tma_map_2d(gate_up, TmaDtype::BF16, uint64_t(rt.E) * 2 * uint64_t(I), uint64_t(H),
                                         uint64_t(H), kBN / 2, kBK, TmaSwizzle::B128);
  const CUtensorMap mws = shared ? make_tma_map_2d(shared_gate_up, TmaDtype::BF16, 2 * uint64_t(Is), uint64_t(H),
                                                   uint64_t(H), kBN / 2, kBK, TmaSwizzle::B128)
                                 : mw;
  const int64_t Imax = std::max(I, shared ? Is : 0);
  KernelParams p = params_of(rt, H, I, shared ? Is : 0, int(Imax / (kBN / 2)));
  p.queue = moe_wgmma::work_counter(rt.counters, 0);
  p.act = act, p.ld_act = ld_act, p.alpha = alpha, p.limit = limit;
  launch<true>(ma, mw, mws, p, rt.cap_tiles, s);
}

template <typename WT>
void moe_down_wgmma(const __nv_bfloat16* act, int64_t ld_act, const WT* down, const WT* shared_down, int64_t H,
                    int64_t I, int64_t Is, const MoeWgmmaRouting& rt, float* y, cudaStream_t s) {
  static_assert(std::is_same_v<WT, __nv_bfloat16>, "bf16 weights only so far");
  const bool shared = shared_down != nullptr && Is > 0;
  M3_CUDA_REQUIRE(moe_wgmma_supported(H, I, shared ? Is : 0) && ld_act >= std::max(I, shared ? Is : 0) &&
                      ld_act % 8 == 0,
                  "moe_down_wgmma: unsupported widths H %lld, I %lld, shared I %lld, ld %lld", (long long)H,
                  (long long)I, (long long)Is, (long long)ld_act);
  if (rt.cap_rows <= 0 || rt.cap_tiles <= 0) return;
  const CUtensorMap ma = make_tma_map_2d(act, TmaDtype::BF16, uint64_t(rt.cap_rows), uint64_t(ld_act),
                                         uint64_t(ld_act), kBM, kBK, TmaSwizzle::B128);
  const CUtensorMap mw = make_tma_map_2d(down, TmaDtype::BF16, uint64_t(rt.E) * uint64_t(H), uint64_t(I), uint64_t(I),
                                         kBN, kBK, TmaSwizzle::B128);
  const CUtensorMap mws = shared ? make_tma_map_2d(shared_down, TmaDtype::BF16, uint64_t(H), uint64_t(Is),
                                                   uint64_t(Is), kBN, kBK, TmaSwizzle::B128)
                                 : mw;
  KernelParams p = params_of(rt, H, I, shared ? Is : 0, int(H / kBN));
  p.queue = moe_wgmma::work_counter(rt.counters, 1);
  p.y = y;
  launch<false>(ma, mw, mws, p, rt.cap_tiles, s);
}

template void moe_gate_up_wgmma<__nv_bfloat16>(const __nv_bfloat16*, int64_t, const __nv_bfloat16*,
                                                const __nv_bfloat16*, int64_t, int64_t, float, float,
                                                const MoeWgmmaRouting&, __nv_bfloat16*, int64_t, cudaStream_t);
template void moe_down_wgmma<__nv_bfloat16>(const __nv_bfloat16*, int64_t, const __nv_bfloat16*, const __nv_bfloat16*,
                                             int64_t, int64_t, int64_t, const MoeWgmmaRouting&, float*, cudaStream_t);

}  // namespace m3::cuda
