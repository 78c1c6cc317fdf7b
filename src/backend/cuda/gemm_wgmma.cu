// Persistent warp-specialised bf16 GEMM (gemm_wgmma.cuh). CTA = 3 warpgroups (384 threads, one CTA per SM):
//   warpgroup 0, producer: one thread walks the CTA's tiles and K blocks, waits for a free ring stage and issues two
//     TMA copies into it (x tile [128, 64], W tile [256, 64], 128B swizzle) completing on the stage's full barrier;
//   warpgroups 1, 2, consumers: rows 0–63 / 64–127 of the tile; per K block, 4 × wgmma m64n256k16 into 128 fp32
//     registers per thread, keep one group in flight, release the previous stage on its empty barrier; at a tile's
//     end, store the accumulators straight to global (bf16 or fp32) while the producer already fills the next tile.
// Tiles are visited in groups of kGroupM M-tiles (column-major inside a group) so concurrent CTAs share x and W
// slices in L2.
#include "backend/cuda/gemm_wgmma.cuh"

#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/hopper/gemm_consumer.cuh"
#include "backend/cuda/hopper/mbarrier.cuh"
#include "backend/cuda/hopper/tma.cuh"
#include "backend/cuda/hopper/warpgroup.cuh"
#include "backend/cuda/hopper/wgmma.cuh"

namespace m3::cuda {
namespace {

using namespace hopper;

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kGroupM = 16;
constexpr int kThreads = 384;
constexpr uint32_t kTileA = kBM * kBK * 2, kTileB = kBN * kBK * 2;  // bytes per stage
constexpr size_t kSmem = size_t(kStages) * (kTileA + kTileB) + 1024 /*alignment*/ + 256 /*barriers*/;

struct TileCoord {
  int m, n;
};

__device__ __forceinline__ TileCoord tile_coord(int t, int num_m, int num_n) {
  const int per_group = kGroupM * num_n;
  const int first_m = (t / per_group) * kGroupM;
  const int rows = min(kGroupM, num_m - first_m);
  const int r = t % per_group;
  return {first_m + r % rows, r / rows};
}

__device__ __forceinline__ void store_pair(float* y, float a, float b) { *reinterpret_cast<float2*>(y) = {a, b}; }
__device__ __forceinline__ void store_pair(__nv_bfloat16* y, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(a, b);
}

template <typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w, OutT* y,
                      int M, int N, int K) {
  extern __shared__ uint8_t smem_raw[];
  // 128B-swizzled tiles must start on 1024-byte boundaries.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* tiles_a = smem;                                  // [kStages][128][64] bf16
  uint8_t* tiles_b = smem + kStages * kTileA;               // [kStages][256][64] bf16
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles_b + kStages * kTileB);
  uint64_t* empty = full + kStages;

  const int num_m = (M + kBM - 1) / kBM, num_n = (N + kBN - 1) / kBN, num_k = (K + kBK - 1) / kBK;
  const int num_tiles = num_m * num_n;
  const int wg = warpgroup_index();

  if (threadIdx.x == 0) {
    tma_prefetch_map(&map_x);
    tma_prefetch_map(&map_w);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);  // lane 0 of each of the 8 consumer warps
    }
    fence_barrier_init();
  }
  __syncthreads();
  pdl_grid_dependency_wait();

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      PipeState<kStages> ps;
      for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
        const TileCoord tc = tile_coord(t, num_m, num_n);
        for (int kb = 0; kb < num_k; ++kb) {
          mbar_wait(&empty[ps.stage], ps.phase ^ 1u);
          mbar_arrive_expect_tx(&full[ps.stage], kTileA + kTileB);
          tma_load_2d(tiles_a + ps.stage * kTileA, &map_x, &full[ps.stage], kb * kBK, tc.m * kBM);
          tma_load_2d(tiles_b + ps.stage * kTileB, &map_w, &full[ps.stage], kb * kBK, tc.n * kBN);
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
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
      const TileCoord tc = tile_coord(t, num_m, num_n);
      consume_tile_64x256<kStages, kTileA, kTileB>(d, ps, full, empty, tiles_a, tiles_b, half, num_k, lane);

      const int row0 = tc.m * kBM + half * 64 + warp * 16 + lane / 4;
      const int col0 = tc.n * kBN + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = col0 + 8 * j;
        if (col < N) {
          if (row0 < M) store_pair(y + size_t(row0) * N + col, d[4 * j], d[4 * j + 1]);
          if (row0 + 8 < M) store_pair(y + size_t(row0 + 8) * N + col, d[4 * j + 2], d[4 * j + 3]);
        }
      }
    }
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    M3_CUDA_CHECK(cudaGetDevice(&dev));
    M3_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

template <typename OutT>
void launch(const CUtensorMap& mx, const CUtensorMap& mw, OutT* y, int M, int N, int K, cudaStream_t s, bool pdl) {
  static const bool configured = [] {
    M3_CUDA_CHECK(cudaFuncSetAttribute(gemm_wgmma_kernel<OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(kSmem)));
    return true;
  }();
  (void)configured;
  const int tiles = ((M + kBM - 1) / kBM) * ((N + kBN - 1) / kBN);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(tiles < sm_count() ? tiles : sm_count()));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  M3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_wgmma_kernel<OutT>, mx, mw, y, M, N, K));
}

}  // namespace

void gemm_bf16_nt_wgmma(const uint16_t* x, const uint16_t* W, int64_t M, int64_t N, int64_t K, void* y, GemmOut out,
                        cudaStream_t s, bool pdl) {
  M3_CUDA_REQUIRE(M >= 0 && N > 0 && K > 0 && N % 8 == 0 && K % 8 == 0,
                  "gemm_bf16_nt_wgmma: needs M >= 0 and N, K positive multiples of 8 (got M %lld N %lld K %lld)",
                  (long long)M, (long long)N, (long long)K);
  M3_CUDA_REQUIRE(M < (int64_t(1) << 31) && N < (int64_t(1) << 31) && K < (int64_t(1) << 31),
                  "gemm_bf16_nt_wgmma: dimensions must fit in int32");
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(y) % 16 == 0, "gemm_bf16_nt_wgmma: y %p is not 16-byte aligned", y);
  if (M == 0) return;
  const CUtensorMap mx = make_tma_map_2d(x, TmaDtype::BF16, M, K, K, kBM, kBK, TmaSwizzle::B128);
  const CUtensorMap mw = make_tma_map_2d(W, TmaDtype::BF16, N, K, K, kBN, kBK, TmaSwizzle::B128);
  if (out == GemmOut::F32)
    launch(mx, mw, static_cast<float*>(y), int(M), int(N), int(K), s, pdl);
  else
    launch(mx, mw, static_cast<__nv_bfloat16*>(y), int(M), int(N), int(K), s, pdl);
}

}  // namespace m3::cuda
