#include "backend/cuda/attention_dense.cuh"

#include <algorithm>

namespace m3::cuda {

namespace {

constexpr int kWarps = 4;            // one CTA = 4 warps; warp w handles query heads g ≡ w (mod 4)
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 32;            // keys per shared-memory tile: one key per lane when scoring

// One CTA per (fake request r, split). Online softmax in fp32; K/V tiles of 32 tokens staged in shared memory with
// 16-byte loads. DPL = D / 32 output channels per lane, HPW = query heads per warp (compile-time so accumulators
// stay in registers). Per tile a warp first scores its HPW heads against the 32 keys (lane = key; one float4 of K
// feeds HPW float4s of q), then updates the softmax state of each head, then accumulates P·V with one V read per
// (key, channel) shared by the HPW heads.
// smem: q [G, D] | K tile [32, D + 4] (row stride ≡ 4 mod 32 words: the 8 lanes of a float4 phase hit distinct
// banks) | V tile [32, D].
template <int DPL, int HPW, typename CT>
__global__ void __launch_bounds__(kThreads) paged_gqa_kernel(PagedGqaArgs a) {
  extern __shared__ float4 smem4[];
  constexpr int D = 32 * DPL, D4 = D / 4, KS = D + 4;
  float* qs = reinterpret_cast<float*>(smem4);
  float* ks = qs + a.G * D;
  float* vs = ks + kTile * KS;
  const int r = blockIdx.x, split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* q4 = reinterpret_cast<const float4*>(a.q + int64_t(r) * a.G * D);
  for (int i = threadIdx.x; i < a.G * D4; i += kThreads) reinterpret_cast<float4*>(qs)[i] = q4[i];

  const int beg = a.indptr[r], end = a.indptr[r + 1];
  const int per = (end - beg + a.num_splits - 1) / a.num_splits;
  const int p0 = beg + split * per, p1 = min(end, p0 + per);
  float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[hh][i] = 0.f;
  }
  for (int pg = p0; pg < p1; ++pg) {
    const int64_t vp = a.indices[pg];
    const int ntok = pg == end - 1 ? a.last_len[r] : a.page_size;
    const CT* kp = static_cast<const CT*>(a.k) + vp * a.stride_page;
    const CT* vpp = static_cast<const CT*>(a.v) + vp * a.stride_page;
    for (int j0 = 0; j0 < ntok; j0 += kTile) {
      const int nt = min(kTile, ntok - j0);
      __syncthreads();  // the previous tile is consumed (and q is loaded)
      for (int i = threadIdx.x; i < nt * D4; i += kThreads) {
        const int j = i / D4, d4 = i % D4;
        const int64_t off = int64_t(j0 + j) * a.stride_tok + 4 * d4;
        *reinterpret_cast<float4*>(ks + j * KS + 4 * d4) = kv_load4(kp + off);
        *reinterpret_cast<float4*>(vs + j * D + 4 * d4) = kv_load4(vpp + off);
      }
      __syncthreads();
      // Scores: lane = key (rows ≥ nt hold stale data and are masked below).
      float dot[HPW];
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) dot[hh] = 0.f;
      const float4* kr = reinterpret_cast<const float4*>(ks + lane * KS);
#pragma unroll 4
      for (int d4 = 0; d4 < D4; ++d4) {
        const float4 kv = kr[d4];
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) {
          const int g = warp + hh * kWarps;
          if (g < a.G) {
            const float4 qv = reinterpret_cast<const float4*>(qs + g * D)[d4];
            dot[hh] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
          }
        }
      }
      float p[HPW];
#pragma unroll
      for (int hh = 0; hh < HPW; ++hh) {
        p[hh] = 0.f;
        const int g = warp + hh * kWarps;
        if (g < a.G) {  // uniform per warp
          const float sc = lane < nt ? dot[hh] * a.scale : -INFINITY;
          const float mnew = fmaxf(m[hh], warp_max(sc));
          const float alpha = expf(m[hh] - mnew);  // m = −inf on the first tile → 0
          p[hh] = lane < nt ? expf(sc - mnew) : 0.f;
          l[hh] = l[hh] * alpha + warp_sum(p[hh]);
#pragma unroll
          for (int i = 0; i < DPL; ++i) acc[hh][i] *= alpha;
          m[hh] = mnew;
        }
      }
      // P·V: one V read per (key, channel), shared by the warp's heads.
      for (int j = 0; j < nt; ++j) {
        float v[DPL];
#pragma unroll
        for (int i = 0; i < DPL; ++i) v[i] = vs[j * D + lane + 32 * i];
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) {
          if (warp + hh * kWarps < a.G) {
            const float pj = __shfl_sync(0xffffffffu, p[hh], j);
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[hh][i] += pj * v[i];
          }
        }
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    const int g = warp + hh * kWarps;
    if (g >= a.G) continue;
    const float inv = l[hh] > 0.f ? 1.f / l[hh] : 0.f;
    float* o = a.num_splits == 1 ? a.out + (int64_t(r) * a.G + g) * D
                                 : a.part_o + ((int64_t(split) * a.R + r) * a.G + g) * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[lane + 32 * i] = acc[hh][i] * inv;
    if (a.num_splits > 1 && lane == 0)
      a.part_lse[(int64_t(split) * a.R + r) * a.G + g] = l[hh] > 0.f ? m[hh] + logf(l[hh]) : -INFINITY;
  }
}

// out[r, g, :] = Σ_s w_s·O_s / Σ_s w_s with w_s = exp(LSE_s − max LSE); all splits empty → 0.
__global__ void merge_splits_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int splits,
                                    int64_t RG, int D, float* __restrict__ out) {
  const int64_t idx = blockIdx.x;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[s * RG + idx]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    if (mx != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float w = expf(part_lse[s * RG + idx] - mx);
        num += w * part_o[(s * RG + idx) * D + d];
        den += w;
      }
    }
    out[idx * D + d] = den > 0.f ? num / den : 0.f;
  }
}

// Dense page lists: request r = t·Hkv + h reads logical blocks 0..pos[t]/B of its sequence, KV head h.
__global__ void build_dense_pages_kernel(DevStepRows rows, int Hkv, int B, int64_t ppu,
                                         const int32_t* __restrict__ indptr, int32_t* __restrict__ indices) {
  const int r = blockIdx.x, t = r / Hkv, h = r % Hkv;
  const int32_t* pt = rows.pt_pages + rows.pt_indptr[rows.row_seq[t]];
  const int n = rows.pos[t] / B + 1;
  for (int b = threadIdx.x; b < n; b += blockDim.x) indices[indptr[r] + b] = int32_t(pt[b] * ppu + h);
}

// The dense plan from the device rows (a CUDA graph replays it): one CTA, rows cut into per-thread segments.
// indptr[t·Hkv + h] = Hkv·N(t) + h·n(t) with n(t) = pos[t]/B + 1 and N the exclusive prefix of n; last = pos % B + 1.
constexpr int kPlanThreads = 1024;
__global__ void __launch_bounds__(kPlanThreads) dense_plan_kernel(DevStepRows rows, int Hkv, int B,
                                                                  int32_t* __restrict__ indptr,
                                                                  int32_t* __restrict__ last) {
  __shared__ int wsum[kPlanThreads / 32];
  const int T = rows.T, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int seg = (T + kPlanThreads - 1) / kPlanThreads, t0 = min(T, tid * seg), t1 = min(T, t0 + seg);
  int sn = 0;
  for (int t = t0; t < t1; ++t) sn += rows.pos[t] / B + 1;
  int in = sn;  // inclusive warp scan
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, in, o);
    if (lane >= o) in += a;
  }
  if (lane == 31) wsum[warp] = in;
  __syncthreads();
  if (warp == 0) {
    int v = wsum[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += a;
    }
    wsum[lane] = v;
  }
  __syncthreads();
  int en = in - sn + (warp ? wsum[warp - 1] : 0);
  for (int t = t0; t < t1; ++t) {
    const int n = rows.pos[t] / B + 1;
    for (int h = 0; h < Hkv; ++h) indptr[t * Hkv + h] = Hkv * en + h * n, last[t * Hkv + h] = rows.pos[t] % B + 1;
    en += n;
  }
  if (tid == kPlanThreads - 1) indptr[T * Hkv] = Hkv * en;
}

template <int DPL, int HPW, typename CT>
void launch_t(const PagedGqaArgs& a, cudaStream_t s) {
  constexpr int D = 32 * DPL;
  const size_t smem = (size_t(a.G) * D + kTile * (D + 4) + kTile * D) * sizeof(float);
  // Raise the dynamic shared-memory limit once per instantiation, to its largest use (G = 4·HPW), so run() makes no
  // attribute calls and stays capture-safe.
  static const cudaError_t attr = cudaFuncSetAttribute(
      paged_gqa_kernel<DPL, HPW, CT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      int((size_t(kWarps * HPW) * D + kTile * (D + 4) + kTile * D) * sizeof(float)));
  M3_CUDA_CHECK(attr);
  paged_gqa_kernel<DPL, HPW, CT><<<dim3(unsigned(a.R), unsigned(a.num_splits)), kThreads, smem, s>>>(a);
  M3_CUDA_LAUNCH_CHECK();
}

template <int DPL, int HPW>
void launch(const PagedGqaArgs& a, cudaStream_t s) {
  if (a.kv_type == KvType::BF16)
    launch_t<DPL, HPW, __nv_bfloat16>(a, s);
  else
    launch_t<DPL, HPW, float>(a, s);
}

template <int DPL>
void launch_d(const PagedGqaArgs& a, cudaStream_t s) {
  const int hpw = (a.G + kWarps - 1) / kWarps;
  if (hpw <= 1) return launch<DPL, 1>(a, s);
  if (hpw <= 2) return launch<DPL, 2>(a, s);
  if (hpw <= 4) return launch<DPL, 4>(a, s);
  return launch<DPL, 8>(a, s);
}

}  // namespace

void paged_gqa_decode(const PagedGqaArgs& a, cudaStream_t s) {
  if (a.R <= 0) return;
  M3_CUDA_REQUIRE(a.D % 32 == 0 && a.D >= 32 && a.D <= 256, "paged attention: head dim %d must be a multiple of 32 in [32, 256]", a.D);
  M3_CUDA_REQUIRE(a.G >= 1 && a.G <= 32, "paged attention: %d query heads per KV head (supported: 1..32)", a.G);
  M3_CUDA_REQUIRE(a.num_splits >= 1 && a.num_splits <= 65535, "paged attention: bad split count %d", a.num_splits);
  M3_CUDA_REQUIRE(a.num_splits == 1 || (a.part_o && a.part_lse), "paged attention: split-K needs partial buffers");
  // 16-byte loads of q, 4-element loads of K/V rows (16 bytes fp32, 8 bytes bf16).
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && a.stride_page % 4 == 0 && a.stride_tok % 4 == 0,
                  "paged attention: q/K/V must be 16-byte aligned with strides that are multiples of 4 elements");
  switch (a.D / 32) {
    case 1: launch_d<1>(a, s); break;
    case 2: launch_d<2>(a, s); break;
    case 4: launch_d<4>(a, s); break;
    case 8: launch_d<8>(a, s); break;
    default: failf("paged attention: head dim %d not supported (32, 64, 128, 256)", a.D);
  }
  if (a.num_splits > 1) {
    const int64_t RG = int64_t(a.R) * a.G;
    merge_splits_kernel<<<unsigned(RG), std::min(a.D, 256), 0, s>>>(a.part_o, a.part_lse, a.num_splits, RG, a.D,
                                                                    a.out);
    M3_CUDA_LAUNCH_CHECK();
  }
}

int choose_splits(int64_t R, int64_t max_pages) {
  const int64_t target = 2 * int64_t(sm_count());
  if (R <= 0 || R >= target || max_pages < 4) return 1;
  const int64_t want = (target + R - 1) / R;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, max_pages / 2, 64})));
}

void DenseAttention::plan(const std::vector<int32_t>& pos, const DevStepRows& rows, int num_kv_heads, int group,
                          int head_dim, int block_size, int64_t pages_per_unit, bool allow_split, cudaStream_t s) {
  const int64_t T = int64_t(pos.size());
  R_ = int(T * num_kv_heads), G_ = group, D_ = head_dim, B_ = block_size;
  h_indptr_.assign(size_t(R_) + 1, 0);
  h_last_.assign(size_t(R_), 0);
  int64_t total = 0, max_pages = 0;
  for (int64_t t = 0; t < T; ++t) {
    M3_CUDA_REQUIRE(pos[t] >= 0, "dense attention: negative position %d", pos[t]);
    const int64_t n = pos[t] / block_size + 1;
    max_pages = std::max(max_pages, n);
    for (int h = 0; h < num_kv_heads; ++h) {
      const int64_t r = t * num_kv_heads + h;
      h_last_[r] = pos[t] % block_size + 1;
      total += n;
      M3_CUDA_REQUIRE(total < (int64_t(1) << 31), "dense attention: page lists exceed 2^31 entries");
      h_indptr_[r + 1] = int32_t(total);
    }
  }
  max_pages_ = int(max_pages);
  if (R_ == 0) return;
  upload(indptr_, h_indptr_.data(), h_indptr_.size(), s);
  upload(last_, h_last_.data(), h_last_.size(), s);
  indices_.grow(size_t(total));
  build_dense_pages_kernel<<<unsigned(R_), 128, 0, s>>>(rows, num_kv_heads, block_size, pages_per_unit, indptr_.get(),
                                                        indices_.get());
  M3_CUDA_LAUNCH_CHECK();
  splits_ = allow_split ? choose_splits(R_, max_pages) : 1;
  if (splits_ > 1) {
    part_o_.grow(size_t(splits_) * R_ * G_ * D_);
    part_lse_.grow(size_t(splits_) * R_ * G_);
  }
}

void DenseAttention::plan_device(const DevStepRows& rows, int num_kv_heads, int group, int head_dim, int block_size,
                                 int64_t pages_per_unit, int max_pages, cudaStream_t s) {
  M3_CUDA_REQUIRE(rows.T >= 0 && num_kv_heads >= 1 && max_pages >= 1 &&
                      int64_t(rows.T) * num_kv_heads * max_pages < (int64_t(1) << 31),
                  "dense attention: bad device plan (%d rows, %d KV heads, %d pages)", rows.T, num_kv_heads, max_pages);
  R_ = rows.T * num_kv_heads, G_ = group, D_ = head_dim, B_ = block_size, max_pages_ = max_pages, splits_ = 1;
  if (R_ == 0) return;
  indptr_.grow(size_t(R_) + 1);
  last_.grow(size_t(R_));
  indices_.grow(size_t(R_) * size_t(max_pages));
  dense_plan_kernel<<<1, kPlanThreads, 0, s>>>(rows, num_kv_heads, block_size, indptr_.get(), last_.get());
  M3_CUDA_LAUNCH_CHECK();
  build_dense_pages_kernel<<<unsigned(R_), 128, 0, s>>>(rows, num_kv_heads, block_size, pages_per_unit, indptr_.get(),
                                                        indices_.get());
  M3_CUDA_LAUNCH_CHECK();
}

void DenseAttention::run(const float* q, const DevPagedKV& kv, float scale, float* out, cudaStream_t s) {
  if (R_ == 0) return;
  M3_CUDA_REQUIRE(kv.block_size == B_ && kv.head_dim == D_, "dense attention: cache view does not match the plan");
  M3_CUDA_REQUIRE(kv.page_stride % (int64_t(kv.block_size) * kv.head_dim) == 0,
                  "dense attention: page of %lld elements is not a multiple of block·head_dim",
                  (long long)kv.page_stride);
  PagedGqaArgs a;
  a.q = q, a.out = out, a.k = kv.k, a.v = kv.v, a.kv_type = kv.type;
  a.stride_page = int64_t(kv.block_size) * kv.head_dim, a.stride_tok = kv.head_dim;
  a.indptr = indptr_.get(), a.indices = indices_.get(), a.last_len = last_.get();
  a.R = R_, a.G = G_, a.D = D_, a.page_size = B_, a.scale = scale;
  a.num_splits = splits_, a.part_o = part_o_.get(), a.part_lse = part_lse_.get();
  paged_gqa_decode(a, s);
}

}  // namespace m3::cuda
