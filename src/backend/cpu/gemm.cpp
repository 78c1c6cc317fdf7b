// fp32 GEMM y = x · Wᵀ for the CPU reference backend.
// Every y[t, n] is one dot product over K with a fixed order (8 interleaved partial sums, then a fixed tree), so
// the value does not depend on T or on how the work is tiled — see the determinism contract in cpu_ops.h.
#include <algorithm>

#include "backend/cpu/cpu_ops.h"
#include "base/thread_pool.h"

namespace m3::cpu {

namespace {

constexpr int kLanes = 8;

inline float reduce_lanes(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// 4 weight rows × up to 4 tokens per tile keeps 16 dot products in flight and reuses each loaded x and W value.
template <int NT>
inline __attribute__((always_inline)) void tile_body(const float* x, int64_t K, const float* W, int64_t ldx,
                                                     float* y, int64_t ldy, int nrows) {
  float acc[NT][4][kLanes] = {};
  const int64_t K8 = K / kLanes * kLanes;
  for (int64_t k = 0; k < K8; k += kLanes) {
    for (int t = 0; t < NT; ++t) {
      const float* xr = x + t * ldx + k;
      for (int r = 0; r < 4; ++r) {
        if (r >= nrows) break;
        const float* wr = W + r * K + k;
        for (int l = 0; l < kLanes; ++l) acc[t][r][l] += xr[l] * wr[l];
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < nrows; ++r) {
      float tail = 0.f;
      for (int64_t k = K8; k < K; ++k) tail += x[t * ldx + k] * W[r * K + k];
      y[t * ldy + r] = reduce_lanes(acc[t][r]) + tail;
    }
}

// The same body compiled twice: for any x86-64, and for AVX2+FMA machines (chosen once at run time, so every
// call in a process takes the same path and results stay deterministic). Manual dispatch instead of
// target_clones because clang-14 (the fuzz builds) rejects target_clones on templates.
template <int NT>
void tile_generic(const float* x, int64_t K, const float* W, int64_t ldx, float* y, int64_t ldy, int nrows) {
  tile_body<NT>(x, K, W, ldx, y, ldy, nrows);
}
#if defined(__x86_64__)
template <int NT>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t K, const float* W, int64_t ldx, float* y,
                                                   int64_t ldy, int nrows) {
  tile_body<NT>(x, K, W, ldx, y, ldy, nrows);
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
const bool kHaveAvx2 = false;
template <int NT>
void tile_avx2(const float* x, int64_t K, const float* W, int64_t ldx, float* y, int64_t ldy, int nrows) {
  tile_body<NT>(x, K, W, ldx, y, ldy, nrows);
}
#endif

template <int NT>
void tile_kernel(const float* x, int64_t K, const float* W, int64_t ldx, float* y, int64_t ldy, int nrows) {
  if (kHaveAvx2)
    tile_avx2<NT>(x, K, W, ldx, y, ldy, nrows);
  else
    tile_generic<NT>(x, K, W, ldx, y, ldy, nrows);
}

}  // namespace

namespace {
MatmulInputHook g_input_hook = nullptr;
void* g_input_hook_ctx = nullptr;
}  // namespace

void set_matmul_input_hook(MatmulInputHook hook, void* ctx) {
  g_input_hook = hook;
  g_input_hook_ctx = ctx;
}

void matmul_nt(const float* x, int64_t T, int64_t K, const float* W, int64_t N, float* y) {
  if (g_input_hook)
    if (const float* nx = g_input_hook(x, T, K, W, g_input_hook_ctx)) x = nx;
  const int64_t row_tiles = (N + 3) / 4;
  // Parallel over output columns (weight rows): each thread streams its slice of W once per 4 tokens.
  ThreadPool::global().parallel_for(
      row_tiles,
      [&](int64_t begin, int64_t end) {
        for (int64_t rt = begin; rt < end; ++rt) {
          const int64_t n0 = rt * 4;
          const int nrows = int(std::min<int64_t>(4, N - n0));
          int64_t t = 0;
          for (; t + 4 <= T; t += 4) tile_kernel<4>(x + t * K, K, W + n0 * K, K, y + t * N + n0, N, nrows);
          for (; t < T; ++t) tile_kernel<1>(x + t * K, K, W + n0 * K, K, y + t * N + n0, N, nrows);
        }
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * std::max<int64_t>(T, 1) / 64)));
}

}  // namespace m3::cpu
