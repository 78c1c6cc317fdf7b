// Op-by-op harness: every CUDA op of src/backend/cuda against its CPU twin (backend/cpu/cpu_ops.h,
// engine/sampler.h) on fresh random inputs, at tiny shapes (the golden fixtures' block 16 / top-4 / head dim 32) and
// production M3 shapes (64/4/128 heads, block 128, top-16, index 4×128, contexts well past 2,048 tokens so the
// selection matters). Outputs are poisoned before each run and every element is checked written.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/fp8.h"
#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/mlp_moe.cuh"
#include "backend/cuda/msa_decode.cuh"
#include "backend/cuda/msa_indexer.cuh"
#include "backend/cuda/msa_prefill.cuh"
#include "backend/cuda/msa_topk.cuh"
#include "backend/cuda/norm_rope.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "engine/sampler.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

using gpu_test::Dev;
using gpu_test::expect_close;
using gpu_test::expect_equal_ids;
using gpu_test::rand_vec;
using gpu_test::rng;

// bf16 bits → floats (0xFFFF poison stays NaN).
std::vector<float> bf16_floats(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

// An e4m3 page unit written by heads_norm_rope against the CPU twin's quantisation of the fp32 kernel's own values
// (ref: the fp32 cache after the same call, NaN where nothing was written): bit for bit, with the scale of the
// region (K [0, v_off), V [v_off, 2·v_off), index-K after), and the poison kept where nothing was written.
void expect_e4m3_cache(const char* what, const std::vector<uint8_t>& got, const std::vector<float>& ref, int64_t unit,
                       int64_t v_off, float ks, float vs, float is) {
  int64_t bad = 0, written = 0;
  std::string first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const int64_t off = int64_t(i) % unit;
    const float sc = off < v_off ? ks : off < 2 * v_off ? vs : is;
    uint8_t want = 0xFF;
    if (!std::isnan(ref[i])) cpu::kv_quantize_e4m3(&ref[i], 1, sc, &want), ++written;
    if (got[i] != want && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want);
  }
  std::printf("[gpu-op] %s: %lld codes written, %lld mismatches\n", what, (long long)written, (long long)bad);
  EXPECT_EQ(bad, 0) << what << ": " << first;
  EXPECT_GT(written, 0) << what;
}

std::string fmt_shape(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string s;
  for (auto& [k, v] : kv) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}

// ---- GEMM ------------------------------------------------------------------------------------------------------
TEST(GpuOps, GemmMatchesCpuInFp32AndBf16) {
  M3_SKIP_WITHOUT_GPU();
  cuda::Gemm g;
  struct S { int64_t T, K, N; };
  for (S s : {S{1, 128, 96}, S{37, 128, 1152}, S{3, 6144, 9216}, S{64, 6144, 9216}, S{16, 8192, 6144}, S{9, 3072, 6144}}) {
    std::vector<float> x = rand_vec(static_cast<size_t>(s.T * s.K)), W = rand_vec(static_cast<size_t>(s.N * s.K));
    Dev<float> dx(x), dy(static_cast<size_t>(s.T * s.N));
    for (cuda::WType wt : {cuda::WType::F32, cuda::WType::BF16}) {
      std::vector<float> xr = x, Wr = W;
      Dev<uint8_t> dW;
      if (wt == cuda::WType::BF16) {
        std::vector<uint8_t> raw(W.size() * 2);
        for (size_t i = 0; i < W.size(); ++i) {
          const uint16_t h = f32_to_bf16(W[i]);
          std::memcpy(&raw[i * 2], &h, 2);
          Wr[i] = bf16_to_f32(h);
        }
        for (auto& v : xr) v = round_to_bf16(v);
        dW.set(raw);
      } else {
        std::vector<uint8_t> raw(W.size() * 4);
        std::memcpy(raw.data(), W.data(), raw.size());
        dW.set(raw);
      }
      std::vector<float> ref(static_cast<size_t>(s.T * s.N));
      cpu::matmul_nt(xr.data(), s.T, s.K, Wr.data(), s.N, ref.data());
      dy.poison();
      g.nt(dx.p(), s.T, s.K, dW.p(), wt, s.N, dy.p(), false, nullptr);
      expect_close(wt == cuda::WType::F32 ? "gemm_nt f32" : "gemm_nt bf16", fmt_shape({{"T", s.T}, {"K", s.K}, {"N", s.N}}),
                   dy.get(), ref, 1e-4);
      if (s.T == 37) {  // accumulate: y += x·Wᵀ
        std::vector<float> y0 = rand_vec(ref.size()), ref2 = ref;
        for (size_t i = 0; i < ref2.size(); ++i) ref2[i] += y0[i];
        dy.set(y0);
        g.nt(dx.p(), s.T, s.K, dW.p(), wt, s.N, dy.p(), true, nullptr);
        expect_close("gemm_nt accumulate", fmt_shape({{"T", s.T}, {"K", s.K}, {"N", s.N}}), dy.get(), ref2, 1e-4);
      }
    }
  }
}

// ---- norms, RoPE, cache write ----------------------------------------------------------------------------------
TEST(GpuOps, RmsNormGemmaMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  // 6144 and 8192: the register-row kernel (6 and 8 chunks per thread); 30: the loop kernel (D % 4 ≠ 0).
  for (auto [rows, D] : {std::pair<int64_t, int64_t>{7, 128}, {33, 6144}, {5, 32}, {3, 8192}, {4, 30}, {1, 6144}}) {
    std::vector<float> x = rand_vec(static_cast<size_t>(rows * D), 0.05f, 4.f), w = rand_vec(static_cast<size_t>(D)), ref(x.size());
    cpu::rms_norm_gemma(x.data(), rows, D, w.data(), 1e-6f, ref.data());
    Dev<float> dx(x), dw(w), dy(x.size());
    dy.poison();
    cuda::rms_norm_gemma(dx.p(), rows, D, dw.p(), 1e-6f, dy.p(), nullptr);
    expect_close("rms_norm_gemma", fmt_shape({{"rows", rows}, {"D", D}}), dy.get(), ref, 1e-5);
  }
}

TEST(GpuOps, RmsNormGemmaInPlaceMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  const int64_t rows = 3, D = 6144;
  std::vector<float> x = rand_vec(static_cast<size_t>(rows * D), 0.05f, 4.f), w = rand_vec(static_cast<size_t>(D)),
                     ref(x.size());
  cpu::rms_norm_gemma(x.data(), rows, D, w.data(), 1e-6f, ref.data());
  Dev<float> dx(x), dw(w);
  cuda::rms_norm_gemma(dx.p(), rows, D, dw.p(), 1e-6f, dx.p(), nullptr);
  expect_close("rms_norm_gemma in place", fmt_shape({{"rows", rows}, {"D", D}}), dx.get(), ref, 1e-5);
}

// Embedding rows: bf16 and fp32 tables, widths on the register-row kernel (6144) and off it (100 bf16: 100 % 8 ≠ 0;
// 98 fp32), ids in any order with repeats. The copy is exact.
TEST(GpuOps, EmbedRowsCopiesTheTableRowsExactly) {
  M3_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> ids{5, 0, 5, 11, 2};
  const int64_t V = 12, T = int64_t(ids.size());
  for (int64_t H : {6144, 100, 98}) {
    std::vector<float> table = rand_vec(static_cast<size_t>(V * H), 0.05f, 3.f);
    std::vector<uint16_t> tb(table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &table[i], 4);
      tb[i] = uint16_t(u >> 16);  // truncation: any bf16 bits will do
    }
    Dev<int32_t> did(ids);
    for (bool bf16 : {true, false}) {
      if (bf16 && H == 98) continue;
      Dev<float> dt(table), dy(size_t(T * H));
      Dev<uint16_t> dtb(tb);
      dy.poison();
      cuda::embed_rows(bf16 ? static_cast<const void*>(dtb.p()) : static_cast<const void*>(dt.p()), bf16, H, did.p(), T,
                       dy.p(), nullptr);
      const std::vector<float> got = dy.get();
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < H; ++i) {
          float want = table[size_t(ids[size_t(t)] * H + i)];
          if (bf16) {
            const uint32_t u = uint32_t(tb[size_t(ids[size_t(t)] * H + i)]) << 16;
            std::memcpy(&want, &u, 4);
          }
          bad += std::memcmp(&want, &got[size_t(t * H + i)], 4) != 0;
        }
      EXPECT_EQ(bad, 0) << "embed_rows H " << H << (bf16 ? " bf16" : " fp32");
    }
  }
}

// bf16 activations (issue 9 item 1): each op that now writes bf16 must give exactly the bits of its fp32 result
// rounded by f32_to_bf16 — the executor's numerics did not change when the rounding kernels were dropped.
std::vector<uint16_t> rounded(const std::vector<float>& v) {
  Dev<float> d(v);
  Dev<uint16_t> b(v.size());
  cuda::f32_to_bf16(d.p(), int64_t(v.size()), b.p(), nullptr);
  return b.get();
}

TEST(GpuOps, Bf16OutputsOfNormRopeAndSwigluEqualTheRoundedFp32Results) {
  M3_SKIP_WITHOUT_GPU();
  const int64_t rows = 9, D = 6144;
  std::vector<float> x = rand_vec(static_cast<size_t>(rows * D), 0.05f, 4.f), w = rand_vec(static_cast<size_t>(D));
  Dev<float> dx(x), dw(w), dy(x.size()), dy2(x.size());
  Dev<uint16_t> dyb(x.size());
  dyb.poison(), dy2.poison();
  cuda::rms_norm_gemma(dx.p(), rows, D, dw.p(), 1e-6f, dy.p(), nullptr);
  cuda::rms_norm_gemma_bf16(dx.p(), rows, D, dw.p(), 1e-6f, dyb.p(), dy2.p(), nullptr);
  EXPECT_EQ(dyb.get(), rounded(dy.get())) << "rms_norm_gemma_bf16";
  EXPECT_EQ(dy2.get(), dy.get()) << "rms_norm_gemma_bf16's fp32 output";

  const int T = 5, Hq = 16, Hkv = 2, Dh = 128, width = (Hq + 2 * Hkv) * Dh, B = 16;
  std::vector<float> src = rand_vec(static_cast<size_t>(T) * width, 0.05f, 3.f), qw = rand_vec(Dh), kw = rand_vec(Dh);
  std::vector<int32_t> pos{3, 70, 1000, 5, 17}, slot{0, 1, 2, 3, 4};
  const int64_t unit = int64_t(2 * Hkv) * B * Dh;
  Dev<float> dsrc(src), dqw(qw), dkw(kw), dq(static_cast<size_t>(T) * Hq * Dh), dcache(static_cast<size_t>(5 * unit));
  Dev<uint16_t> dqb(static_cast<size_t>(T) * Hq * Dh);
  Dev<float> dfreq(cuda::rope_inv_freq(64, 5e6));
  Dev<int32_t> dpos(pos), dslot(slot);
  dqb.poison();
  cuda::HeadsNormRopeArgs a;
  a.src = dsrc.p(), a.src_ld = width, a.T = T, a.D = Dh;
  a.n_q = Hq, a.q_col0 = 0, a.q_w = dqw.p(), a.q_out = dq.p();
  a.n_k = Hkv, a.k_col0 = Hq * Dh, a.k_w = dkw.p(), a.k_cache = dcache.p(), a.k_head_stride = int64_t(B) * Dh;
  a.n_v = Hkv, a.v_col0 = (Hq + Hkv) * Dh, a.v_cache = dcache.p() + Hkv * B * Dh, a.v_head_stride = int64_t(B) * Dh;
  a.pos = dpos.p(), a.slot_page = dslot.p(), a.page_stride = unit, a.block_size = B;
  a.inv_freq = dfreq.p(), a.rotary_dim = 64, a.eps = 1e-6f;
  cuda::heads_norm_rope(a, nullptr);
  cuda::HeadsNormRopeArgs ab = a;
  ab.q_out_bf16 = dqb.p();
  cuda::heads_norm_rope(ab, nullptr);
  EXPECT_EQ(dqb.get(), rounded(dq.get())) << "heads_norm_rope q_out_bf16";

  const int64_t Tm = 7, I = 3072;
  std::vector<float> gu = rand_vec(static_cast<size_t>(Tm * 2 * I), 0.01f, 9.f);
  Dev<float> dgu(gu), dact(static_cast<size_t>(Tm * I));
  cuda::swiglu_oai(dgu.p(), Tm, I, 1.702f, 7.f, dact.p(), nullptr);
  // run_mlp's bf16 path: gate/up GEMM (fp32 out) → SwiGLU in bf16 → down GEMM; compare its result with the fp32
  // SwiGLU rounded by the GEMM wrapper (nt on fp32 act) — identical bits.
  cuda::Gemm g;
  const int64_t H = 256;
  std::vector<float> wgu = rand_vec(static_cast<size_t>(2 * I * H), 0.001f, 0.05f), wdn = rand_vec(static_cast<size_t>(H * I), 0.001f, 0.05f),
                     xin = rand_vec(static_cast<size_t>(Tm * H));
  Dev<uint16_t> bgu(rounded(wgu)), bdn(rounded(wdn));
  Dev<float> dxin(xin), y1(static_cast<size_t>(Tm * H)), y2(static_cast<size_t>(Tm * H)), gu2(static_cast<size_t>(Tm * 2 * I)),
      act2(static_cast<size_t>(Tm * I));
  const cuda::MlpDev m{bgu.p(), bdn.p(), cuda::WType::BF16, I};
  cuda::FfnScratch scr;
  cuda::run_mlp(g, m, dxin.p(), Tm, H, 1.702f, 7.f, y1.p(), false, scr, nullptr);
  g.nt(dxin.p(), Tm, H, bgu.p(), cuda::WType::BF16, 2 * I, gu2.p(), false, nullptr);
  cuda::swiglu_oai(gu2.p(), Tm, I, 1.702f, 7.f, act2.p(), nullptr);
  g.nt(act2.p(), Tm, I, bdn.p(), cuda::WType::BF16, H, y2.p(), false, nullptr);
  EXPECT_EQ(y1.get(), y2.get()) << "run_mlp with a bf16 SwiGLU output";
}

struct NormRopeCase {
  int Hq, Hkv, D, rot, B;
  double theta;
  int max_pos;
};

TEST(GpuOps, FusedQkNormRopeAndCacheWriteMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  for (NormRopeCase c : {NormRopeCase{8, 2, 32, 16, 16, 1e4, 4000}, NormRopeCase{64, 4, 128, 64, 128, 5e6, 200000}}) {
    const int T = 150, width = (c.Hq + 2 * c.Hkv) * c.D + 7;  // +7: an odd row stride
    const int64_t unit = int64_t(2 * c.Hkv) * c.B * c.D + 3 * c.B * c.D, pages = (c.max_pos + c.B - 1) / c.B + 1;
    std::vector<float> src = rand_vec(static_cast<size_t>(T) * width, 0.05f, 3.f), qw = rand_vec(static_cast<size_t>(c.D)), kw = rand_vec(static_cast<size_t>(c.D));
    // Distinct random positions, each mapped to a random physical page.
    std::vector<int32_t> all_pos(static_cast<size_t>(c.max_pos));
    std::iota(all_pos.begin(), all_pos.end(), 0);
    std::shuffle(all_pos.begin(), all_pos.end(), rng());
    std::vector<int32_t> pos(all_pos.begin(), all_pos.begin() + T), page_of_block(static_cast<size_t>(pages));
    std::iota(page_of_block.begin(), page_of_block.end(), 0);
    std::shuffle(page_of_block.begin(), page_of_block.end(), rng());
    std::vector<int32_t> slot(T);
    for (int t = 0; t < T; ++t) slot[t] = page_of_block[static_cast<size_t>(pos[t] / c.B)];
    // CPU: take the columns, norm + RoPE, scatter into a NaN cache.
    std::vector<float> q(static_cast<size_t>(T) * c.Hq * c.D), k(static_cast<size_t>(T) * c.Hkv * c.D), v(k.size());
    for (int t = 0; t < T; ++t) {
      std::memcpy(&q[static_cast<size_t>(t) * c.Hq * c.D], &src[static_cast<size_t>(t) * width], static_cast<size_t>(c.Hq * c.D) * 4);
      std::memcpy(&k[static_cast<size_t>(t) * c.Hkv * c.D], &src[static_cast<size_t>(t) * width + c.Hq * c.D], static_cast<size_t>(c.Hkv * c.D) * 4);
      std::memcpy(&v[static_cast<size_t>(t) * c.Hkv * c.D], &src[static_cast<size_t>(t) * width + (c.Hq + c.Hkv) * c.D], static_cast<size_t>(c.Hkv * c.D) * 4);
    }
    // rope_neox_partial takes one position per token: run per token.
    cpu::rms_norm_gemma(q.data(), int64_t(T) * c.Hq, c.D, qw.data(), 1e-6f, q.data());
    cpu::rms_norm_gemma(k.data(), int64_t(T) * c.Hkv, c.D, kw.data(), 1e-6f, k.data());
    cpu::rope_neox_partial(q.data(), T, c.Hq, c.D, c.rot, pos.data(), c.theta);
    cpu::rope_neox_partial(k.data(), T, c.Hkv, c.D, c.rot, pos.data(), c.theta);
    std::vector<float> cache(static_cast<size_t>(pages * unit), std::nanf(""));
    const int64_t v_off = int64_t(c.Hkv) * c.B * c.D;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < c.Hkv; ++h) {
        const int64_t base = slot[t] * unit + (int64_t(h) * c.B + pos[t] % c.B) * c.D;
        std::memcpy(&cache[static_cast<size_t>(base)], &k[(static_cast<size_t>(t) * c.Hkv + h) * c.D], static_cast<size_t>(c.D) * 4);
        std::memcpy(&cache[static_cast<size_t>(base + v_off)], &v[(static_cast<size_t>(t) * c.Hkv + h) * c.D], static_cast<size_t>(c.D) * 4);
      }
    Dev<float> dsrc(src), dqw(qw), dkw(kw), dq(q.size()), dcache(cache.size());
    Dev<float> dfreq(cuda::rope_inv_freq(c.rot, c.theta));
    Dev<int32_t> dpos(pos), dslot(slot);
    dq.poison();
    dcache.poison();
    cuda::HeadsNormRopeArgs a;
    a.src = dsrc.p(), a.src_ld = width, a.T = T, a.D = c.D;
    a.n_q = c.Hq, a.q_col0 = 0, a.q_w = dqw.p(), a.q_out = dq.p();
    a.n_k = c.Hkv, a.k_col0 = c.Hq * c.D, a.k_w = dkw.p(), a.k_cache = dcache.p(), a.k_head_stride = int64_t(c.B) * c.D;
    a.n_v = c.Hkv, a.v_col0 = (c.Hq + c.Hkv) * c.D, a.v_cache = dcache.p() + v_off, a.v_head_stride = int64_t(c.B) * c.D;
    a.pos = dpos.p(), a.slot_page = dslot.p(), a.page_stride = unit, a.block_size = c.B;
    a.inv_freq = dfreq.p(), a.rotary_dim = c.rot, a.eps = 1e-6f;
    cuda::heads_norm_rope(a, nullptr);
    const std::string shape = fmt_shape({{"T", T}, {"Hq", c.Hq}, {"Hkv", c.Hkv}, {"D", c.D}, {"rot", c.rot}, {"maxpos", c.max_pos}});
    expect_close("qk_norm_rope q", shape, dq.get(), q, 2e-5);
    // Cache: written slots match, untouched slots stay NaN (compare() requires NaN exactly where the CPU has NaN).
    expect_close("qk_norm_rope k/v cache", shape, dcache.get(), cache, 2e-5);
    {  // bf16 pools (issue 9): the same values rounded to bf16 (≤ 2^-9 relative, one rounding of the fp32 result).
      Dev<uint16_t> dcb(cache.size());
      dcb.poison();
      cuda::HeadsNormRopeArgs ab = a;
      ab.k_cache = dcb.p(), ab.v_cache = dcb.p() + v_off, ab.cache_type = cuda::KvType::BF16;
      cuda::heads_norm_rope(ab, nullptr);
      expect_close("qk_norm_rope k/v cache bf16", shape, bf16_floats(dcb.get()), cache, 8e-3);
    }
    {  // e4m3 pools (issue 15 item 4): K and V with their own per-tensor scales.
      const std::vector<float> got32 = dcache.get();
      Dev<uint8_t> d8(cache.size());
      d8.poison();
      cuda::HeadsNormRopeArgs a8 = a;
      a8.k_cache = d8.p(), a8.v_cache = d8.p() + v_off, a8.cache_type = cuda::KvType::E4M3;
      a8.k_scale = 0.02f, a8.v_scale = 0.01f;
      cuda::heads_norm_rope(a8, nullptr);
      expect_e4m3_cache("qk_norm_rope k/v cache e4m3", d8.get(), got32, unit, v_off, 0.02f, 0.01f, 1.f);
    }

    // Index branch: Hidx query heads + the one shared index key (head stride 0, [B, Di] pages).
    const int Hi = c.Hkv, Di = c.D, iw = (Hi + 1) * Di;
    std::vector<float> isrc = rand_vec(static_cast<size_t>(T) * iw, 0.05f, 3.f), iq(static_cast<size_t>(T) * Hi * Di), ik(static_cast<size_t>(T) * Di);
    for (int t = 0; t < T; ++t) {
      std::memcpy(&iq[static_cast<size_t>(t) * Hi * Di], &isrc[static_cast<size_t>(t) * iw], static_cast<size_t>(Hi * Di) * 4);
      std::memcpy(&ik[static_cast<size_t>(t) * Di], &isrc[static_cast<size_t>(t) * iw + Hi * Di], static_cast<size_t>(Di) * 4);
    }
    cpu::rms_norm_gemma(iq.data(), int64_t(T) * Hi, Di, qw.data(), 1e-6f, iq.data());
    cpu::rms_norm_gemma(ik.data(), T, Di, kw.data(), 1e-6f, ik.data());
    cpu::rope_neox_partial(iq.data(), T, Hi, Di, c.rot, pos.data(), c.theta);
    cpu::rope_neox_partial(ik.data(), T, 1, Di, c.rot, pos.data(), c.theta);
    std::vector<float> icache(static_cast<size_t>(pages * unit), std::nanf(""));
    for (int t = 0; t < T; ++t)
      std::memcpy(&icache[static_cast<size_t>(slot[t] * unit + 2 * v_off + (pos[t] % c.B) * Di)], &ik[static_cast<size_t>(t) * Di], static_cast<size_t>(Di) * 4);
    Dev<float> disrc(isrc), diq(iq.size());
    diq.poison();
    dcache.poison();
    cuda::HeadsNormRopeArgs b = a;
    b.src = disrc.p(), b.src_ld = iw, b.D = Di, b.n_q = Hi, b.q_out = diq.p(), b.k_col0 = Hi * Di, b.n_k = 1;
    b.k_cache = dcache.p() + 2 * v_off, b.k_head_stride = 0, b.n_v = 0;
    cuda::heads_norm_rope(b, nullptr);
    expect_close("index_norm_rope iq", shape, diq.get(), iq, 2e-5);
    expect_close("index_norm_rope index-K cache", shape, dcache.get(), icache, 2e-5);
    {
      Dev<uint16_t> dcb(icache.size());
      dcb.poison();
      cuda::HeadsNormRopeArgs bb = b;
      bb.k_cache = dcb.p() + 2 * v_off, bb.cache_type = cuda::KvType::BF16;
      cuda::heads_norm_rope(bb, nullptr);
      expect_close("index_norm_rope index-K bf16", shape, bf16_floats(dcb.get()), icache, 8e-3);
    }
    {  // e4m3 index-K: the k scale is the index-K's (MSA stores it unscaled: 1; a scale exercises the division).
      const std::vector<float> got32 = dcache.get();
      Dev<uint8_t> d8(icache.size());
      d8.poison();
      cuda::HeadsNormRopeArgs b8 = b;
      b8.k_cache = d8.p() + 2 * v_off, b8.cache_type = cuda::KvType::E4M3, b8.k_scale = 0.015f;
      cuda::heads_norm_rope(b8, nullptr);
      expect_e4m3_cache("index_norm_rope index-K e4m3", d8.get(), got32, unit, v_off, 1.f, 1.f, 0.015f);
    }
  }
}

// ---- SwiGLU, routing, MoE --------------------------------------------------------------------------------------
TEST(GpuOps, SwigluOaiMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  for (auto [T, I] : {std::pair<int64_t, int64_t>{37, 64}, {5, 3072}, {64, 12288}}) {
    std::vector<float> gu = rand_vec(static_cast<size_t>(T * 2 * I), 0.01f, 10.f), ref(static_cast<size_t>(T * I));  // crosses the ±7 limit
    cpu::swiglu_oai(gu.data(), T, I, 1.702f, 7.f, ref.data());
    Dev<float> dgu(gu), dout(ref.size());
    dout.poison();
    cuda::swiglu_oai(dgu.p(), T, I, 1.702f, 7.f, dout.p(), nullptr);
    expect_close("swiglu_oai", fmt_shape({{"T", T}, {"I", I}}), dout.get(), ref, 1e-5);
  }
}

TEST(GpuOps, MoeRouteMatchesCpuIncludingTies) {
  M3_SKIP_WITHOUT_GPU();
  struct S { int64_t T, E; int k; bool bias, ties; };
  for (S s : {S{50, 8, 2, true, false}, S{64, 128, 4, true, false}, S{300, 128, 4, false, true}, S{7, 8, 8, true, false}}) {
    std::vector<float> logits = rand_vec(static_cast<size_t>(s.T * s.E), 0.01f, 4.f), bias = rand_vec(static_cast<size_t>(s.E), 0.001f, 0.1f);
    if (s.ties)  // quantised logits: many exact ties, which must go to the lower expert id
      for (auto& v : logits) v = std::round(v * 2.f) / 2.f;
    std::vector<int32_t> ids(static_cast<size_t>(s.T * s.k));
    std::vector<float> w(ids.size());
    cpu::moe_route(logits.data(), s.T, s.E, s.bias ? bias.data() : nullptr, s.k, 2.f, ids.data(), w.data());
    Dev<float> dl(logits), db(bias), dw(w.size());
    Dev<int32_t> di(ids.size());
    dw.poison();
    di.poison(0x7F);
    cuda::moe_route(dl.p(), s.T, s.E, s.bias ? db.p() : nullptr, s.k, 2.f, di.p(), dw.p(), nullptr);
    const std::string shape = fmt_shape({{"T", s.T}, {"E", s.E}, {"k", s.k}, {"ties", s.ties}});
    expect_equal_ids("moe_route ids", shape, di.get(), ids);
    expect_close("moe_route weights", shape, dw.get(), w, 1e-6);
  }
}

TEST(GpuOps, GroupedMoeWithSharedExpertMatchesCpu) {
  M3_SKIP_WITHOUT_GPU();
  struct S { int64_t T, H, E, k, I, S_; };
  for (S s : {S{37, 128, 8, 2, 64, 64}, S{64, 512, 128, 4, 128, 128}, S{1, 512, 128, 4, 128, 0}}) {
    const float scale = 1.f / std::sqrt(float(s.H));
    std::vector<float> xn = rand_vec(static_cast<size_t>(s.T * s.H)), x0 = rand_vec(static_cast<size_t>(s.T * s.H));
    std::vector<float> router = rand_vec(static_cast<size_t>(s.E * s.H)), bias = rand_vec(static_cast<size_t>(s.E), 0.001f, 0.05f);
    std::vector<std::vector<float>> gu(static_cast<size_t>(s.E)), dn(static_cast<size_t>(s.E));
    for (int64_t e = 0; e < s.E; ++e) {
      gu[e] = rand_vec(static_cast<size_t>(2 * s.I * s.H), 0.01f, 3.f * scale);
      dn[e] = rand_vec(static_cast<size_t>(s.H * s.I), 0.01f, 1.f / std::sqrt(float(s.I)));
    }
    std::vector<float> sgu = rand_vec(static_cast<size_t>(2 * s.S_ * s.H), 0.01f, 3.f * scale), sdn = rand_vec(static_cast<size_t>(s.H * s.S_), 0.01f, 0.1f);
    // CPU: the FFN of M3Model::forward.
    std::vector<float> logits(static_cast<size_t>(s.T * s.E)), w(static_cast<size_t>(s.T * s.k)), ref = x0;
    std::vector<int32_t> ids(static_cast<size_t>(s.T * s.k));
    cpu::matmul_nt(xn.data(), s.T, s.H, router.data(), s.E, logits.data());
    cpu::moe_route(logits.data(), s.T, s.E, bias.data(), int(s.k), 2.f, ids.data(), w.data());
    auto mlp = [&](const float* x, const std::vector<float>& g, const std::vector<float>& d, int64_t I, float* y) {
      std::vector<float> a(static_cast<size_t>(2 * I)), act(static_cast<size_t>(I));
      cpu::matmul_nt(x, 1, s.H, g.data(), 2 * I, a.data());
      cpu::swiglu_oai(a.data(), 1, I, 1.702f, 7.f, act.data());
      cpu::matmul_nt(act.data(), 1, I, d.data(), s.H, y);
    };
    std::vector<float> y(static_cast<size_t>(s.H)), ys(static_cast<size_t>(s.H));
    for (int64_t t = 0; t < s.T; ++t) {
      std::vector<float> acc(static_cast<size_t>(s.H), 0.f);
      for (int64_t kk = 0; kk < s.k; ++kk) {
        mlp(&xn[static_cast<size_t>(t * s.H)], gu[static_cast<size_t>(ids[static_cast<size_t>(t * s.k + kk)])], dn[static_cast<size_t>(ids[static_cast<size_t>(t * s.k + kk)])], s.I, y.data());
        for (int64_t h = 0; h < s.H; ++h) acc[h] += w[static_cast<size_t>(t * s.k + kk)] * y[h];
      }
      if (s.S_ > 0) {
        mlp(&xn[static_cast<size_t>(t * s.H)], sgu, sdn, s.S_, ys.data());
        for (int64_t h = 0; h < s.H; ++h) acc[h] += ys[h];
      }
      for (int64_t h = 0; h < s.H; ++h) ref[static_cast<size_t>(t * s.H + h)] += acc[h];
    }
    // GPU (fp32 weights).
    Dev<float> dxn(xn), dx(x0), drouter(router), dbias(bias), dsgu(sgu), dsdn(sdn);
    std::vector<Dev<float>> dgu, ddn;
    for (int64_t e = 0; e < s.E; ++e) dgu.emplace_back(gu[e]), ddn.emplace_back(dn[e]);
    cuda::MoeArgs a;
    a.router = drouter.p(), a.router_bias = dbias.p(), a.E = s.E, a.top_k = s.k, a.routed_scale = 2.f;
    for (int64_t e = 0; e < s.E; ++e) a.experts.push_back(cuda::MlpDev{dgu[e].p(), ddn[e].p(), cuda::WType::F32, s.I});
    if (s.S_ > 0) a.shared = cuda::MlpDev{dsgu.p(), dsdn.p(), cuda::WType::F32, s.S_};
    cuda::Gemm g;
    cuda::FfnScratch scr;
    cuda::moe_forward(g, a, dxn.p(), s.T, s.H, dx.p(), scr, nullptr);
    expect_close("moe_forward (grouped) f32", fmt_shape({{"T", s.T}, {"H", s.H}, {"E", s.E}, {"k", s.k}, {"I", s.I}, {"shared", s.S_}}),
                 dx.get(), ref, 1e-4);
  }
}

// ---- paged cache fixtures for attention and the indexer ----------------------------------------------------------
// One layer's slice of page units: K [Hkv, B, D], V [Hkv, B, D], index-K [B, Di], then padding up to a multiple
// of B·D plus one extra B·D (so the virtual-page stride differs from a K-only pool, catching stride bugs).
// bf16 = true: the device copy is bf16 (issue 9's serving cache) and the host values are rounded to bf16 first, so
// the CPU reference sees exactly the values the GPU reads.
struct Cache {
  int Hkv, B, D, Di, pages;
  bool bf16;
  int64_t unit, v_off, ik_off;
  std::vector<float> host;
  Dev<float> dev;
  Dev<uint16_t> devb;
  Cache(int hkv, int b, int d, int di, int npages, bool bf = false)
      : Hkv(hkv), B(b), D(d), Di(di), pages(npages), bf16(bf) {
    v_off = int64_t(Hkv) * B * D;
    ik_off = 2 * v_off;
    const int64_t used = ik_off + int64_t(B) * Di, bd = int64_t(B) * D;
    unit = (used + bd - 1) / bd * bd + bd;
    host = rand_vec(static_cast<size_t>(pages * unit), 0.01f, 1.f);
    if (bf16) {
      std::vector<uint16_t> bits(host.size());
      for (size_t i = 0; i < host.size(); ++i) bits[i] = f32_to_bf16(host[i]), host[i] = bf16_to_f32(bits[i]);
      devb.set(bits);
    } else {
      dev.set(host);
    }
  }
  cpu::PagedKV cpu_kv() const { return {host.data(), host.data() + v_off, unit, Hkv, B, D}; }
  cpu::PagedIndexK cpu_ik() const { return {host.data() + ik_off, unit, B, Di}; }
  cuda::DevPagedKV gpu_kv() {
    if (bf16) return {devb.p(), devb.p() + v_off, unit, Hkv, B, D, cuda::KvType::BF16};
    return {dev.p(), dev.p() + v_off, unit, Hkv, B, D};
  }
  cuda::DevPagedIndexK gpu_ik() {
    if (bf16) return {devb.p() + ik_off, unit, B, Di, cuda::KvType::BF16};
    return {dev.p() + ik_off, unit, B, Di};
  }
  const char* tag() const { return bf16 ? " kv=bf16" : ""; }
};

// Sequences of one step: (start_pos, new tokens); each gets a random, non-contiguous page table.
struct Step {
  std::vector<int64_t> begin;  // row offsets per sequence
  std::vector<int32_t> pos, row_seq, pt_indptr{0}, pt_pages;
  std::vector<std::vector<int32_t>> tables;
  Dev<int32_t> dpos, drow, dind, dpages;
  Step(const std::vector<std::pair<int, int>>& seqs, int B, int num_pages) {
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    size_t next = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [start, n] = seqs[s];
      begin.push_back(int64_t(pos.size()));
      for (int i = 0; i < n; ++i) pos.push_back(start + i), row_seq.push_back(int32_t(s));
      const int blocks = (start + n + B - 1) / B;
      std::vector<int32_t> t(perm.begin() + int64_t(next), perm.begin() + int64_t(next + static_cast<size_t>(blocks)));
      EXPECT_LE(next + static_cast<size_t>(blocks), perm.size()) << "test cache too small";
      next += static_cast<size_t>(blocks);
      pt_pages.insert(pt_pages.end(), t.begin(), t.end());
      pt_indptr.push_back(int32_t(pt_pages.size()));
      tables.push_back(std::move(t));
    }
    begin.push_back(int64_t(pos.size()));
    dpos.set(pos), drow.set(row_seq), dind.set(pt_indptr), dpages.set(pt_pages);
  }
  int T() const { return int(pos.size()); }
  int n(size_t s) const { return int(begin[s + 1] - begin[s]); }
  cuda::DevStepRows rows() { return {dpos.p(), drow.p(), dind.p(), dpages.p(), T()}; }
};

int pages_needed(const std::vector<std::pair<int, int>>& seqs, int B) {
  int n = 0;
  for (auto [s, k] : seqs) n += (s + k + B - 1) / B;
  return n + 3;
}

struct AttnCase {
  const char* name;
  int Hq, Hkv, D, B, K;
  std::vector<std::pair<int, int>> seqs;  // (start_pos, new tokens)
};

std::vector<AttnCase> attn_cases() {
  return {
      {"tiny prefill chunk", 8, 2, 32, 16, 4, {{200, 100}}},
      {"tiny decode batch", 8, 2, 32, 16, 4, {{5, 1}, {63, 1}, {64, 1}, {290, 1}, {1000, 3}}},
      {"M3 prefill chunk", 64, 4, 128, 128, 16, {{2900, 64}}},
      {"M3 prefill 2 seqs", 64, 4, 128, 128, 16, {{0, 40}, {4000, 24}}},
      {"M3 decode batch", 64, 4, 128, 128, 16, {{100, 1}, {2047, 1}, {2048, 1}, {9000, 1}, {33000, 1}}},
      {"M3 verify Q=8", 64, 4, 128, 128, 16, {{20000, 8}, {3000, 8}}},
      {"M3 TP8 G=8", 8, 1, 128, 128, 16, {{17000, 4}, {70000, 1}}},
  };
}

std::string case_shape(const AttnCase& c, int T) {
  return std::string(c.name) + " " + fmt_shape({{"T", T}, {"Hq", c.Hq}, {"Hkv", c.Hkv}, {"D", c.D}, {"B", c.B}});
}

TEST(GpuOps, DenseCausalPagedAttentionPrefillAndSplitKDecodeMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  for (const AttnCase& c : attn_cases())
   for (bool bf16 : {false, true}) {
    Cache cache(c.Hkv, c.B, c.D, c.D, pages_needed(c.seqs, c.B), bf16);
    Step st(c.seqs, c.B, cache.pages);
    const int T = st.T();
    std::vector<float> q = rand_vec(static_cast<size_t>(T) * c.Hq * c.D), ref(q.size());
    const float scale = 1.f / std::sqrt(float(c.D));
    for (size_t s = 0; s < c.seqs.size(); ++s)
      cpu::attention_dense_causal(&q[static_cast<size_t>(st.begin[s]) * c.Hq * c.D], st.n(s), c.Hq, &st.pos[static_cast<size_t>(st.begin[s])],
                                  cache.cpu_kv(), st.tables[s].data(), scale, &ref[static_cast<size_t>(st.begin[s]) * c.Hq * c.D]);
    Dev<float> dq(q), dout(q.size());
    for (bool split : {false, true}) {
      cuda::DenseAttention att;
      att.plan(st.pos, st.rows(), c.Hkv, c.Hq / c.Hkv, c.D, c.B, cache.unit / (int64_t(c.B) * c.D), split, nullptr);
      dout.poison();
      att.run(dq.p(), cache.gpu_kv(), scale, dout.p(), nullptr);
      expect_close(split ? "dense_attention split-K" : "dense_attention", case_shape(c, T) + cache.tag(), dout.get(),
                   ref, 1e-4);
    }
  }
}

// ---- MSA indexer, top-k, sparse attention ------------------------------------------------------------------------
TEST(GpuOps, MsaIndexerBlockScoresMatchCpuInPrefillAndDecode) {
  M3_SKIP_WITHOUT_GPU();
  for (const AttnCase& c : attn_cases())
   for (bool bf16 : {false, true}) {
    const int Hi = c.Hkv, Di = c.D;
    Cache cache(c.Hkv, c.B, c.D, Di, pages_needed(c.seqs, c.B), bf16);
    Step st(c.seqs, c.B, cache.pages);
    const int T = st.T();
    std::vector<float> iq = rand_vec(static_cast<size_t>(T) * Hi * Di);
    Dev<float> diq(iq);
    for (bool decode : {false, true}) {
      cuda::MsaIndexer ix;
      ix.plan(st.pos, st.row_seq, Hi, c.B, decode, nullptr);
      const int64_t cols = ix.max_cols();
      std::vector<float> ref(static_cast<size_t>(Hi) * T * cols);
      for (size_t s = 0; s < c.seqs.size(); ++s) {  // the CPU scores one sequence at a time: place its rows
        const int n = st.n(s);
        std::vector<float> part(static_cast<size_t>(Hi) * n * cols);
        cpu::msa_block_scores(&iq[static_cast<size_t>(st.begin[s]) * Hi * Di], n, Hi, &st.pos[static_cast<size_t>(st.begin[s])], cache.cpu_ik(),
                              st.tables[s].data(), cols, part.data());
        for (int h = 0; h < Hi; ++h)
          std::memcpy(&ref[(static_cast<size_t>(h) * T + static_cast<size_t>(st.begin[s])) * cols], &part[static_cast<size_t>(h) * n * cols], static_cast<size_t>(n * cols) * 4);
      }
      Dev<float> dscores(ref.size());
      dscores.poison();
      ix.run(diq.p(), cache.gpu_ik(), st.rows(), dscores.p(), nullptr);
      expect_close(decode ? "msa_index_scores decode" : "msa_index_scores prefill",
                   case_shape(c, T) + " cols=" + std::to_string(cols) + cache.tag(),
                   dscores.get(), ref, 1e-4);
    }
  }
}

TEST(GpuOps, MsaTopkMatchesCpuExactlyIncludingTiesAndShortRows) {
  M3_SKIP_WITHOUT_GPU();
  struct S { int B, K, H; std::vector<int32_t> pos; bool ties; };
  std::vector<S> cases = {
      {16, 4, 2, {0, 15, 16, 47, 48, 63, 64, 65, 300, 999}, false},
      {128, 16, 4, {0, 127, 1000, 2047, 2048, 2049, 5000, 33000, 100000, 131071}, false},
      {128, 16, 4, {2048, 5000, 40000, 100000}, true},
      {128, 16, 1, {1999, 20000}, false},
  };
  for (const S& s : cases) {
    const int T = int(s.pos.size());
    int64_t cols = 1;
    for (int32_t p : s.pos) cols = std::max<int64_t>(cols, p / s.B + 1);
    std::vector<float> scores = rand_vec(static_cast<size_t>(s.H) * T * cols, 0.f, 10.f);
    if (s.ties)
      for (auto& v : scores) v = std::round(v);  // ~20 distinct values over hundreds of blocks
    std::vector<int32_t> ref(static_cast<size_t>(s.H) * T * s.K);
    cpu::msa_topk(scores.data(), T, s.H, s.pos.data(), s.B, cols, s.K, ref.data());
    Dev<float> dsc(scores);
    Dev<int32_t> dpos(s.pos), dsel(ref.size());
    dsel.poison(0x7F);
    cuda::msa_topk(dsc.p(), T, s.H, dpos.p(), s.B, cols, s.K, dsel.p(), nullptr);
    expect_equal_ids("msa_topk", fmt_shape({{"T", T}, {"H", s.H}, {"B", s.B}, {"K", s.K}, {"cols", cols}, {"ties", s.ties}}),
                     dsel.get(), ref);
  }
}

// A valid selection per the contract, history in random order (consumers must not assume sorted ids).
std::vector<int32_t> random_selection(const Step& st, int Hkv, int B, int K) {
  const int T = st.T();
  std::vector<int32_t> sel(static_cast<size_t>(Hkv) * T * K, -1);
  for (int h = 0; h < Hkv; ++h)
    for (int t = 0; t < T; ++t) {
      const int local = st.pos[static_cast<size_t>(t)] / B, n = std::min(K, local + 1);
      std::vector<int32_t> hist(static_cast<size_t>(local));
      std::iota(hist.begin(), hist.end(), 0);
      std::shuffle(hist.begin(), hist.end(), rng());
      int32_t* row = &sel[(static_cast<size_t>(h) * T + static_cast<size_t>(t)) * K];
      for (int i = 0; i < n - 1; ++i) row[i] = hist[static_cast<size_t>(i)];
      row[n - 1] = local;
    }
  return sel;
}

TEST(GpuOps, MsaSparseAttentionPrefillAndDecodeMatchCpu) {
  M3_SKIP_WITHOUT_GPU();
  for (const AttnCase& c : attn_cases())
   for (bool bf16 : {false, true}) {
    Cache cache(c.Hkv, c.B, c.D, c.D, pages_needed(c.seqs, c.B), bf16);
    Step st(c.seqs, c.B, cache.pages);
    const int T = st.T(), G = c.Hq / c.Hkv;
    std::vector<float> q = rand_vec(static_cast<size_t>(T) * c.Hq * c.D), ref(q.size());
    const std::vector<int32_t> sel = random_selection(st, c.Hkv, c.B, c.K);
    const float scale = 1.f / std::sqrt(float(c.D));
    for (size_t s = 0; s < c.seqs.size(); ++s) {  // per sequence: its rows of the head-major selection
      const int n = st.n(s);
      std::vector<int32_t> ssel(static_cast<size_t>(c.Hkv) * n * c.K);
      for (int h = 0; h < c.Hkv; ++h)
        std::memcpy(&ssel[static_cast<size_t>(h) * n * c.K], &sel[(static_cast<size_t>(h) * T + static_cast<size_t>(st.begin[s])) * c.K], static_cast<size_t>(n * c.K) * 4);
      cpu::attention_sparse(&q[static_cast<size_t>(st.begin[s]) * c.Hq * c.D], n, c.Hq, &st.pos[static_cast<size_t>(st.begin[s])], cache.cpu_kv(),
                            st.tables[s].data(), ssel.data(), c.K, scale, &ref[static_cast<size_t>(st.begin[s]) * c.Hq * c.D]);
    }
    Dev<float> dq(q), dout(q.size());
    Dev<int32_t> dsel(sel);
    {
      cuda::MsaPrefill pf;
      pf.plan(st.pos, c.Hkv, G, c.D, c.B, c.K, nullptr);
      dout.poison();
      pf.run(dq.p(), dsel.p(), st.rows(), cache.gpu_kv(), scale, dout.p(), nullptr);
      pf.check(nullptr);
      expect_close("msa_prefill (query-major)", case_shape(c, T) + cache.tag(), dout.get(), ref, 1e-4);
    }
    for (bool split : {false, true}) {
      cuda::MsaDecode dc;
      dc.plan(st.pos, c.Hkv, G, c.D, c.B, c.K, split, nullptr);
      dout.poison();
      dc.run(dq.p(), dsel.p(), st.rows(), cache.gpu_kv(), scale, dout.p(), nullptr);
      dc.check(nullptr);
      expect_close(split ? "msa_decode split-K" : "msa_decode",
                   case_shape(c, T) + " splits=" + std::to_string(dc.splits()) + cache.tag(),
                   dout.get(), ref, 1e-4);
    }
  }
}

TEST(GpuOps, MsaAttentionRejectsSelectionsThatBreakTheContract) {
  M3_SKIP_WITHOUT_GPU();
  const int Hkv = 2, B = 16, D = 32, K = 4, G = 4;
  Cache cache(Hkv, B, D, D, 40);
  Step st({{300, 2}}, B, cache.pages);
  std::vector<float> q = rand_vec(static_cast<size_t>(st.T()) * Hkv * G * D);
  Dev<float> dq(q), dout(q.size());
  auto run_with = [&](std::vector<int32_t> sel) {
    Dev<int32_t> dsel(sel);
    cuda::MsaDecode dc;
    dc.plan(st.pos, Hkv, G, D, B, K, false, nullptr);
    dc.run(dq.p(), dsel.p(), st.rows(), cache.gpu_kv(), 0.2f, dout.p(), nullptr);
    dc.check(nullptr);
  };
  std::vector<int32_t> good = random_selection(st, Hkv, B, K);
  EXPECT_NO_THROW(run_with(good));
  auto dup = good;
  dup[1] = dup[0];  // duplicate history block
  EXPECT_THROW(run_with(dup), Error);
  auto not_last = good;
  std::swap(not_last[0], not_last[K - 1]);  // local block not in the last valid slot
  EXPECT_THROW(run_with(not_last), Error);
  auto future = good;
  future[0] = 300 / B + 1;  // a block after the local one
  EXPECT_THROW(run_with(future), Error);
}

// docs/MSA_CONTRACT.md §6: graph replay output must be bitwise equal to eager output. The decode step's run() calls
// (indexer scores → top-k → page list + paged GQA + split merge) are captured once and replayed into poisoned buffers.
TEST(GpuOps, MsaDecodeStepReplayedFromACudaGraphIsBitwiseEqualToEager) {
  M3_SKIP_WITHOUT_GPU();
  const int hq = 64, hkv = 4, d = 128, b = 128, k = 16;
  const std::vector<std::pair<int, int>> seqs = {{100, 1}, {2048, 1}, {9000, 1}, {33000, 1}, {20000, 8}};
  Cache cache(hkv, b, d, d, pages_needed(seqs, b));
  Step st(seqs, b, cache.pages);
  const int T = st.T();
  Dev<float> dq(rand_vec(static_cast<size_t>(T) * hq * d)), diq(rand_vec(static_cast<size_t>(T) * hkv * d));
  cudaStream_t s = nullptr;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::MsaIndexer ix;
  ix.plan(st.pos, st.row_seq, hkv, b, true, s);
  cuda::MsaDecode dc;
  dc.plan(st.pos, hkv, hq / hkv, d, b, k, true, s);
  Dev<float> scores(static_cast<size_t>(hkv) * T * ix.max_cols()), out(static_cast<size_t>(T) * hq * d);
  Dev<int32_t> sel(static_cast<size_t>(hkv) * T * k);
  const float scale = 1.f / std::sqrt(float(d));
  auto step = [&] {
    ix.run(diq.p(), cache.gpu_ik(), st.rows(), scores.p(), s);
    cuda::msa_topk(scores.p(), T, hkv, st.dpos.p(), b, ix.max_cols(), k, sel.p(), s);
    dc.run(dq.p(), sel.p(), st.rows(), cache.gpu_kv(), scale, out.p(), s);
  };
  step();
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  dc.check(s);
  const std::vector<float> eager_out = out.get(), eager_scores = scores.get();
  const std::vector<int32_t> eager_sel = sel.get();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  M3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step();
  M3_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  M3_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    out.poison(), scores.poison(), sel.poison(0x7F);
    M3_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets ran on the legacy stream, s does not wait for it
    M3_CUDA_CHECK(cudaGraphLaunch(exec, s));
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<float> o = out.get(), sc = scores.get();
    const std::vector<int32_t> se = sel.get();
    const bool same = std::memcmp(o.data(), eager_out.data(), o.size() * 4) == 0 &&
                      std::memcmp(sc.data(), eager_scores.data(), sc.size() * 4) == 0 && se == eager_sel;
    std::printf("[gpu-op] %-28s %-44s replay %d bitwise equal: %s\n", "msa decode step (graph)",
                fmt_shape({{"T", T}, {"splits", dc.splits()}}).c_str(), rep, same ? "yes" : "no");
    EXPECT_TRUE(same) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// Sampling: tests/gpu/gpu_sampling_test.cpp (DeviceSampler against the CPU sampler).

}  // namespace
}  // namespace m3
