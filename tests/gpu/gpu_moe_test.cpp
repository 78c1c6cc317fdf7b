// The grouped MoE (backend/cuda/moe_grouped.cuh, docs/KERNELS.md §10) against a CPU reference, its CUDA-graph
// replay against eager, and its independence from the other rows of the batch.
//
// Reference: the GPU's router logits are checked against an fp64 CPU product (fp32 accumulation order only), then
// routed on the CPU by cpu::moe_route (ids must be equal, weights within expf-vs-std::exp ulps), and every
// (token, slot) runs the expert MLP on the CPU in fp64 from the same bf16 weights, with x and the SwiGLU output
// rounded where the GPU rounds them (bf16; f16 for FP8 experts). What remains is fp32 accumulation order in the tensor-core GEMMs and
// the odd act element that lands on the other side of a bf16 rounding boundary (one bf16 ulp, 2^-8 relative, of one
// of I terms): tolerance 1e-3 of max |ref|. The error against an unrounded fp32 reference (the cost of bf16
// activations) is printed, not asserted.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/moe_grouped.cuh"
#include "backend/cuda/moe_grouped_wgmma.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using gpu_test::Dev;
using gpu_test::rng;

struct Shape {
  int64_t H, E, K, I, Is;
};

std::vector<float> download_bf16(const __nv_bfloat16* p, int64_t n);

// FP8 expert weights (docs/FP8.md §9): MXFP8-like values with scales varying per 32-group (fill_hash_mxfp8),
// requantised on the device to e4m3 + 128×128 block scales exactly as the loader does (fp8_requant_from_mx).
struct Fp8Mat {
  cuda::DeviceBuffer<uint8_t> q;
  cuda::DeviceBuffer<float> s;
  int64_t N = 0, K = 0, count = 0, per = 0;  // `count` matrices [N, K], `per` scales each
  void make(int64_t n_mats, int64_t N_, int64_t K_, uint64_t seed, float amp) {
    N = N_, K = K_, count = n_mats, per = fp8_scale_count(Fp8Scale::Blk128, N, K);
    q.grow(size_t(count * N * K)), s.grow(size_t(count * per));
    cuda::DeviceBuffer<uint8_t> g32(size_t(N * K / 32));
    // |w| ≈ 448·|u|·2^(e0 + {0, 1, 2}): e0 puts the typical |w| near amp/2.
    const int e0 = int(std::floor(std::log2(amp / 448.f))) - 1;
    for (int64_t m = 0; m < count; ++m) {
      uint8_t* qm = q.get() + m * N * K;
      cuda::fill_hash_mxfp8(qm, g32.get(), N, K, seed * 1000003ull + uint64_t(m), e0, nullptr);
      cuda::fp8_requant_from_mx(qm, g32.get(), N, K, Fp8Scale::Blk128, qm, s.get() + m * per, nullptr);
    }
    M3_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Matrix m dequantised exactly (cpu::fp8_dequant, the CPU twin of the kernels' e4m3 · scale).
  std::vector<float> host(int64_t m) const {
    std::vector<uint8_t> hq(size_t(N * K));
    std::vector<float> hs(static_cast<size_t>(per)), out(static_cast<size_t>(N * K));
    M3_CUDA_CHECK(cudaMemcpy(hq.data(), q.get() + m * N * K, hq.size(), cudaMemcpyDeviceToHost));
    M3_CUDA_CHECK(cudaMemcpy(hs.data(), s.get() + m * per, hs.size() * 4, cudaMemcpyDeviceToHost));
    cpu::fp8_dequant(hq.data(), hs.data(), Fp8Scale::Blk128, N, K, out.data());
    return out;
  }
  // The same values as bf16 (exact), stacked like q.
  void to_bf16(cuda::DeviceBuffer<__nv_bfloat16>& out) const {
    out.grow(size_t(count * N * K));
    for (int64_t m = 0; m < count; ++m)
      cuda::fp8_blk128_to_bf16(q.get() + m * N * K, s.get() + m * per, N, K, out.get() + m * N * K, nullptr);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// One MoE layer's weights on the device (hash-filled there: M3 widths are 14 GB of experts). fp8: the experts (and
// the shared expert) are FP8 instead of bf16.
struct Layer {
  Shape sh;
  bool fp8 = false;
  cuda::DeviceBuffer<float> router, bias;
  cuda::DeviceBuffer<__nv_bfloat16> gu, dn, sgu, sdn;
  Fp8Mat gu8, dn8, sgu8, sdn8;
  std::vector<float> h_router, h_bias;
  cuda::MoeGroupedWeights w;

  Layer(Shape s, uint64_t seed, float bias0 = 0.f, float bias1 = 0.f, bool fp8_experts = false)
      : sh(s), fp8(fp8_experts) {
    const int64_t H = s.H, E = s.E, I = s.I, Is = s.Is;
    router.grow(size_t(E * H)), bias.grow(size_t(E));
    // Logit std ≈ 1 for x uniform in ±1; gate/up std ≈ 1.3 (some values reach the SwiGLU limit of 7).
    cuda::fill_hash_f32(router.get(), E * H, seed + 1, 3.f / std::sqrt(float(H)), nullptr);
    if (fp8) {
      gu8.make(E, 2 * I, H, seed + 2, 4.f / std::sqrt(float(H)));
      dn8.make(E, H, I, seed + 3, 2.f / std::sqrt(float(I)));
      if (Is > 0) {
        sgu8.make(1, 2 * Is, H, seed + 4, 4.f / std::sqrt(float(H)));
        sdn8.make(1, H, Is, seed + 5, 2.f / std::sqrt(float(Is)));
      }
    } else {
      gu.grow(size_t(E * 2 * I * H)), dn.grow(size_t(E * H * I));
      cuda::fill_hash_bf16(gu.get(), E * 2 * I * H, seed + 2, 4.f / std::sqrt(float(H)), nullptr);
      cuda::fill_hash_bf16(dn.get(), E * H * I, seed + 3, 2.f / std::sqrt(float(I)), nullptr);
      if (Is > 0) {
        sgu.grow(size_t(2 * Is * H)), sdn.grow(size_t(H * Is));
        cuda::fill_hash_bf16(sgu.get(), 2 * Is * H, seed + 4, 4.f / std::sqrt(float(H)), nullptr);
        cuda::fill_hash_bf16(sdn.get(), H * Is, seed + 5, 2.f / std::sqrt(float(Is)), nullptr);
      }
    }
    h_bias = gpu_test::rand_vec(size_t(E), 0.001f, 0.1f);
    h_bias[0] += bias0;
    if (E > 1) h_bias[1] += bias1;
    M3_CUDA_CHECK(cudaMemcpy(bias.get(), h_bias.data(), size_t(E) * 4, cudaMemcpyHostToDevice));
    h_router.resize(size_t(E * H));
    M3_CUDA_CHECK(cudaMemcpy(h_router.data(), router.get(), h_router.size() * 4, cudaMemcpyDeviceToHost));
    w.router = router.get(), w.router_bias = bias.get();
    if (fp8) {
      w.gate_up8 = gu8.q.get(), w.gate_up8_scales = gu8.s.get(), w.down8 = dn8.q.get(), w.down8_scales = dn8.s.get();
      if (Is > 0) {
        w.shared_gate_up8 = sgu8.q.get(), w.shared_gate_up8_scales = sgu8.s.get();
        w.shared_down8 = sdn8.q.get(), w.shared_down8_scales = sdn8.s.get();
      }
    } else {
      w.gate_up = gu.get(), w.down = dn.get();
      if (Is > 0) w.shared_gate_up = sgu.get(), w.shared_down = sdn.get();
    }
    w.E = E, w.top_k = s.K, w.I = I, w.Is = Is, w.routed_scale = 2.f, w.alpha = 1.702f, w.limit = 7.f;
  }

  // Expert e's gate_up [2I, H] and down [H, I] as the kernels' exact values (e = E: the shared expert).
  void host_expert(int64_t e, std::vector<float>& hgu, std::vector<float>& hdn) const;

  // FP8 layer → the bf16 weights of the same values (the bf16 kernels on them are the FP8 kernels' reference up to
  // fp32 summation order).
  void make_bf16_twin() {
    gu8.to_bf16(gu), dn8.to_bf16(dn);
    cuda::MoeGroupedWeights b = w;
    b.gate_up8 = nullptr, b.gate_up8_scales = nullptr, b.down8 = nullptr, b.down8_scales = nullptr;
    b.shared_gate_up8 = nullptr, b.shared_gate_up8_scales = nullptr, b.shared_down8 = nullptr;
    b.shared_down8_scales = nullptr;
    b.gate_up = gu.get(), b.down = dn.get();
    if (sh.Is > 0) {
      sgu8.to_bf16(sgu), sdn8.to_bf16(sdn);
      b.shared_gate_up = sgu.get(), b.shared_down = sdn.get();
    }
    w_bf16 = b;
  }
  cuda::MoeGroupedWeights w_bf16;
};

std::vector<float> download_bf16(const __nv_bfloat16* p, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  M3_CUDA_CHECK(cudaMemcpy(h.data(), p, size_t(n) * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
  return f;
}

void Layer::host_expert(int64_t e, std::vector<float>& hgu, std::vector<float>& hdn) const {
  const bool sh_e = e == sh.E;
  const int64_t H = sh.H, I = sh_e ? sh.Is : sh.I;
  if (fp8) {
    hgu = sh_e ? sgu8.host(0) : gu8.host(e);
    hdn = sh_e ? sdn8.host(0) : dn8.host(e);
  } else {
    hgu = download_bf16(sh_e ? sgu.get() : gu.get() + e * 2 * I * H, 2 * I * H);
    hdn = download_bf16(sh_e ? sdn.get() : dn.get() + e * H * I, H * I);
  }
}

struct GpuRun {
  std::vector<float> x, logits, weights;
  std::vector<int32_t> ids;
  int32_t tiles = 0, active = 0;
};

// Two GPU runs on the same input x0 + MoE(xn): outputs of b that are not finite, max |a − b|, and max |a − x0| (the
// size of the MoE's contribution, so a difference can be judged relative to it).
struct RunDiff {
  size_t bad = 0;
  double diff = 0, delta = 0;
};
RunDiff diff_runs(const GpuRun& a, const GpuRun& b, const std::vector<float>& x0) {
  RunDiff d;
  for (size_t i = 0; i < a.x.size(); ++i) {
    if (!std::isfinite(b.x[i])) ++d.bad;
    d.diff = std::max(d.diff, double(std::abs(a.x[i] - b.x[i])));
    d.delta = std::max(d.delta, double(std::abs(a.x[i] - x0[i])));
  }
  return d;
}

// x0 + MoE(xn) on the GPU; scratch poisoned first (every used element must be written).
GpuRun run_gpu(const Layer& L, const std::vector<float>& xn, const std::vector<float>& x0, int64_t T,
            cuda::MoeGroupedScratch& scr, cuda::MoeGemmPath path = cuda::MoeGemmPath::Auto,
            const cuda::MoeGroupedWeights* weights = nullptr) {
  Dev<float> dxn(xn), dx(x0);
  cuda::moe_reserve(scr, T, L.sh.H, L.sh.E, L.sh.K, L.sh.I, L.sh.Is);
  M3_CUDA_CHECK(cudaMemset(scr.y.get(), 0xFF, scr.y.size() * 4));
  M3_CUDA_CHECK(cudaMemset(scr.act.get(), 0xFF, scr.act.size() * 2));
  M3_CUDA_CHECK(cudaMemset(scr.logits.get(), 0xFF, scr.logits.size() * 4));
  cuda::moe_grouped_forward(weights ? *weights : L.w, dxn.p(), T, L.sh.H, dx.p(), scr, nullptr, nullptr, path);
  GpuRun r;
  r.x = dx.get();
  r.logits.resize(size_t(T * L.sh.E)), r.ids.resize(size_t(T * L.sh.K)), r.weights.resize(size_t(T * L.sh.K));
  M3_CUDA_CHECK(cudaMemcpy(r.logits.data(), scr.logits.get(), r.logits.size() * 4, cudaMemcpyDeviceToHost));
  M3_CUDA_CHECK(cudaMemcpy(r.ids.data(), scr.ids.get(), r.ids.size() * 4, cudaMemcpyDeviceToHost));
  M3_CUDA_CHECK(cudaMemcpy(r.weights.data(), scr.weights.get(), r.weights.size() * 4, cudaMemcpyDeviceToHost));
  int32_t c[2];
  M3_CUDA_CHECK(cudaMemcpy(c, scr.counters.get(), 8, cudaMemcpyDeviceToHost));
  r.tiles = c[0], r.active = c[1];
  return r;
}

// How the GPU rounds the expert MLP's activations (x and act): bf16 for bf16 experts, f16 for FP8 experts on the
// mma.sync path (the W8A16 GEMMs multiply f16), e4m3 for FP8 experts on the wgmma path (x from its f16 copy in 1×128
// blocks, act in 1×64 — 1×128 on the N = 256 kernels, E4m3Wide; moe_grouped_wgmma.cuh), or not at all (the fp32
// reference whose error is only printed).
enum class ActRound { None, Bf16, F16, E4m3, E4m3Wide };
float round_act(float v, ActRound r) {
  return r == ActRound::Bf16 ? round_to_bf16(v) : r == ActRound::F16 ? f16_to_f32(f32_to_f16(v)) : v;
}
// The wgmma FP8 path's activation quantisation, per `block`-element block: scale = amax / 448 (1 when all zero),
// value = e4m3(rne(v / scale)) · scale.
void quantise_blocks(std::vector<float>& v, size_t block) {
  for (size_t b = 0; b + block <= v.size(); b += block) {
    float amax = 0.f;
    for (size_t i = b; i < b + block; ++i) amax = std::max(amax, std::abs(v[i]));
    const float sc = amax > 0.f ? amax / 448.0f : 1.0f;
    for (size_t i = b; i < b + block; ++i) v[i] = e4m3_to_f32(cpu::e4m3_rne(v[i] / sc)) * sc;
  }
}

// CPU expert MLP in fp64 on bf16 weights: gate_up [2I, H], down [H, I]; x and act rounded as the GPU rounds them.
void cpu_mlp(const float* x, const std::vector<float>& gu, const std::vector<float>& dn, int64_t H, int64_t I,
             ActRound round, std::vector<double>& y) {
  std::vector<float> xr(x, x + H), act(static_cast<size_t>(I));
  const bool e4m3 = round == ActRound::E4m3 || round == ActRound::E4m3Wide;
  for (float& v : xr) v = round_act(v, e4m3 ? ActRound::F16 : round);
  if (e4m3) quantise_blocks(xr, 128);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) g += double(xr[h]) * gu[i * H + h], u += double(xr[h]) * gu[(I + i) * H + h];
    float a;
    cpu::swiglu_oai(std::array<float, 2>{float(g), float(u)}.data(), 1, 1, 1.702f, 7.f, &a);
    act[i] = round_act(a, round);
  }
  if (e4m3) quantise_blocks(act, round == ActRound::E4m3Wide ? 128 : 64);
  y.assign(size_t(H), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += double(act[i]) * dn[h * I + i];
    y[h] = s;
  }
}

struct RefResult {
  double err = 0, err_unrounded = 0, ref_max = 0;
  double rms = 0, rms_unrounded = 0;  // RMS of the errors
};

// Checks logits and routing of `g` and returns the output errors against the reference that rounds as the GPU does.
// e4m3: the GPU ran FP8 experts on the wgmma path (e4m3 activations): the reference quantises x and act the same
// way. An act element whose fp32 sum lands on the other side of an e4m3 rounding boundary (accumulation order; 3
// mantissa bits, so 1/16 of that element), or a block amax that does and so moves the block's scale, moves its row's
// outputs: seeded runs measured max|err| / max|ref| 2.4e-3 … 1.18e-2 at these widths, so the max is held to 2.5e-2
// and the bulk is what proves the mirroring — the RMS error against this reference must stay under 0.5× the RMS
// error against the fp32-activation one (flips are sparse: ≤ 0.25× seen, at one row; a wrong scale, K step or code
// moves every output).
RefResult check_against_cpu(const Layer& L, const std::vector<float>& xn, const std::vector<float>& x0, int64_t T,
                            const GpuRun& g, const std::string& what, bool e4m3 = false, bool wide = false) {
  const int64_t H = L.sh.H, E = L.sh.E, K = L.sh.K, I = L.sh.I, Is = L.sh.Is;
  // 1. logits: fp32 on the GPU vs fp64 here.
  double lerr = 0, lmax = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += double(xn[t * H + h]) * L.h_router[e * H + h];
      lerr = std::max(lerr, std::abs(s - g.logits[size_t(t * E + e)]));
      lmax = std::max(lmax, std::abs(s));
    }
  EXPECT_LE(lerr, 1e-5 * lmax) << what << ": router logits";
  // 2. routing of the GPU logits by the CPU rule: ids exact, weights to a few ulps.
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> wts(size_t(T * K));
  cpu::moe_route(g.logits.data(), T, E, L.h_bias.data(), int(K), 2.f, ids.data(), wts.data());
  EXPECT_EQ(ids, g.ids) << what << ": routing";
  double werr = 0;
  for (size_t i = 0; i < wts.size(); ++i) werr = std::max(werr, double(std::abs(wts[i] - g.weights[i])));
  EXPECT_LE(werr, 2e-6) << what << ": routing weights";
  // 3. the experts, one at a time (only the chosen ones are downloaded).
  const ActRound mirror = e4m3 ? (wide ? ActRound::E4m3Wide : ActRound::E4m3) : L.fp8 ? ActRound::F16 : ActRound::Bf16;
  std::vector<double> ref(x0.begin(), x0.end()), refu(x0.begin(), x0.end());
  std::vector<double> y;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t p = 0; p < T * K; ++p)
      if (ids[size_t(p)] == e) pairs.push_back(p);
    if (pairs.empty()) continue;
    std::vector<float> gu, dn;
    L.host_expert(e, gu, dn);
    for (int64_t p : pairs) {
      const int64_t t = p / K;
      for (int pass = 0; pass < 2; ++pass) {
        cpu_mlp(&xn[size_t(t * H)], gu, dn, H, I, pass == 0 ? mirror : ActRound::None, y);
        std::vector<double>& r = pass == 0 ? ref : refu;
        for (int64_t h = 0; h < H; ++h) r[size_t(t * H + h)] += double(wts[size_t(p)]) * y[size_t(h)];
      }
    }
  }
  if (Is > 0) {
    std::vector<float> gu, dn;
    L.host_expert(E, gu, dn);
    for (int64_t t = 0; t < T; ++t)
      for (int pass = 0; pass < 2; ++pass) {
        cpu_mlp(&xn[size_t(t * H)], gu, dn, H, Is, pass == 0 ? mirror : ActRound::None, y);
        std::vector<double>& r = pass == 0 ? ref : refu;
        for (int64_t h = 0; h < H; ++h) r[size_t(t * H + h)] += y[size_t(h)];
      }
  }
  RefResult rr;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(g.x[i])) ++bad;
    rr.err = std::max(rr.err, std::abs(ref[i] - g.x[i]));
    rr.err_unrounded = std::max(rr.err_unrounded, std::abs(refu[i] - g.x[i]));
    rr.ref_max = std::max(rr.ref_max, std::abs(ref[i]));
    rr.rms += (ref[i] - g.x[i]) * (ref[i] - g.x[i]);
    rr.rms_unrounded += (refu[i] - g.x[i]) * (refu[i] - g.x[i]);
  }
  rr.rms = std::sqrt(rr.rms / double(ref.size())), rr.rms_unrounded = std::sqrt(rr.rms_unrounded / double(ref.size()));
  EXPECT_EQ(bad, 0u) << what << ": non-finite outputs";
  std::printf("[gpu-op] moe_grouped%s %s: max|err|/max|ref| %.3g (GPU-rounding ref), %.3g (fp32 activations ref); "
              "RMS err %.3g / %.3g; logits %.3g, weights %.3g, tiles %d, active experts %d\n",
              L.fp8 ? (e4m3 ? " fp8-experts e4m3-act" : " fp8-experts") : "", what.c_str(), rr.err / rr.ref_max,
              rr.err_unrounded / rr.ref_max, rr.rms, rr.rms_unrounded, lerr / lmax, werr, g.tiles, g.active);
  EXPECT_LE(rr.err, (e4m3 ? 2.5e-2 : 1e-3) * rr.ref_max) << what;
  if (e4m3) {
    EXPECT_LE(rr.rms, 0.5 * rr.rms_unrounded) << what << ": the GPU does not round as the reference mirrors";
  }
  return rr;
}

std::string name_of(const Shape& s, int64_t T) {
  char b[160];
  std::snprintf(b, sizeof b, "T %lld H %lld E %lld k %lld I %lld shared %lld", (long long)T, (long long)s.H,
                (long long)s.E, (long long)s.K, (long long)s.I, (long long)s.Is);
  return b;
}

cuda::MoeGemmPath resolved(const Shape& s, int64_t T, cuda::MoeGemmPath path, bool fp8) {
  return path == cuda::MoeGemmPath::Auto ? cuda::moe_gemm_path(T, s.H, s.E, s.K, s.I, s.Is, fp8) : path;
}

std::string path_name(const Shape& s, int64_t T, cuda::MoeGemmPath path, bool fp8 = false) {
  path = resolved(s, T, path, fp8);
  if (path == cuda::MoeGemmPath::Wgmma256 && fp8) return " wgmma e4m3 N256 BM128";
  if (path == cuda::MoeGemmPath::Wgmma || path == cuda::MoeGemmPath::Wgmma256)
    return fp8 ? " wgmma e4m3 BM128" : " wgmma BM128";
  return cuda::moe_tile_rows(T, s.E, s.K) == 16 ? " BM16" : " BM64";
}

void check_case(const Shape& s, int64_t T, uint64_t seed, cuda::MoeGemmPath path = cuda::MoeGemmPath::Auto,
                bool fp8 = false) {
  Layer L(s, seed, 0.f, 0.f, fp8);
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun g = run_gpu(L, xn, x0, T, scr, path);
  const cuda::MoeGemmPath r = resolved(s, T, path, fp8);
  check_against_cpu(L, xn, x0, T, g, name_of(s, T) + path_name(s, T, path, fp8),
                    fp8 && (r == cuda::MoeGemmPath::Wgmma || r == cuda::MoeGemmPath::Wgmma256),
                    fp8 && r == cuda::MoeGemmPath::Wgmma256);
}

TEST(GpuMoe, GroupedMoeMatchesCpuReferenceAtSmallWidths) {
  M3_SKIP_WITHOUT_GPU();
  const Shape tiny{128, 8, 2, 64, 64};
  for (int64_t T : {1, 7, 33, 200}) check_case(tiny, T, 100 + uint64_t(T));  // 200 rows: BM 64 tiles
  check_case(Shape{128, 8, 2, 64, 0}, 20, 7);                                  // no shared expert
  check_case(Shape{256, 128, 4, 128, 64}, 64, 8);                              // M3's router, narrow experts
  check_case(Shape{256, 16, 4, 96, 160}, 300, 9);  // shared wider than the experts, ragged tiles, BM 64
}

TEST(GpuMoe, GroupedMoeMatchesCpuReferenceAtM3Widths) {
  M3_SKIP_WITHOUT_GPU();
  const Shape m3{6144, 128, 4, 3072, 3072};  // 14.5 GB of bf16 experts
  check_case(m3, 3, 11);
}

TEST(GpuMoe, ExpertWithNoTokensAndExpertWithAllTokens) {
  M3_SKIP_WITHOUT_GPU();
  const Shape s{128, 8, 2, 64, 64};
  const int64_t T = 50;
  Layer L(s, 21, /*bias0=*/100.f, /*bias1=*/-100.f);  // expert 0 always first, expert 1 never chosen
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun g = run_gpu(L, xn, x0, T, scr);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(g.ids[size_t(t * s.K)], 0) << t;
    EXPECT_NE(g.ids[size_t(t * s.K + 1)], 1) << t;
  }
  EXPECT_LE(g.active, int(s.E - 1));
  check_against_cpu(L, xn, x0, T, g, "all tokens on expert 0, none on expert 1");
}

void check_graph_replay(cuda::MoeGemmPath path, bool fp8 = false) {
  const Shape s{256, 16, 4, 128, 128};
  const int64_t T = 24;
  Layer L(s, 31, 0.f, 0.f, fp8);
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun eager = run_gpu(L, xn, x0, T, scr, path);  // also reserves the scratch: nothing allocates under capture

  Dev<float> dxn(xn), dx0(x0), dx(size_t(T * s.H));
  cudaStream_t st;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  M3_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  M3_CUDA_CHECK(cudaMemcpyAsync(dx.p(), dx0.p(), size_t(T * s.H) * 4, cudaMemcpyDeviceToDevice, st));
  cuda::moe_grouped_forward(L.w, dxn.p(), T, s.H, dx.p(), scr, st, nullptr, path);
  M3_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  M3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    dx.poison();
    M3_CUDA_CHECK(cudaMemset(scr.y.get(), 0xFF, scr.y.size() * 4));
    M3_CUDA_CHECK(cudaMemset(scr.act.get(), 0xFF, scr.act.size() * 2));
    M3_CUDA_CHECK(cudaMemset(scr.ids.get(), 0xFF, scr.ids.size() * 4));
    M3_CUDA_CHECK(cudaMemset(scr.tiles.get(), 0xFF, scr.tiles.size() * 4));
    M3_CUDA_CHECK(cudaDeviceSynchronize());  // the poison (legacy stream) lands before the non-blocking replay
    M3_CUDA_CHECK(cudaGraphLaunch(exec, st));
    M3_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<float> got = dx.get();
    EXPECT_EQ(0, std::memcmp(got.data(), eager.x.data(), got.size() * 4)) << "replay " << rep;
  }
  std::printf("[gpu-op] moe_grouped graph replay (T %lld, E %lld, k %lld%s%s): 3 replays bitwise equal to eager\n",
              (long long)T, (long long)s.E, (long long)s.K, path_name(s, T, path, fp8).c_str(),
              fp8 ? ", fp8 experts" : "");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

TEST(GpuMoe, CudaGraphReplayIsBitwiseEqualToEager) {
  M3_SKIP_WITHOUT_GPU();
  check_graph_replay(cuda::MoeGemmPath::Auto);
  check_graph_replay(cuda::MoeGemmPath::Wgmma);
}

void check_batch_independence(bool fp8) {
  const Shape s{128, 8, 2, 64, 64};
  // BM 64 tiles and the router's 8-experts-per-CTA layout (T ≥ 256); the subsets below run with BM 16 and one
  // expert per router CTA: the same bits either way.
  const int64_t T = 300;
  Layer L(s, 41, 0.f, 0.f, fp8);
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun full = run_gpu(L, xn, x0, T, scr);
  for (const std::vector<int64_t>& rows : {std::vector<int64_t>{5}, std::vector<int64_t>{199, 0, 17, 5, 120, 64, 3}}) {
    std::vector<float> sxn, sx0;
    for (int64_t r : rows) {
      sxn.insert(sxn.end(), xn.begin() + r * s.H, xn.begin() + (r + 1) * s.H);
      sx0.insert(sx0.end(), x0.begin() + r * s.H, x0.begin() + (r + 1) * s.H);
    }
    const GpuRun sub = run_gpu(L, sxn, sx0, int64_t(rows.size()), scr);
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(0, std::memcmp(&sub.x[i * s.H], &full.x[size_t(rows[i] * s.H)], size_t(s.H) * 4))
          << "row " << rows[i] << " alone vs in the batch of " << T << (fp8 ? " (fp8 experts)" : "");
  }
}

TEST(GpuMoe, ResultsDoNotDependOnOtherRowsInTheBatch) {
  M3_SKIP_WITHOUT_GPU();
  check_batch_independence(false);
}

// The wgmma GEMMs of long prefills (moe_grouped_wgmma.cuh), forced at sizes the CPU reference can check: ragged
// 128-row tiles, tiles whose second 64-row half is empty (no MMA), a shared expert wider and narrower than the routed
// ones (gate/up column tiles skipped for the narrower), no shared expert.
TEST(GpuMoe, WgmmaGemmsMatchCpuReference) {
  M3_SKIP_WITHOUT_GPU();
  const auto wg = cuda::MoeGemmPath::Wgmma;
  check_case(Shape{512, 16, 4, 128, 256}, 300, 51, wg);  // shared wider than the experts
  check_case(Shape{512, 16, 4, 256, 128}, 150, 52, wg);  // shared narrower
  check_case(Shape{256, 8, 2, 128, 0}, 100, 53, wg);     // no shared expert
  check_case(Shape{256, 8, 2, 128, 128}, 1, 54, wg);     // one row: every tile almost empty
  check_case(Shape{6144, 128, 4, 3072, 3072}, 3, 55, wg);  // M3 widths
}

TEST(GpuMoe, WgmmaGemmsWithOneExpertTakingEveryToken) {
  M3_SKIP_WITHOUT_GPU();
  const Shape s{256, 8, 2, 128, 128};
  const int64_t T = 300;  // expert 0: 300 rows = 2 full tiles + 44 rows (second half of that tile idle)
  Layer L(s, 61, /*bias0=*/100.f, /*bias1=*/-100.f);
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun g = run_gpu(L, xn, x0, T, scr, cuda::MoeGemmPath::Wgmma);
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(g.ids[size_t(t * s.K)], 0) << t;
  check_against_cpu(L, xn, x0, T, g, "wgmma, all tokens on expert 0, none on expert 1");
}

// At M3's widths and a prefill-sized step (≈ 78 rows per expert, some experts over one tile) the two GEMM paths
// differ only in fp32 accumulation order (and the odd bf16 rounding of act that follows from it).
TEST(GpuMoe, WgmmaAndMmaSyncPathsAgreeAtM3Widths) {
  M3_SKIP_WITHOUT_GPU();
  const Shape s{6144, 128, 4, 3072, 3072};
  const int64_t T = 2500;
  Layer L(s, 71);
  ASSERT_EQ(cuda::moe_gemm_path(T, s.H, s.E, s.K, s.I, s.Is), cuda::MoeGemmPath::Wgmma);
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun a = run_gpu(L, xn, x0, T, scr, cuda::MoeGemmPath::MmaSync);
  const GpuRun b = run_gpu(L, xn, x0, T, scr, cuda::MoeGemmPath::Wgmma);
  EXPECT_EQ(a.ids, b.ids);
  const auto [bad, diff, delta] = diff_runs(a, b, x0);
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(delta, 0.0);
  EXPECT_LE(diff, 1e-3 * delta);
  std::printf("[gpu-op] moe_grouped T %lld at M3 widths: wgmma vs mma.sync max|diff| %.3g of max|moe out| %.3g, "
              "tiles %d\n",
              (long long)T, diff, delta, b.tiles);
}

// Inside one path a row's result is the same bits whatever else is in the batch (the k order of every output
// element is fixed): a prefill chunk's rows do not depend on how the chunk was cut, as long as the path is the same.
TEST(GpuMoe, WgmmaResultsDoNotDependOnOtherRowsInTheBatch) {
  M3_SKIP_WITHOUT_GPU();
  const Shape s{256, 8, 2, 128, 128};
  const int64_t T = 260;
  for (const bool fp8 : {false, true}) {  // bf16 experts; FP8 experts (e4m3 activations quantised per row)
    SCOPED_TRACE(fp8 ? "fp8 experts" : "bf16 experts");
    Layer L(s, 81, 0.f, 0.f, fp8);
    const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
    cuda::MoeGroupedScratch scr;
    const auto wg = cuda::MoeGemmPath::Wgmma;
    const GpuRun full = run_gpu(L, xn, x0, T, scr, wg);
    const std::vector<int64_t> rows{259, 0, 17, 5, 130, 64, 3};
    std::vector<float> sxn, sx0;
    for (int64_t r : rows) {
      sxn.insert(sxn.end(), xn.begin() + r * s.H, xn.begin() + (r + 1) * s.H);
      sx0.insert(sx0.end(), x0.begin() + r * s.H, x0.begin() + (r + 1) * s.H);
    }
    const GpuRun sub = run_gpu(L, sxn, sx0, int64_t(rows.size()), scr, wg);
    // T = 260 runs the router with 8 experts per warp, the 7-row step with 1: the logits must be the same bits.
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(&sub.logits[i * s.E], &full.logits[size_t(rows[i] * s.E)], size_t(s.E) * 4))
          << "router logits of row " << rows[i];
      EXPECT_EQ(0, std::memcmp(&sub.x[i * s.H], &full.x[size_t(rows[i] * s.H)], size_t(s.H) * 4))
          << "row " << rows[i] << " alone vs in the batch of " << T;
    }
  }
}

// ---- FP8 routed experts (docs/FP8.md §9): W8A16 grouped GEMMs on e4m3 + 128×128 block scales ------------------------
// Reference: the same CPU check as bf16 on the exactly dequantised weights (cpu::fp8_dequant; e4m3 · a power-of-two
// scale is exact in bf16, so the kernels multiply exactly these values): same tolerance.

TEST(GpuMoe, Fp8ExpertsMatchCpuReferenceAtSmallWidths) {
  M3_SKIP_WITHOUT_GPU();
  const auto au = cuda::MoeGemmPath::Auto;
  const Shape tiny{128, 8, 2, 64, 64};
  for (int64_t T : {1, 8, 64, 200}) check_case(tiny, T, 300 + uint64_t(T), au, true);  // 200 rows: BM 64 tiles
  check_case(Shape{128, 8, 2, 64, 0}, 20, 307, au, true);      // no shared expert
  check_case(Shape{256, 128, 4, 128, 64}, 64, 308, au, true);  // M3's router, narrow experts
  // 2I = 192 and H = 256: ragged 128-row scale blocks; down K = 96 / 160: a short last K step; BM 64.
  check_case(Shape{256, 16, 4, 96, 160}, 300, 309, au, true);
  check_case(Shape{384, 16, 2, 160, 96}, 9, 310, au, true);  // H = 384: three K steps, a short down K, BM 16
}

TEST(GpuMoe, Fp8ExpertsMatchCpuReferenceAtM3Widths) {
  M3_SKIP_WITHOUT_GPU();
  const Shape m3{6144, 128, 4, 3072, 3072};  // 7.2 GB of e4m3 experts
  Layer L(m3, 311, 0.f, 0.f, true);
  cuda::MoeGroupedScratch scr;
  for (int64_t T : {1, 4}) {  // the fp64 reference costs ≈ 0.1 G multiply-adds per (token, expert) here
    const auto xn = gpu_test::rand_vec(size_t(T * m3.H)), x0 = gpu_test::rand_vec(size_t(T * m3.H));
    const GpuRun g = run_gpu(L, xn, x0, T, scr);
    check_against_cpu(L, xn, x0, T, g, name_of(m3, T) + path_name(m3, T, cuda::MoeGemmPath::Auto, true),
                      resolved(m3, T, cuda::MoeGemmPath::Auto, true) != cuda::MoeGemmPath::MmaSync,
                      resolved(m3, T, cuda::MoeGemmPath::Auto, true) == cuda::MoeGemmPath::Wgmma256);
  }
}

// Decode and prefill sizes at M3 widths against the bf16 kernels on the same (dequantised) values: both mma.sync (forced:
// at T = 2048 Auto takes the e4m3 wgmma path, tested below), the same tiles; the k order inside each 64-wide chunk differs (fp32 summation order), and the FP8 GEMMs take x and
// act as f16 where the bf16 ones take bf16 — each activation's rounding differs by up to bf16's half ulp (2^-9
// relative), so the outputs agree to a few 1e-3 of their maximum (the CPU-reference tests above hold 1e-3 against a
// reference that rounds as each kernel does).
TEST(GpuMoe, Fp8ExpertsEqualBf16ExpertsOnTheSameValuesAtM3Widths) {
  M3_SKIP_WITHOUT_GPU();
  const Shape m3{6144, 128, 4, 3072, 3072};
  Layer L(m3, 312, 0.f, 0.f, true);
  L.make_bf16_twin();
  cuda::MoeGroupedScratch scr;
  for (int64_t T : {1, 8, 64, 2048}) {
    const auto xn = gpu_test::rand_vec(size_t(T * m3.H)), x0 = gpu_test::rand_vec(size_t(T * m3.H));
    const GpuRun a = run_gpu(L, xn, x0, T, scr, cuda::MoeGemmPath::MmaSync, &L.w_bf16);
    const GpuRun b = run_gpu(L, xn, x0, T, scr, cuda::MoeGemmPath::MmaSync);
    EXPECT_EQ(a.ids, b.ids) << T;
    const auto [bad, diff, delta] = diff_runs(a, b, x0);
    EXPECT_EQ(bad, 0u) << T;
    EXPECT_GT(delta, 0.0) << T;
    EXPECT_LE(diff, 4e-3 * delta) << T;
    std::printf("[gpu-op] moe_grouped fp8 experts T %lld at M3 widths (%s): vs bf16 kernels on the same values "
                "max|diff| %.3g of max|moe out| %.3g (%.2g)\n",
                (long long)T, path_name(m3, T, cuda::MoeGemmPath::MmaSync, true).c_str(), diff, delta, diff / delta);
  }
}

// The e4m3 × e4m3 wgmma GEMMs of FP8 experts (moe_grouped_wgmma_fp8.cu), forced at sizes the CPU reference can
// check (which quantises x and act as the kernels do): ragged 128-row tiles, idle second halves, a shared expert wider
// and narrower than the routed ones, none, one row, H = 384 (the gather's last 256-wide step half empty), M3 widths.
TEST(GpuMoe, Fp8WgmmaGemmsMatchCpuReferenceWithE4m3Activations) {
  M3_SKIP_WITHOUT_GPU();
  const auto wg = cuda::MoeGemmPath::Wgmma;
  check_case(Shape{512, 16, 4, 128, 256}, 300, 321, wg, true);  // shared wider than the experts
  check_case(Shape{512, 16, 4, 256, 128}, 150, 322, wg, true);  // shared narrower
  check_case(Shape{256, 8, 2, 128, 0}, 100, 323, wg, true);     // no shared expert
  check_case(Shape{256, 8, 2, 128, 128}, 1, 324, wg, true);     // one row: every tile almost empty
  check_case(Shape{384, 8, 2, 128, 128}, 50, 325, wg, true);    // H = 384
  check_case(Shape{6144, 128, 4, 3072, 3072}, 3, 326, wg, true);  // M3 widths
}

// The N = 256 FP8 kernels (MoeGemmPath::Wgmma256: two 128-column halves per tile, act in 1×128 blocks) against the
// same CPU check with act quantised per 128: ragged tiles, idle halves, shared expert wider / narrower / absent, one
// row, M3 widths; H must be a multiple of 256 (H = 384 is refused).
TEST(GpuMoe, Fp8WideWgmmaGemmsMatchCpuReferenceWithE4m3Activations) {
  M3_SKIP_WITHOUT_GPU();
  const auto wide = cuda::MoeGemmPath::Wgmma256;
  check_case(Shape{512, 16, 4, 128, 256}, 300, 331, wide, true);  // shared wider than the experts
  check_case(Shape{512, 16, 4, 256, 128}, 150, 332, wide, true);  // shared narrower
  check_case(Shape{256, 8, 2, 128, 0}, 100, 333, wide, true);     // no shared expert
  check_case(Shape{256, 8, 2, 128, 128}, 1, 334, wide, true);     // one row
  check_case(Shape{6144, 128, 4, 3072, 3072}, 3, 336, wide, true);  // M3 widths
  EXPECT_FALSE(cuda::moe_wgmma_fp8_supported(384, 128, 128, true));
  EXPECT_TRUE(cuda::moe_wgmma_fp8_supported(384, 128, 128, false));
  Layer L(Shape{384, 8, 2, 128, 128}, 335, 0.f, 0.f, true);
  const std::vector<float> xn(size_t(4 * 384), 0.5f), x0(size_t(4 * 384), 0.f);
  cuda::MoeGroupedScratch scr;
  EXPECT_THROW(run_gpu(L, xn, x0, 4, scr, wide), Error);
}

// T = 2500 rows at M3 widths with FP8 experts through two GEMM paths: same routing, finite outputs, and the MoE
// outputs within `tol` of each other as a norm ratio ‖a − b‖ / ‖a − x0‖ (what the two paths' activation rounding
// allows; printed with the max difference).
void check_paths_agree_at_m3_widths(uint64_t seed, cuda::MoeGemmPath pa, cuda::MoeGemmPath pb, const char* what,
                                    double tol) {
  const Shape s{6144, 128, 4, 3072, 3072};
  const int64_t T = 2500;
  Layer L(s, seed, 0.f, 0.f, true);
  const auto xn = gpu_test::rand_vec(size_t(T * s.H)), x0 = gpu_test::rand_vec(size_t(T * s.H));
  cuda::MoeGroupedScratch scr;
  const GpuRun a = run_gpu(L, xn, x0, T, scr, pa);
  const GpuRun b = run_gpu(L, xn, x0, T, scr, pb);
  EXPECT_EQ(a.ids, b.ids) << what;
  const auto [bad, diff, delta] = diff_runs(a, b, x0);
  EXPECT_EQ(bad, 0u) << what;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.x.size(); ++i) {
    num += (double(a.x[i]) - b.x[i]) * (double(a.x[i]) - b.x[i]);
    den += (double(a.x[i]) - x0[i]) * (double(a.x[i]) - x0[i]);
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(den, 0.0) << what;
  EXPECT_LE(rel, tol) << what;
  std::printf("[gpu-op] moe_grouped fp8 experts T %lld at M3 widths: %s ||diff|| / ||moe out|| %.3g, max|diff| %.3g "
              "of max|moe out| %.3g, tiles %d\n",
              (long long)T, what, rel, diff, delta, b.tiles);
}

// At M3 widths the two FP8 wgmma tile widths differ only in act's scale blocks (1×64 vs 1×128).
TEST(GpuMoe, Fp8WideAndNarrowWgmmaAgreeToActRoundingAtM3Widths) {
  M3_SKIP_WITHOUT_GPU();
  check_paths_agree_at_m3_widths(337, cuda::MoeGemmPath::Wgmma, cuda::MoeGemmPath::Wgmma256,
                                 "N=256 vs N=128 wgmma", 0.06);
}

// A prefill-sized step at M3 widths (Auto takes the e4m3 wgmma path, N = 256 unless M3_MOE_FP8_WIDE=0): against the
// W8A16 mma.sync path on the same FP8 weights (f16 activations) the outputs differ by the e4m3 activation rounding
// (3 mantissa bits, ≈ 2–4 % per element, averaging over K); the rows whose experts run on several tiles are included.
TEST(GpuMoe, Fp8WgmmaAndMmaSyncPathsAgreeToE4m3RoundingAtM3Widths) {
  M3_SKIP_WITHOUT_GPU();
  const char* wide_env = std::getenv("M3_MOE_FP8_WIDE");
  const bool wide = !(wide_env && std::string(wide_env) == "0");
  ASSERT_EQ(cuda::moe_gemm_path(2500, 6144, 128, 4, 3072, 3072, true),
            wide ? cuda::MoeGemmPath::Wgmma256 : cuda::MoeGemmPath::Wgmma);
  check_paths_agree_at_m3_widths(327, cuda::MoeGemmPath::MmaSync, cuda::MoeGemmPath::Auto,
                                 "e4m3 wgmma (Auto) vs f16 mma.sync", 0.06);
  check_paths_agree_at_m3_widths(328, cuda::MoeGemmPath::MmaSync, cuda::MoeGemmPath::Wgmma,
                                 "e4m3 wgmma N=128 vs f16 mma.sync", 0.06);
}

TEST(GpuMoe, Fp8ExpertsCudaGraphReplayIsBitwiseEqualToEager) {
  M3_SKIP_WITHOUT_GPU();
  check_graph_replay(cuda::MoeGemmPath::Auto, true);
  check_graph_replay(cuda::MoeGemmPath::Wgmma, true);
  check_graph_replay(cuda::MoeGemmPath::Wgmma256, true);
}

TEST(GpuMoe, Fp8ExpertsResultsDoNotDependOnOtherRowsInTheBatch) {
  M3_SKIP_WITHOUT_GPU();
  check_batch_independence(true);
}

TEST(GpuMoe, Fp8ExpertsRefuseWhatTheKernelsDoNotRead) {
  M3_SKIP_WITHOUT_GPU();
  Layer L(Shape{256, 8, 2, 128, 128}, 313, 0.f, 0.f, true);
  const std::vector<float> xn(size_t(4 * 256), 0.5f), x0(size_t(4 * 256), 0.f);
  cuda::MoeGroupedScratch scr;
  {
    Layer narrow(Shape{256, 8, 2, 96, 0}, 314, 0.f, 0.f, true);  // the e4m3 wgmma path needs I % 128 == 0
    EXPECT_THROW(run_gpu(narrow, xn, x0, 4, scr, cuda::MoeGemmPath::Wgmma), Error);
    EXPECT_FALSE(cuda::moe_wgmma_fp8_supported(256, 96, 0));
    EXPECT_TRUE(cuda::moe_wgmma_fp8_supported(6144, 3072, 3072));
    EXPECT_EQ(cuda::moe_gemm_path(64, 6144, 128, 4, 3072, 3072, true), cuda::MoeGemmPath::MmaSync);  // decode
    EXPECT_EQ(cuda::moe_gemm_path(2048, 6144, 128, 4, 3072, 3072, true), cuda::MoeGemmPath::Wgmma);  // prefill
  }
  cuda::MoeGroupedWeights w = L.w;
  w.down8_scales = nullptr;
  EXPECT_THROW(run_gpu(L, xn, x0, 4, scr, cuda::MoeGemmPath::Auto, &w), Error);  // missing scales
  cuda::DeviceBuffer<__nv_bfloat16> b(size_t(2 * 128 * 256));
  w = L.w;
  w.shared_gate_up = b.get();  // a bf16 shared expert beside FP8 routed experts
  EXPECT_THROW(run_gpu(L, xn, x0, 4, scr, cuda::MoeGemmPath::Auto, &w), Error);
}

TEST(GpuMoe, UnsupportedShapesAreRefused) {
  M3_SKIP_WITHOUT_GPU();
  cuda::MoeGroupedScratch scr;
  EXPECT_THROW(cuda::moe_reserve(scr, 4, 100, 8, 2, 64, 64), Error);  // H not a multiple of 64
  EXPECT_THROW(cuda::moe_reserve(scr, 4, 128, 8, 2, 48, 64), Error);  // I not a multiple of 32
  EXPECT_THROW(cuda::moe_reserve(scr, 4, 128, 512, 2, 64, 64), Error);  // E > 256
  EXPECT_FALSE(cuda::moe_grouped_supported(128, 8, 9, 64, 0));          // top_k > 8
  EXPECT_TRUE(cuda::moe_grouped_supported(6144, 128, 4, 3072, 3072));
  EXPECT_TRUE(cuda::moe_wgmma_supported(6144, 3072, 3072));
  EXPECT_FALSE(cuda::moe_wgmma_supported(128, 64, 64));  // H not a multiple of 256, I not of 128
  EXPECT_EQ(cuda::moe_gemm_path(64, 6144, 128, 4, 3072, 3072), cuda::MoeGemmPath::MmaSync);    // decode-sized
  EXPECT_EQ(cuda::moe_gemm_path(8192, 6144, 128, 4, 3072, 3072), cuda::MoeGemmPath::Wgmma);    // prefill
  EXPECT_EQ(cuda::moe_gemm_path(8192, 128, 8, 2, 64, 64), cuda::MoeGemmPath::MmaSync);         // widths
  // Forcing the wgmma GEMMs on widths they do not take is an error, not a wrong result.
  Layer L(Shape{128, 8, 2, 64, 64}, 91);
  const std::vector<float> xn(size_t(4 * 128), 0.5f), x0(size_t(4 * 128), 0.f);
  EXPECT_THROW(run_gpu(L, xn, x0, 4, scr, cuda::MoeGemmPath::Wgmma), Error);
}

}  // namespace
}  // namespace m3
