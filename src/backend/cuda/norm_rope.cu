#include "backend/cuda/norm_rope.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/kv_fp8.cuh"

namespace m3::cuda {

namespace {

constexpr int kThreads = 128;

// One block per row of D floats. Sum of squares in fp32 over a fixed tree (the CPU sums in fp64; the difference
// is rounding only).
__global__ void rms_norm_kernel(const float* x, int64_t D, const float* __restrict__ w, float eps, float* y) {
  const float* xr = x + blockIdx.x * D;
  float* yr = y + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = float(1.0 / sqrt(double(ss) / double(D) + double(eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = xr[i] * inv * (1.0f + w[i]);
}

// The same norm writing bf16 (round to nearest even, as f32_to_bf16 would round the fp32 result: bit-identical to
// norm then convert) and, when y is not null, the fp32 result too.
__global__ void rms_norm_bf16_kernel(const float* x, int64_t D, const float* __restrict__ w, float eps,
                                     __nv_bfloat16* __restrict__ yb, float* y) {
  const float* xr = x + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = float(1.0 / sqrt(double(ss) / double(D) + double(eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = xr[i] * inv * (1.0f + w[i]);
    yb[blockIdx.x * D + i] = __float2bfloat16_rn(v);
    if (y) y[blockIdx.x * D + i] = v;
  }
}

// Row kernels for the decode step: one CTA of kRowThreads per row holds the row in registers — thread j owns float4
// chunks j, j + kRowThreads, … (kChunks of them) — so every load of the row (and of w) is in flight at once. The loops
// above issue one dependent load per iteration (48 HBM round trips for H = 6144 at 128 threads): 31 µs per norm at
// T = 1 on the H200, 11 of them per decode step of the 5-layer slice (bench/results/2026-12-03-decode-step-h200.md).
// Sum of squares: each thread's chunks in order, then block_sum (the CPU sums in fp64; the difference is rounding).
constexpr int kRowThreads = 256, kMaxRowChunks = 8;  // rows of ≤ 8192 floats take the register path

// kQ (FP8 prefill GEMM input, D % 128 == 0): the bf16-rounded row also quantised per 1×128 into qo (a warp's 32
// chunks of one iteration are one 128-block); grid = qo.T_pad rows, the rows ≥ `rows` written as padding.
template <int kChunks, bool kQ = false>
__global__ void __launch_bounds__(kRowThreads) rms_norm_row_kernel(const float* x, int D, const float* __restrict__ w,
                                                                   float eps, float* y, __nv_bfloat16* yb,
                                                                   Fp8ActOut qo = {}, int rows = 0) {
  const int n4 = D >> 2;
  if constexpr (kQ) {
    if (int(blockIdx.x) >= rows) {  // cuBLASLt's row padding: zeros with scale 1
      for (int j = threadIdx.x; j < n4; j += kRowThreads)
        reinterpret_cast<uint32_t*>(qo.q + int64_t(blockIdx.x) * D)[j] = 0;
      for (int kb = threadIdx.x; kb < D / 128; kb += kRowThreads) qo.s[kb * qo.ld_s + blockIdx.x] = 1.0f;
      return;
    }
  }
  const float4* xr = reinterpret_cast<const float4*>(x + int64_t(blockIdx.x) * D);
  const float4* wr = reinterpret_cast<const float4*>(w);
  float4 xv[kChunks], wv[kChunks];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int j = threadIdx.x + k * kRowThreads;
    xv[k] = j < n4 ? xr[j] : make_float4(0.f, 0.f, 0.f, 0.f);
    wv[k] = j < n4 ? __ldg(wr + j) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k)
    ss += xv[k].x * xv[k].x, ss += xv[k].y * xv[k].y, ss += xv[k].z * xv[k].z, ss += xv[k].w * xv[k].w;
  ss = block_sum(ss);  // (its __syncthreads also orders every read of x before an in-place write)
  const float inv = float(1.0 / sqrt(double(ss) / double(D) + double(eps)));
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int j = threadIdx.x + k * kRowThreads;
    if (j >= n4) break;
    const float4 v = make_float4(xv[k].x * inv * (1.0f + wv[k].x), xv[k].y * inv * (1.0f + wv[k].y),
                                 xv[k].z * inv * (1.0f + wv[k].z), xv[k].w * inv * (1.0f + wv[k].w));
    const int64_t o = int64_t(blockIdx.x) * D + 4 * j;
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    if (yb) {
      uint2 u;
      u.x = *reinterpret_cast<uint32_t*>(&lo), u.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(yb + o) = u;
    }
    if (y) *reinterpret_cast<float4*>(y + o) = v;
    if constexpr (kQ) {  // j >> 5 is the 128-block; the whole warp is in it (n4 is a multiple of 32)
      const float vb[4] = {__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi)};
      float sc;
      reinterpret_cast<uint32_t*>(qo.q)[o >> 2] = quant_block128_warp(vb, sc);
      if ((threadIdx.x & 31) == 0) qo.s[int64_t(j >> 5) * qo.ld_s + blockIdx.x] = sc;
    }
  }
}

// Embedding rows the same way: bf16 tables in 8-element (16-byte) chunks, fp32 tables in float4 chunks.
template <int kChunks, bool kBf16>
__global__ void __launch_bounds__(kRowThreads) embed_row_kernel(const void* __restrict__ table, int H,
                                                                const int32_t* __restrict__ ids, float* out) {
  constexpr int kPer = kBf16 ? 8 : 4;  // elements per chunk
  const int n = H / kPer;
  const int64_t id = ids[blockIdx.x];
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(table) +
                                                    id * H * int64_t(kBf16 ? 2 : 4));
  float4* dst = reinterpret_cast<float4*>(out + int64_t(blockIdx.x) * H);
  uint4 v[kChunks];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int j = threadIdx.x + k * kRowThreads;
    if (j < n) v[k] = __ldg(src + j);
  }
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int j = threadIdx.x + k * kRowThreads;
    if (j >= n) break;
    if constexpr (kBf16) {  // bf16 → fp32 is a 16-bit shift
      dst[2 * j] = make_float4(__uint_as_float(v[k].x << 16), __uint_as_float(v[k].x & 0xffff0000u),
                               __uint_as_float(v[k].y << 16), __uint_as_float(v[k].y & 0xffff0000u));
      dst[2 * j + 1] = make_float4(__uint_as_float(v[k].z << 16), __uint_as_float(v[k].z & 0xffff0000u),
                                   __uint_as_float(v[k].w << 16), __uint_as_float(v[k].w & 0xffff0000u));
    } else {
      dst[j] = make_float4(__uint_as_float(v[k].x), __uint_as_float(v[k].y), __uint_as_float(v[k].z),
                           __uint_as_float(v[k].w));
    }
  }
}

// The chunk count a row of n chunks needs (a template value ≥ it), or 0 when it is over kMaxRowChunks.
int row_chunks(int64_t n) {
  const int64_t c = (n + kRowThreads - 1) / kRowThreads;
  return c <= 1 ? 1 : c <= 2 ? 2 : c <= 4 ? 4 : c <= 6 ? 6 : c <= kMaxRowChunks ? kMaxRowChunks : 0;
}
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename F>
void with_chunks(int c, F&& f) {
  switch (c) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// The register-row norm applies: D a multiple of 4 up to 4·kRowThreads·kMaxRowChunks, 16-byte aligned rows.
bool norm_rows_ok(int64_t D, const float* x, const float* w, const void* y1, const void* y2) {
  return D % 4 == 0 && row_chunks(D / 4) > 0 && aligned16(x) && aligned16(w) && aligned16(y1) && aligned16(y2);
}

// grid (T, n_q + n_k + n_v), block kThreads, dynamic smem D floats. CT: the cache element type (q_out is fp32, or
// bf16 into q_out_bf16 when that is set).
template <typename CT>
__device__ __forceinline__ void cache_store(CT* p, float v, float) { kv_store(p, v); }
__device__ __forceinline__ void cache_store(e4m3_t* p, float v, float scale) {
  *reinterpret_cast<uint8_t*>(p) = e4m3_quantize(v, scale);
}

template <typename CT>
__global__ void heads_norm_rope_kernel(HeadsNormRopeArgs a) {
  extern __shared__ float row[];
  const int t = blockIdx.x, hh = blockIdx.y, D = a.D;
  int kind, head, col0;  // kind 0 = q, 1 = k, 2 = v
  if (hh < a.n_q) {
    kind = 0, head = hh, col0 = a.q_col0;
  } else if (hh < a.n_q + a.n_k) {
    kind = 1, head = hh - a.n_q, col0 = a.k_col0;
  } else {
    kind = 2, head = hh - a.n_q - a.n_k, col0 = a.v_col0;
  }
  const float* src = a.src + int64_t(t) * a.src_ld + col0 + int64_t(head) * D;
  const int32_t p = a.pos[t];
  float* qdst = nullptr;
  __nv_bfloat16* qdst_b = nullptr;
  CT* cdst = nullptr;
  if (kind == 0) {
    if (a.q_out_bf16)
      qdst_b = reinterpret_cast<__nv_bfloat16*>(a.q_out_bf16) + (int64_t(t) * a.n_q + head) * D;
    else
      qdst = a.q_out + (int64_t(t) * a.n_q + head) * D;
  } else {
    const int64_t base = int64_t(a.slot_page[t]) * a.page_stride + int64_t(p % a.block_size) * D;
    cdst = kind == 1 ? static_cast<CT*>(a.k_cache) + base + head * a.k_head_stride
                     : static_cast<CT*>(a.v_cache) + base + head * a.v_head_stride;
  }
  if (kind == 2) {
    for (int i = threadIdx.x; i < D; i += blockDim.x) cache_store(cdst + i, src[i], a.v_scale);
    return;
  }
  const float* w = kind == 0 ? a.q_w : a.k_w;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) ss += src[i] * src[i];
  ss = block_sum(ss);
  const float inv = float(1.0 / sqrt(double(ss) / double(D) + double(a.eps)));
  for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = src[i] * inv * (1.0f + w[i]);
  __syncthreads();
  const int half = a.rotary_dim / 2;
  const float fp = float(p);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float v = row[i];
    if (i < half) {
      const float ang = fp * a.inv_freq[i];
      v = row[i] * cosf(ang) - row[i + half] * sinf(ang);
    } else if (i < 2 * half) {
      const float ang = fp * a.inv_freq[i - half];
      v = row[i] * cosf(ang) + row[i - half] * sinf(ang);
    }
    if (qdst_b)
      qdst_b[i] = __float2bfloat16_rn(v);
    else if (kind == 0)
      qdst[i] = v;
    else
      cache_store(cdst + i, v, a.k_scale);
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ x, int64_t D, const int32_t* __restrict__ idx,
                                   float* __restrict__ y) {
  const float* src = x + int64_t(idx[blockIdx.x]) * D;
  float* dst = y + int64_t(blockIdx.x) * D;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) dst[i] = src[i];
}

__global__ void embed_kernel(const void* table, bool bf16, int64_t H, const int32_t* __restrict__ ids, float* out) {
  const int64_t id = ids[blockIdx.x];
  float* dst = out + int64_t(blockIdx.x) * H;
  if (bf16) {
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(table) + id * H;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[i] = __bfloat162float(src[i]);
  } else {
    const float* src = static_cast<const float*>(table) + id * H;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

void rms_norm_gemma(const float* x, int64_t rows, int64_t D, const float* w, float eps, float* y, cudaStream_t s) {
  if (rows <= 0) return;
  M3_CUDA_REQUIRE(rows < (int64_t(1) << 31), "rms_norm_gemma: %lld rows is too many", (long long)rows);
  if (norm_rows_ok(D, x, w, y, nullptr))
    with_chunks(row_chunks(D / 4), [&](auto c) {
      rms_norm_row_kernel<decltype(c)::value><<<unsigned(rows), kRowThreads, 0, s>>>(x, int(D), w, eps, y, nullptr);
    });
  else
    rms_norm_kernel<<<unsigned(rows), kThreads, 0, s>>>(x, D, w, eps, y);
  M3_CUDA_LAUNCH_CHECK();
}

void rms_norm_gemma_bf16(const float* x, int64_t rows, int64_t D, const float* w, float eps, uint16_t* yb, float* y,
                        cudaStream_t s) {
  if (rows <= 0) return;
  M3_CUDA_REQUIRE(rows < (int64_t(1) << 31), "rms_norm_gemma: %lld rows is too many", (long long)rows);
  auto* b = reinterpret_cast<__nv_bfloat16*>(yb);
  if (norm_rows_ok(D, x, w, yb, y))
    with_chunks(row_chunks(D / 4), [&](auto c) {
      rms_norm_row_kernel<decltype(c)::value><<<unsigned(rows), kRowThreads, 0, s>>>(x, int(D), w, eps, y, b);
    });
  else
    rms_norm_bf16_kernel<<<unsigned(rows), kThreads, 0, s>>>(x, D, w, eps, b, y);
  M3_CUDA_LAUNCH_CHECK();
}

void rms_norm_gemma_bf16_e4m3(const float* x, int64_t rows, int64_t D, const float* w, float eps, uint16_t* yb,
                              const Fp8ActOut& q, cudaStream_t s) {
  M3_CUDA_REQUIRE(D % 128 == 0 && q.q && q.s && q.T_pad >= rows && q.ld_s >= q.T_pad,
                  "rms_norm_gemma_bf16_e4m3: D %lld must be a multiple of 128, T_pad ≥ rows and ld_s ≥ T_pad",
                  (long long)D);
  if (q.T_pad <= 0) return;
  M3_CUDA_REQUIRE(q.T_pad < (int64_t(1) << 31), "rms_norm_gemma: %lld rows is too many", (long long)q.T_pad);
  auto* b = reinterpret_cast<__nv_bfloat16*>(yb);
  if (norm_rows_ok(D, x, w, yb, q.q)) {
    with_chunks(row_chunks(D / 4), [&](auto c) {
      rms_norm_row_kernel<decltype(c)::value, true>
          <<<unsigned(q.T_pad), kRowThreads, 0, s>>>(x, int(D), w, eps, nullptr, b, q, int(rows));
    });
    M3_CUDA_LAUNCH_CHECK();
    return;
  }
  // Rows too wide for the register path (or unaligned): the two passes the fused kernel replaces.
  M3_CUDA_REQUIRE(yb, "rms_norm_gemma_bf16_e4m3: a row wider than %d floats needs the bf16 output", 4 * 8 * kRowThreads);
  rms_norm_gemma_bf16(x, rows, D, w, eps, yb, nullptr, s);
  fp8_quantize_act_1x128(yb, true, rows, q.T_pad, D, q.q, q.s, q.ld_s, s);
}

std::vector<float> rope_inv_freq(int rotary_dim, double theta) {
  std::vector<float> f(size_t(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) f[i] = float(1.0 / std::pow(theta, double(2 * i) / double(rotary_dim)));
  return f;
}

void heads_norm_rope(const HeadsNormRopeArgs& a, cudaStream_t s) {
  const int heads = a.n_q + a.n_k + a.n_v;
  if (a.T <= 0 || heads == 0) return;
  M3_CUDA_REQUIRE(a.D > 0 && a.rotary_dim >= 0 && a.rotary_dim <= a.D && a.rotary_dim % 2 == 0,
                  "heads_norm_rope: rotary_dim %d must be even and ≤ head dim %d", a.rotary_dim, a.D);
  M3_CUDA_REQUIRE(heads <= 65535, "heads_norm_rope: %d heads per token is too many", heads);
  const dim3 grid(unsigned(a.T), unsigned(heads));
  M3_CUDA_REQUIRE(a.cache_type != KvType::E4M3 || (a.k_scale > 0.f && a.v_scale > 0.f),
                  "heads_norm_rope: e4m3 cache scales must be > 0");
  if (a.cache_type == KvType::BF16)
    heads_norm_rope_kernel<__nv_bfloat16><<<grid, kThreads, size_t(a.D) * sizeof(float), s>>>(a);
  else if (a.cache_type == KvType::E4M3)
    heads_norm_rope_kernel<e4m3_t><<<grid, kThreads, size_t(a.D) * sizeof(float), s>>>(a);
  else
    heads_norm_rope_kernel<float><<<grid, kThreads, size_t(a.D) * sizeof(float), s>>>(a);
  M3_CUDA_LAUNCH_CHECK();
}

void gather_rows(const float* x, int64_t D, const int32_t* idx, int64_t n, float* y, cudaStream_t s) {
  if (n <= 0) return;
  gather_rows_kernel<<<unsigned(n), kThreads, 0, s>>>(x, D, idx, y);
  M3_CUDA_LAUNCH_CHECK();
}

void embed_rows(const void* table, bool bf16, int64_t H, const int32_t* ids, int64_t T, float* out, cudaStream_t s) {
  if (T <= 0) return;
  const int per = bf16 ? 8 : 4, c = row_chunks(H / per);
  if (H % per == 0 && c > 0 && aligned16(table) && aligned16(out))
    with_chunks(c, [&](auto k) {
      if (bf16)
        embed_row_kernel<decltype(k)::value, true><<<unsigned(T), kRowThreads, 0, s>>>(table, int(H), ids, out);
      else
        embed_row_kernel<decltype(k)::value, false><<<unsigned(T), kRowThreads, 0, s>>>(table, int(H), ids, out);
    });
  else
    embed_kernel<<<unsigned(T), kThreads, 0, s>>>(table, bf16, H, ids, out);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
