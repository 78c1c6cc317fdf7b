// Vision-tower kernels (issue 12 item 4): see vision_ops.cuh for the contracts and the CPU twins.
#include "backend/cuda/vision_ops.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/warp_mma.cuh"

namespace m3::cuda {

namespace {

constexpr int kNormThreads = 256;

// One block per row. Two passes over the row (it stays in L1/L2): mean, then the centred sum of squares — the
// one-pass E[x²] − μ² form loses the digits a bf16 GEMM input still has when |μ| ≫ σ.
__global__ void __launch_bounds__(kNormThreads)
    layer_norm_kernel(const float* x, int64_t D, const float* __restrict__ w,
                      const float* __restrict__ b, float eps, float* y, __nv_bfloat16* __restrict__ yb) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s) / float(D);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float d = xr[i] - mean;
    ss += d * d;
  }
  const float inv = rsqrtf(block_sum(ss) / float(D) + eps);
  __syncthreads();  // every thread has read its x before y (which may alias x) is written
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = (xr[i] - mean) * inv * w[i] + b[i];
    if (y) y[r * D + i] = v;
    if (yb) yb[r * D + i] = __float2bfloat16_rn(v);
  }
}

__device__ __forceinline__ float gelu_erf(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

__global__ void bias_act_kernel(float* __restrict__ y, int64_t n, int64_t N, const float* __restrict__ b, bool gelu,
                                bool write_f32, __nv_bfloat16* __restrict__ yb) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = y[i];
    if (b) v += b[i % N];
    if (gelu) v = gelu_erf(v);
    if (write_f32) y[i] = v;
    if (yb) yb[i] = __float2bfloat16_rn(v);
  }
}

// One thread per (row r, head h, i < hd/2): v elements i and i + hd/2, and for q and k
// - kHf517 (official = false): the rotate-half pair (i, i + hd/2);
// - kOfficial: the NeoX pair (i, i + 3n) for i < 3n (n = hd/6), else the unrotated elements 6n + 2j, 6n + 2j + 1
//   with j = i − 3n (hd − 6n is even for even hd, so these threads cover them exactly).
__global__ void qkv_rope_kernel(const float* __restrict__ qkv, const float* __restrict__ bias, int64_t R, int H,
                                int hd, bool official, const int32_t* __restrict__ pos_t,
                                const int32_t* __restrict__ pos_h, const int32_t* __restrict__ pos_w,
                                const float* __restrict__ inv_freq, __nv_bfloat16* __restrict__ q,
                                __nv_bfloat16* __restrict__ k, __nv_bfloat16* __restrict__ v) {
  const int half = hd / 2, quarter = hd / 4, n3 = official ? 3 * (hd / 6) : half, nf = hd / 6;
  const int64_t D = int64_t(H) * hd, per_row = int64_t(H) * half;
  const int64_t n = R * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row;
    const int hh = int((idx % per_row) / half), i = int(idx % half);
    const float* row = qkv + r * 3 * D;
    const int64_t c0 = int64_t(hh) * hd, o0 = r * D + c0;
    {
      const int64_t col = c0 + i;
      v[o0 + i] = __float2bfloat16_rn(row[2 * D + col] + bias[2 * D + col]);
      v[o0 + i + half] = __float2bfloat16_rn(row[2 * D + col + half] + bias[2 * D + col + half]);
    }
    if (i >= n3) {  // official only: two dims past the rotated ones, copied
      const int64_t col = c0 + 2 * n3 + 2 * (i - n3);
      for (int e = 0; e < 2; ++e) {
        q[r * D + col + e] = __float2bfloat16_rn(row[col + e] + bias[col + e]);
        k[r * D + col + e] = __float2bfloat16_rn(row[D + col + e] + bias[D + col + e]);
      }
      continue;
    }
    // Angle. kHf517: frequency i of the temporal-group position for i < hd/4, frequency i − hd/4 of the patch row
    // after. kOfficial: axis i / n (t, h, w), frequency i mod n.
    float ang;
    if (!official) {
      ang = i < quarter ? float(pos_t[r]) * inv_freq[i] : float(pos_h[r]) * inv_freq[i - quarter];
    } else {
      const int axis = i / nf;
      const int32_t p = axis == 0 ? pos_t[r] : axis == 1 ? pos_h[r] : pos_w[r];
      ang = float(p) * inv_freq[i - axis * nf];
    }
    float sn, cs;
    sincosf(ang, &sn, &cs);
    const int64_t col = c0 + i, o = o0 + i;
    {
      const float a = row[col] + bias[col], bb = row[col + n3] + bias[col + n3];
      q[o] = __float2bfloat16_rn(a * cs - bb * sn);
      q[o + n3] = __float2bfloat16_rn(bb * cs + a * sn);
    }
    {
      const float a = row[D + col] + bias[D + col], bb = row[D + col + n3] + bias[D + col + n3];
      k[o] = __float2bfloat16_rn(a * cs - bb * sn);
      k[o + n3] = __float2bfloat16_rn(bb * cs + a * sn);
    }
  }
}

// Flash-style attention, one CTA per (64-row query tile of one item, head): 4 warps × 16 query rows, key/value
// tiles of 64 rows staged in shared memory (cp.async, zero-filled past the item's end), S = Q·Kᵀ and O += P·V with
// mma.sync m16n8k16 bf16 → fp32, online softmax in fp32 (base 2). Shared rows are padded to hd + 8 elements: the
// row stride is then 4·(odd) words, so the 8 rows of a fragment load hit distinct banks. Q fragments come straight
// from global memory (read once per CTA).
template <int HD>
__global__ void __launch_bounds__(128)
    vision_attn_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                       const __nv_bfloat16* __restrict__ v, const int32_t* __restrict__ tiles, int H,
                       float scale_log2, __nv_bfloat16* __restrict__ out) {
  constexpr int BK = 64, LDS = HD + 8, KC = HD / 16, ND = HD / 8, CH = HD / 8;
  __shared__ __align__(16) __nv_bfloat16 Ks[BK * LDS];
  __shared__ __align__(16) __nv_bfloat16 Vs[BK * LDS];
  const int seq0 = tiles[3 * blockIdx.x], len = tiles[3 * blockIdx.x + 1], q0 = tiles[3 * blockIdx.x + 2];
  const int h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t ld = int64_t(H) * HD;  // row stride of q, k, v, out (elements)
  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;  // this thread's two query rows (within the item)

  auto ldq = [&](int r, int col) -> uint32_t {
    if (r >= len) return 0u;
    return *reinterpret_cast<const uint32_t*>(q + (int64_t(seq0) + r) * ld + int64_t(h) * HD + col);
  };
  uint32_t qa[KC][4];
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    qa[kc][0] = ldq(r0, 16 * kc + 2 * t);
    qa[kc][1] = ldq(r1, 16 * kc + 2 * t);
    qa[kc][2] = ldq(r0, 16 * kc + 8 + 2 * t);
    qa[kc][3] = ldq(r1, 16 * kc + 8 + 2 * t);
  }
  float o[ND][4];
#pragma unroll
  for (int j = 0; j < ND; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int k0 = 0; k0 < len; k0 += BK) {
    __syncthreads();  // the previous tile has been consumed by every warp
    for (int c = threadIdx.x; c < BK * CH; c += blockDim.x) {
      const int row = c / CH, ch = c % CH, key = k0 + row;
      const int64_t src = (int64_t(seq0) + min(key, len - 1)) * ld + int64_t(h) * HD + ch * 8;
      const int bytes = key < len ? 16 : 0;
      cp_async16(smem_addr(&Ks[row * LDS + ch * 8]), k + src, bytes);
      cp_async16(smem_addr(&Vs[row * LDS + ch * 8]), v + src, bytes);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // S [16 × 64] of this warp.
    float sc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
      const __nv_bfloat16* kr = &Ks[(8 * j + g) * LDS + 2 * t];
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * kc);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * kc + 8);
        mma_bf16_16816(sc[j], qa[kc], b0, b1);
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + 8 * j + 2 * t + (e & 1);
        sc[j][e] = key < len ? sc[j][e] * scale_log2 : -INFINITY;
        if (e < 2) mx0 = fmaxf(mx0, sc[j][e]);
        else mx1 = fmaxf(mx1, sc[j][e]);
      }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    // Key k0 < len is valid for every row, so the new maxima are finite.
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);
    m0 = n0, m1 = n1;
    l0 *= a0, l1 *= a1;
#pragma unroll
    for (int j = 0; j < ND; ++j) o[j][0] *= a0, o[j][1] *= a0, o[j][2] *= a1, o[j][3] *= a1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sc[j][0] = exp2f(sc[j][0] - n0), sc[j][1] = exp2f(sc[j][1] - n0);
      sc[j][2] = exp2f(sc[j][2] - n1), sc[j][3] = exp2f(sc[j][3] - n1);
      l0 += sc[j][0] + sc[j][1];
      l1 += sc[j][2] + sc[j][3];
    }
    // O += P·V: the S accumulators of n-tiles 2c, 2c+1 are the A fragment of key chunk c.
#pragma unroll
    for (int c = 0; c < BK / 16; ++c) {
      const uint32_t pa[4] = {pack_bf16x2(sc[2 * c][0], sc[2 * c][1]), pack_bf16x2(sc[2 * c][2], sc[2 * c][3]),
                              pack_bf16x2(sc[2 * c + 1][0], sc[2 * c + 1][1]),
                              pack_bf16x2(sc[2 * c + 1][2], sc[2 * c + 1][3])};
      const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
      for (int jd = 0; jd < ND; jd += 2) {
        uint32_t b0, b1, b2, b3;
        const int key = 16 * c + (mi & 1) * 8 + rr, col = 8 * (jd + (mi >> 1));
        ldmatrix_x4_trans(smem_addr(&Vs[key * LDS + col]), b0, b1, b2, b3);
        mma_bf16_16816(o[jd], pa, b0, b1);
        mma_bf16_16816(o[jd + 1], pa, b2, b3);
      }
    }
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
  for (int jd = 0; jd < ND; ++jd) {
    const int col = h * HD + 8 * jd + 2 * t;
    if (r0 < len)
      *reinterpret_cast<__nv_bfloat162*>(out + (int64_t(seq0) + r0) * ld + col) =
          __floats2bfloat162_rn(o[jd][0] * i0, o[jd][1] * i0);
    if (r1 < len)
      *reinterpret_cast<__nv_bfloat162*>(out + (int64_t(seq0) + r1) * ld + col) =
          __floats2bfloat162_rn(o[jd][2] * i1, o[jd][3] * i1);
  }
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned(std::min<int64_t>((n + threads - 1) / threads, int64_t(sm_count()) * 16));
}

}  // namespace

void vision_layer_norm(const float* x, int64_t rows, int64_t D, const float* w, const float* b, float eps, float* y,
                       uint16_t* yb, cudaStream_t s) {
  if (rows <= 0) return;
  M3_CUDA_REQUIRE(D > 0 && rows < (int64_t(1) << 31), "vision_layer_norm: bad shape [%lld, %lld]", (long long)rows,
                  (long long)D);
  layer_norm_kernel<<<unsigned(rows), kNormThreads, 0, s>>>(x, D, w, b, eps, y,
                                                             reinterpret_cast<__nv_bfloat16*>(yb));
  M3_CUDA_LAUNCH_CHECK();
}

void vision_bias_act(float* y, int64_t rows, int64_t N, const float* b, bool gelu, bool write_f32, uint16_t* yb,
                     cudaStream_t s) {
  const int64_t n = rows * N;
  if (n <= 0) return;
  bias_act_kernel<<<blocks_for(n, 256), 256, 0, s>>>(y, n, N, b, gelu, write_f32,
                                                     reinterpret_cast<__nv_bfloat16*>(yb));
  M3_CUDA_LAUNCH_CHECK();
}

std::vector<float> vision_rope_inv_freq(int hd, double theta, VisionRope rope) {
  // Same expressions and precision as the CPU twins (fp32 pow of fp32 operands).
  const bool official = rope == VisionRope::kOfficial;
  const int n = official ? hd / 6 : hd / 4, denom = official ? 2 * n : hd / 2;
  std::vector<float> inv(size_t(std::max(n, 0)));
  for (int k = 0; k < n; ++k) inv[size_t(k)] = 1.0f / std::pow(float(theta), float(2 * k) / float(denom));
  return inv;
}

void vision_qkv_rope(const float* qkv, const float* bias, int64_t R, int H, int hd, VisionRope rope,
                     const int32_t* pos_t, const int32_t* pos_h, const int32_t* pos_w, const float* inv_freq,
                     uint16_t* q, uint16_t* k, uint16_t* v, cudaStream_t s) {
  if (R <= 0) return;
  M3_CUDA_REQUIRE(H > 0 && hd > 0 && hd % 4 == 0, "vision_qkv_rope: head dim %d must be a positive multiple of 4", hd);
  const bool official = rope == VisionRope::kOfficial;
  M3_CUDA_REQUIRE(!official || (hd >= 6 && pos_w), "vision_qkv_rope: the 3D RoPE needs hd ≥ 6 (%d) and pos_w", hd);
  const int64_t n = R * H * (hd / 2);
  qkv_rope_kernel<<<blocks_for(n, 256), 256, 0, s>>>(qkv, bias, R, H, hd, official, pos_t, pos_h, pos_w, inv_freq,
                                                     reinterpret_cast<__nv_bfloat16*>(q),
                                                     reinterpret_cast<__nv_bfloat16*>(k),
                                                     reinterpret_cast<__nv_bfloat16*>(v));
  M3_CUDA_LAUNCH_CHECK();
}

std::vector<int32_t> vision_attention_tiles(const std::vector<int64_t>& begin) {
  std::vector<int32_t> tiles;
  for (size_t i = 0; i + 1 < begin.size(); ++i) {
    const int64_t len = begin[i + 1] - begin[i];
    M3_CUDA_REQUIRE(len >= 0 && begin[i + 1] < (int64_t(1) << 31), "vision_attention_tiles: bad item bounds");
    for (int64_t q0 = 0; q0 < len; q0 += kVisionAttnTileRows) {
      tiles.push_back(int32_t(begin[i]));
      tiles.push_back(int32_t(len));
      tiles.push_back(int32_t(q0));
    }
  }
  return tiles;
}

void vision_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* tiles, int num_tiles,
                      int H, int hd, float scale, uint16_t* out, cudaStream_t s) {
  if (num_tiles <= 0) return;
  M3_CUDA_REQUIRE(H > 0 && H <= 65535, "vision_attention: %d heads", H);
  const float sl2 = scale * 1.4426950408889634f;
  const dim3 grid{unsigned(num_tiles), unsigned(H), 1u};
  const auto* qb = reinterpret_cast<const __nv_bfloat16*>(q);
  const auto* kb = reinterpret_cast<const __nv_bfloat16*>(k);
  const auto* vb = reinterpret_cast<const __nv_bfloat16*>(v);
  auto* ob = reinterpret_cast<__nv_bfloat16*>(out);
  switch (hd) {
#define M3_VISION_ATTN_CASE(HD) \
  case HD: vision_attn_kernel<HD><<<grid, 128, 0, s>>>(qb, kb, vb, tiles, H, sl2, ob); break;
    M3_VISION_ATTN_CASE(16)
    M3_VISION_ATTN_CASE(32)
    M3_VISION_ATTN_CASE(48)
    M3_VISION_ATTN_CASE(64)
    M3_VISION_ATTN_CASE(80)
    M3_VISION_ATTN_CASE(96)
    M3_VISION_ATTN_CASE(112)
    M3_VISION_ATTN_CASE(128)
#undef M3_VISION_ATTN_CASE
    default:
      failf("vision_attention: head dim %d is not supported (a multiple of 16 in [16, 128])", hd);
  }
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
