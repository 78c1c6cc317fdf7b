#include "backend/cuda/mlp_moe.cuh"

#include "backend/cuda/gemv.cuh"

#include <algorithm>
#include <type_traits>

namespace m3::cuda {

namespace {

// SwiGLU-OAI (cpu::swiglu_oai) of gu [T, 2I] → out [T, I]; OutT = float, or __nv_bfloat16 (rounded to nearest
// even: the bf16 input of the down GEMM, bit-identical to the fp32 result rounded by f32_to_bf16).
template <typename OutT>
__global__ void swiglu_kernel(const float* __restrict__ gu, int64_t T, int64_t I, float alpha, float limit,
                              OutT* __restrict__ out) {
  const int64_t n = T * I;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = k / I, i = k % I;
    const float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
    const float gc = fminf(g, limit);
    const float uc = fminf(fmaxf(u, -limit), limit);
    const float sig = 1.0f / (1.0f + expf(-alpha * gc));
    const float v = gc * sig * (uc + 1.0f);
    if constexpr (std::is_same_v<OutT, float>)
      out[k] = v;
    else
      out[k] = __float2bfloat16_rn(v);
  }
}

// SwiGLU-OAI rounded to bf16 and quantised per 1×128 for the down GEMM in one pass (act_q [T_pad, I], act_s
// [I/128][T_pad]): one warp per (row, 128-block), lane i on act columns 4i..4i+3 of the block; the values are those
// swiglu_kernel<bf16> writes, so the codes equal fp8_quantize_act_1x128 on its output. Rows ≥ T: padding.
__global__ void swiglu_e4m3_kernel(const float* __restrict__ gu, int64_t T, int64_t T_pad, int64_t I, float alpha,
                                   float limit, uint8_t* __restrict__ q, float* __restrict__ sc_out) {
  const int64_t L = I / 128;
  const int64_t wid = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (wid >= T_pad * L) return;
  const int64_t t = wid / L, kb = wid % L, i0 = kb * 128 + lane * 4;
  uint32_t* qo = reinterpret_cast<uint32_t*>(q + t * I + i0);
  if (t >= T) {
    *qo = 0;
    if (lane == 0) sc_out[kb * T_pad + t] = 1.0f;
    return;
  }
  const float4 g4 = *reinterpret_cast<const float4*>(gu + t * 2 * I + i0);
  const float4 u4 = *reinterpret_cast<const float4*>(gu + t * 2 * I + I + i0);
  const float g[4] = {g4.x, g4.y, g4.z, g4.w}, u[4] = {u4.x, u4.y, u4.z, u4.w};
  float v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // the arithmetic of swiglu_kernel, term for term
    const float gc = fminf(g[k], limit);
    const float uc = fminf(fmaxf(u[k], -limit), limit);
    const float sig = 1.0f / (1.0f + expf(-alpha * gc));
    v[k] = bf16_round(gc * sig * (uc + 1.0f));
  }
  float sc;
  *qo = quant_block128_warp(v, sc);
  if (lane == 0) sc_out[kb * T_pad + t] = sc;
}

// True when (ka, a) ranks strictly before (kb, b): higher key, then lower id.
__device__ __forceinline__ bool ranks_before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

__global__ void moe_route_kernel(const float* __restrict__ logits, int64_t T, int E, const float* __restrict__ bias,
                                 int top_k, float scale, int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  auto choice = [&](int e) {
    const float s = 1.0f / (1.0f + expf(-l[e]));
    const float c = s + (bias ? bias[e] : 0.0f);
    return isnan(c) ? -INFINITY : c;
  };
  // Round k picks the best expert ranking strictly after the previous pick in the total order (choice desc,
  // id asc) — the same order as the CPU's partial_sort, with no "already taken" set.
  float prev_c = 0.f;
  int prev_e = -1;
  float sum = 0.f;
  for (int k = 0; k < top_k; ++k) {
    int best = -1;
    float best_c = 0.f;
    for (int e = 0; e < E; ++e) {
      const float c = choice(e);
      if (prev_e >= 0 && !ranks_before(prev_c, prev_e, c, e)) continue;
      if (best < 0 || ranks_before(c, e, best_c, best)) best = e, best_c = c;
    }
    ids[t * top_k + k] = best;
    prev_c = best_c, prev_e = best;
    sum += 1.0f / (1.0f + expf(-l[best]));
  }
  for (int k = 0; k < top_k; ++k) {
    const float s = 1.0f / (1.0f + expf(-l[ids[t * top_k + k]]));
    weights[t * top_k + k] = s / sum * scale;
  }
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// x[t, h] += Σ_k w[t,k]·ye[slot_pos[t·K + k], h] (+ shared[t, h]), summed in slot order like the CPU.
__global__ void moe_combine_kernel(float* __restrict__ x, int64_t H, int K, const float* __restrict__ w,
                                   const float* __restrict__ ye, const int32_t* __restrict__ slot_pos,
                                   const float* __restrict__ shared) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += w[t * K + k] * ye[int64_t(slot_pos[t * K + k]) * H + h];
    if (shared) acc += shared[t * H + h];
    x[t * H + h] += acc;
  }
}

// For the grouped path: xe[i] = x[src[i]].
__global__ void gather_kernel(const float* __restrict__ x, int64_t H, const int32_t* __restrict__ src,
                              float* __restrict__ xe) {
  const float* r = x + int64_t(src[blockIdx.x]) * H;
  float* d = xe + int64_t(blockIdx.x) * H;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) d[h] = r[h];
}

unsigned grid_for(int64_t n, int threads) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 8192))); }

}  // namespace

void swiglu_oai(const float* gate_up, int64_t T, int64_t I, float alpha, float limit, float* out, cudaStream_t s) {
  if (T * I <= 0) return;
  swiglu_kernel<float><<<grid_for(T * I, 256), 256, 0, s>>>(gate_up, T, I, alpha, limit, out);
  M3_CUDA_LAUNCH_CHECK();
}

void swiglu_oai_e4m3(const float* gate_up, int64_t T, int64_t I, float alpha, float limit, const Fp8ActOut& q,
                     cudaStream_t s) {
  M3_CUDA_REQUIRE(I % 128 == 0 && q.q && q.s && q.T_pad >= T && q.ld_s == q.T_pad,
                  "swiglu_oai_e4m3: I %lld must be a multiple of 128 and ld_s = T_pad ≥ T", (long long)I);
  if (q.T_pad <= 0) return;
  swiglu_e4m3_kernel<<<unsigned((q.T_pad * (I / 128) + 7) / 8), 256, 0, s>>>(gate_up, T, q.T_pad, I, alpha, limit,
                                                                                q.q, q.s);
  M3_CUDA_LAUNCH_CHECK();
}

void moe_route(const float* logits, int64_t T, int64_t E, const float* bias, int top_k, float scale, int32_t* ids,
               float* weights, cudaStream_t s) {
  if (T <= 0) return;
  M3_CUDA_REQUIRE(top_k >= 1 && top_k <= E, "moe_route: top_k %d must be in [1, %lld]", top_k, (long long)E);
  moe_route_kernel<<<unsigned((T + 127) / 128), 128, 0, s>>>(logits, T, int(E), bias, top_k, scale, ids, weights);
  M3_CUDA_LAUNCH_CHECK();
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
  M3_CUDA_LAUNCH_CHECK();
}

void run_mlp(Gemm& g, const MlpDev& m, const float* x, int64_t T, int64_t H, float alpha, float limit, float* y,
             bool accumulate, FfnScratch& scr, cudaStream_t s, const uint16_t* xb, Fp8Gemm* f8,
             int64_t lt_min_rows, int64_t gemv_rows, const Fp8ActOut* xq) {
  if (T <= 0) return;
  scr.gu.grow(size_t(T * 2 * m.I));
  if (m.fp8()) {  // either matrix may be FP8, the other bf16 (a K that no FP8 kernel takes stays bf16)
    M3_CUDA_REQUIRE(xb && f8 && m.wt == WType::BF16, "run_mlp: FP8 weights need bf16 activations and an Fp8Gemm");
    // Decode rows (T ≤ gemv_rows: the executor's e4m3 policy) take the weight-streaming GEMV where it fits.
    const bool gemv = T <= gemv_rows;
    if (m.gate_up8.q && gemv && gemv_supported(T, H, true))
      gemv_e4m3(xb, T, m.gate_up8, scr.gu.get(), GemmOut::F32, false, s);
    else if (m.gate_up8.q)
      f8->proj(xb, T, m.gate_up8, scr.gu.get(), GemmOut::F32, false, lt_min_rows, s, xq);
    else
      g.nt_bf16(xb, T, H, m.gate_up, 2 * m.I, scr.gu.get(), false, s);
    if (m.down8.q && !(gemv && gemv_supported(T, m.I, true)) && m.I % 128 == 0 && fp8_fused_quant() &&
        Fp8Gemm::proj_quantises(T, m.down8, lt_min_rows)) {  // SwiGLU writes the down GEMM's e4m3 input directly
      const int64_t Tp = (T + 3) / 4 * 4;  // cuBLASLt's row padding (Fp8Gemm::proj)
      scr.act_q8.grow(size_t(Tp * m.I));
      scr.act_s8.grow(size_t(Tp * (m.I / 128)));
      const Fp8ActOut aq{scr.act_q8.get(), scr.act_s8.get(), Tp, Tp};
      swiglu_oai_e4m3(scr.gu.get(), T, m.I, alpha, limit, aq, s);
      f8->proj(nullptr, T, m.down8, y, GemmOut::F32, accumulate, lt_min_rows, s, &aq);
      return;
    }
    scr.act_b.grow(size_t(T * m.I));
    swiglu_kernel<__nv_bfloat16><<<grid_for(T * m.I, 256), 256, 0, s>>>(scr.gu.get(), T, m.I, alpha, limit,
                                                              reinterpret_cast<__nv_bfloat16*>(scr.act_b.get()));
    M3_CUDA_LAUNCH_CHECK();
    if (m.down8.q && gemv && gemv_supported(T, m.I, true))
      gemv_e4m3(scr.act_b.get(), T, m.down8, y, GemmOut::F32, accumulate, s);
    else if (m.down8.q)
      f8->proj(scr.act_b.get(), T, m.down8, y, GemmOut::F32, accumulate, lt_min_rows, s);
    else
      g.nt_bf16(scr.act_b.get(), T, m.I, m.down, H, y, accumulate, s);
    return;
  }
  if (m.wt == WType::BF16) {  // bf16 activations: x given as bf16 (or rounded by the GEMM), act written as bf16
    const bool gemv = xb && T <= gemv_rows && gemv_supported(T, H, false) && gemv_supported(T, m.I, false);
    if (gemv)
      gemv_bf16(xb, T, H, static_cast<const uint16_t*>(m.gate_up), 2 * m.I, scr.gu.get(), GemmOut::F32, false, s);
    else if (xb)
      g.nt_bf16(xb, T, H, m.gate_up, 2 * m.I, scr.gu.get(), false, s);
    else
      g.nt(x, T, H, m.gate_up, m.wt, 2 * m.I, scr.gu.get(), false, s);
    scr.act_b.grow(size_t(T * m.I));
    if (T * m.I > 0) {
      swiglu_kernel<__nv_bfloat16><<<grid_for(T * m.I, 256), 256, 0, s>>>(scr.gu.get(), T, m.I, alpha, limit,
                                                                reinterpret_cast<__nv_bfloat16*>(scr.act_b.get()));
      M3_CUDA_LAUNCH_CHECK();
    }
    if (gemv)
      gemv_bf16(scr.act_b.get(), T, m.I, static_cast<const uint16_t*>(m.down), H, y, GemmOut::F32, accumulate, s);
    else
      g.nt_bf16(scr.act_b.get(), T, m.I, m.down, H, y, accumulate, s);
    return;
  }
  scr.act.grow(size_t(T * m.I));
  g.nt(x, T, H, m.gate_up, m.wt, 2 * m.I, scr.gu.get(), false, s);
  swiglu_oai(scr.gu.get(), T, m.I, alpha, limit, scr.act.get(), s);
  g.nt(scr.act.get(), T, m.I, m.down, m.wt, H, y, accumulate, s);
}

namespace {
bool fp8_blk128(const Fp8Weight& w) { return w.q != nullptr && w.fmt == Fp8Scale::Blk128; }
}  // namespace

bool moe_uses_grouped(const MoeArgs& a, int64_t H) {
  const bool shared = a.shared.I > 0;
  const int64_t Is = shared ? a.shared.I : 0;
  if (a.stacked_gate_up8)  // FP8 experts: only the grouped path reads them, with an FP8 (Blk128) shared expert
    return a.stacked_down8 && a.stacked_gate_up8_scales && a.stacked_down8_scales &&
           (!shared || (fp8_blk128(a.shared.gate_up8) && fp8_blk128(a.shared.down8))) &&
           moe_grouped_supported(H, a.E, a.top_k, a.expert_I, Is);
  return a.stacked_gate_up && a.stacked_down && (a.experts.empty() || a.experts[0].wt == WType::BF16) &&
         (!shared || (a.shared.wt == WType::BF16 && !a.shared.fp8())) &&
         moe_grouped_supported(H, a.E, a.top_k, a.expert_I, Is);
}

void moe_forward(Gemm& g, const MoeArgs& a, const float* xn, int64_t T, int64_t H, float* x, FfnScratch& scr,
                 cudaStream_t s) {
  const bool grouped = moe_uses_grouped(a, H);
  M3_CUDA_REQUIRE(grouped || !a.stacked_gate_up8,
                  "moe_forward: FP8 routed experts need the grouped path (H %lld, E %lld, top_k %lld, I %lld, its "
                  "scales, and a shared expert that is absent or FP8 in both matrices)",
                  (long long)H, (long long)a.E, (long long)a.top_k, (long long)a.expert_I);
  if (!grouped) return moe_forward_sync(g, a, xn, T, H, x, scr, s);
  MoeGroupedWeights w;
  w.router = a.router, w.router_bias = a.router_bias;
  if (a.stacked_gate_up8) {
    w.gate_up8 = a.stacked_gate_up8, w.gate_up8_scales = a.stacked_gate_up8_scales;
    w.down8 = a.stacked_down8, w.down8_scales = a.stacked_down8_scales;
    if (a.shared.I > 0) {
      w.shared_gate_up8 = a.shared.gate_up8.q, w.shared_gate_up8_scales = static_cast<const float*>(a.shared.gate_up8.scales);
      w.shared_down8 = a.shared.down8.q, w.shared_down8_scales = static_cast<const float*>(a.shared.down8.scales);
      w.Is = a.shared.I;
    }
  } else {
    w.gate_up = static_cast<const __nv_bfloat16*>(a.stacked_gate_up);
    w.down = static_cast<const __nv_bfloat16*>(a.stacked_down);
    if (a.shared.I > 0) {
      w.shared_gate_up = static_cast<const __nv_bfloat16*>(a.shared.gate_up);
      w.shared_down = static_cast<const __nv_bfloat16*>(a.shared.down);
      w.Is = a.shared.I;
    }
  }
  w.E = a.E, w.top_k = a.top_k, w.I = a.expert_I;
  w.routed_scale = a.routed_scale, w.alpha = a.alpha, w.limit = a.limit;
  moe_grouped_forward(w, xn, T, H, x, scr.moe, s, nullptr,
                      w.fp8() && !a.fp8_e4m3_prefill ? MoeGemmPath::MmaSync : MoeGemmPath::Auto);
}

void moe_forward_sync(Gemm& g, const MoeArgs& a, const float* xn, int64_t T, int64_t H, float* x, FfnScratch& scr,
                      cudaStream_t s) {
  if (T <= 0) return;
  const int64_t E = a.E, K = a.top_k, TK = T * K;
  M3_CUDA_REQUIRE(int64_t(a.experts.size()) == E, "moe_forward: %zu expert weight sets for %lld experts",
                  a.experts.size(), (long long)E);
  scr.logits.grow(size_t(T * E));
  scr.weights.grow(size_t(TK));
  scr.ids.grow(size_t(TK));
  g.nt(xn, T, H, a.router, WType::F32, E, scr.logits.get(), false, s);
  moe_route(scr.logits.get(), T, E, a.router_bias, int(K), a.routed_scale, scr.ids.get(), scr.weights.get(), s);

  // Group the (token, slot) pairs by expert on the host: counts need to be known to size each expert's GEMM.
  std::vector<int32_t> ids(static_cast<size_t>(TK));
  M3_CUDA_CHECK(cudaMemcpyAsync(ids.data(), scr.ids.get(), size_t(TK) * 4, cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<int64_t> count(size_t(E) + 1, 0);
  for (int32_t e : ids) {
    M3_CUDA_REQUIRE(e >= 0 && e < E, "moe_forward: router chose expert %d of %lld", e, (long long)E);
    ++count[size_t(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];  // now offsets
  std::vector<int32_t> src(static_cast<size_t>(TK)), slot_pos(static_cast<size_t>(TK));
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t r = 0; r < TK; ++r) {  // ascending slot order inside each expert
      const int64_t at = fill[size_t(ids[r])]++;
      src[size_t(at)] = int32_t(r / K);
      slot_pos[size_t(r)] = int32_t(at);
    }
  }
  upload(scr.gather_src, src.data(), src.size(), s);
  upload(scr.slot_pos, slot_pos.data(), slot_pos.size(), s);
  scr.xe.grow(size_t(TK * H));
  scr.y.grow(size_t(TK * H));
  gather_kernel<<<unsigned(TK), 256, 0, s>>>(xn, H, scr.gather_src.get(), scr.xe.get());
  M3_CUDA_LAUNCH_CHECK();
  // Expert MLPs over their contiguous row ranges (gate_up for all, one SwiGLU pass, down for all).
  const int64_t I = a.experts.empty() ? 0 : a.experts[0].I;
  scr.gu.grow(size_t(TK * 2 * I));
  scr.act.grow(size_t(TK * I));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = count[e + 1] - count[e];
    if (n == 0) continue;
    M3_CUDA_REQUIRE(a.experts[e].I == I, "moe_forward: experts differ in intermediate size");
    g.nt(scr.xe.get() + count[e] * H, n, H, a.experts[e].gate_up, a.experts[e].wt, 2 * I, scr.gu.get() + count[e] * 2 * I,
         false, s);
  }
  swiglu_oai(scr.gu.get(), TK, I, a.alpha, a.limit, scr.act.get(), s);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = count[e + 1] - count[e];
    if (n == 0) continue;
    g.nt(scr.act.get() + count[e] * I, n, I, a.experts[e].down, a.experts[e].wt, H, scr.y.get() + count[e] * H, false,
         s);
  }
  const float* shared = nullptr;
  if (a.shared.I > 0) {
    scr.shared_y.grow(size_t(T * H));
    // run_mlp reuses gu/act: the routed experts' SwiGLU inputs are consumed already (stream order).
    run_mlp(g, a.shared, xn, T, H, a.alpha, a.limit, scr.shared_y.get(), false, scr, s);
    shared = scr.shared_y.get();
  }
  moe_combine_kernel<<<unsigned(T), 256, 0, s>>>(x, H, int(K), scr.weights.get(), scr.y.get(), scr.slot_pos.get(),
                                                 shared);
  M3_CUDA_LAUNCH_CHECK();
}

}  // namespace m3::cuda
