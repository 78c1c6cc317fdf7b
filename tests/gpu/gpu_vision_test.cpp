// The vision tower on CUDA (issue 12 item 4; docs/MEDIA.md "Vision tower on CUDA"): every op of
// backend/cuda/vision_ops.cuh against its CPU twin (backend/cpu/vision_ops.cpp; the q/k/v RoPE in both variants),
// the whole tower (CudaVisionModel) against the CPU VisionModel and HF's golden stages on the tiny_vl fixture with two
// images of different sizes in one call, the official variant's tower against the CPU twin stage by stage (images and
// a video of two segments), and the CUDA executor placing image features in the prompt against the CPU forward and
// HF's logits.
//
// Tolerances (relative to the largest |reference| of the compared row or tensor): bf16 has an 8-bit significand, so
// one rounding moves a value by ≤ 2^-9 ≈ 2e-3 of itself. Ops with a bf16 output: 4e-3 (one rounding, plus fp32
// noise). Attention: the probabilities are rounded to bf16 before P·V and the output once more: 1.5e-2 (the error
// of Σ p·v is ≤ 2^-9·Σ|p·v| ≤ 2^-9·max|v|, and max|out| ≥ ~0.2·max|v| with these inputs). The tower: every GEMM
// rounds its input to bf16 (≈ 1e-3 rms each, ~10 GEMMs in sequence, adding in quadrature), so a few 1e-3 row-relative
// is expected; 3e-2 is the bound. Every bug these tests target (a wrong mask, RoPE axis, item boundary or stride)
// moves results by O(1) relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/vision_ops.cuh"
#include "base/dtype.h"
#include "base/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/cuda_executor.h"
#include "model/cuda_vision_model.h"
#include "model/m3_model.h"
#include "model/m3_weights.h"
#include "model/vision_model.h"
#include "gpu_test_util.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using gpu_test::Dev;
using gpu_test::expect_close;
using gpu_test::rand_vec;

fs::path fixture() {
  const char* env = std::getenv("M3_SOURCE_DIR");
  return fs::path(env && *env ? env : M3_SOURCE_DIR) / "tests/golden/fixtures/tiny_vl";
}

std::vector<float> bf16_floats(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
  return b;
}

// Max over rows of max|a − b| / max|b| (b: the reference).
double row_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t cols) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || cols <= 0) return INFINITY;
  double worst = 0;
  for (size_t r = 0; r * size_t(cols) < a.size(); ++r) {
    double m = 0, ref = 0;
    for (size_t i = r * size_t(cols); i < (r + 1) * size_t(cols); ++i) {
      m = std::max(m, std::isfinite(a[i]) ? double(std::fabs(a[i] - b[i])) : INFINITY);
      ref = std::max(ref, double(std::fabs(b[i])));
    }
    worst = std::max(worst, ref > 0 ? m / ref : m);
  }
  return worst;
}

std::vector<float> f32(const SafeTensors& st, const std::string& n) { return st.read_f32(n, st.get(n).shape); }
std::array<int, 3> grid(const SafeTensors& st, const std::string& n) {
  const TensorRef& t = st.get(n);
  std::vector<int32_t> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return {v[0], v[1], v[2]};
}

TEST(GpuVisionOps, LayerNormMatchesCpuTwinInFp32AndBf16) {
  M3_SKIP_WITHOUT_GPU();
  for (int64_t D : {64, 1280}) {
    const int64_t rows = 37;
    auto x = rand_vec(size_t(rows * D));
    for (auto& v : x) v += 3.f;  // |mean| ≫ σ: the centred variance matters
    const auto w = rand_vec(size_t(D)), b = rand_vec(size_t(D));
    std::vector<float> ref(x.size());
    cpu::layer_norm(x.data(), rows, D, w.data(), b.data(), 1e-5f, ref.data());
    Dev<float> dx(x), dw(w), db(b), dy(x.size());
    Dev<uint16_t> dyb(x.size());
    dy.poison(), dyb.poison();
    cuda::vision_layer_norm(dx.p(), rows, D, dw.p(), db.p(), 1e-5f, dy.p(), dyb.p(), nullptr);
    const std::string shape = "[" + std::to_string(rows) + ", " + std::to_string(D) + "]";
    expect_close("vision_layer_norm f32", shape, dy.get(), ref, 2e-5);
    expect_close("vision_layer_norm bf16", shape, bf16_floats(dyb.get()), ref, 4e-3);
    // In place on the fp32 stream (y = x), as pre_layrnorm runs.
    cuda::vision_layer_norm(dx.p(), rows, D, dw.p(), db.p(), 1e-5f, dx.p(), nullptr, nullptr);
    expect_close("vision_layer_norm in place", shape, dx.get(), ref, 2e-5);
  }
}

TEST(GpuVisionOps, BiasGeluMatchesCpuTwin) {
  M3_SKIP_WITHOUT_GPU();
  const int64_t rows = 19, N = 300;
  auto y = rand_vec(size_t(rows * N), 0.05f, 4.f);
  const auto b = rand_vec(size_t(N));
  std::vector<float> ref = y;
  cpu::add_bias(ref.data(), rows, N, b.data());
  cpu::gelu_erf(ref.data(), rows * N);
  Dev<float> dy(y), db(b);
  Dev<uint16_t> dyb(y.size());
  dyb.poison();
  cuda::vision_bias_act(dy.p(), rows, N, db.p(), true, true, dyb.p(), nullptr);
  expect_close("vision_bias_act gelu f32", "[19, 300]", dy.get(), ref, 1e-6);
  expect_close("vision_bias_act gelu bf16", "[19, 300]", bf16_floats(dyb.get()), ref, 4e-3);
  // Bias only, fp32 in place (the residual's bias).
  std::vector<float> ref2 = y;
  cpu::add_bias(ref2.data(), rows, N, b.data());
  dy.set(y);
  cuda::vision_bias_act(dy.p(), rows, N, db.p(), false, true, nullptr, nullptr);
  expect_close("vision_bias_act bias", "[19, 300]", dy.get(), ref2, 1e-7);
}

// Both rotary variants (VitRope): hf517 against cpu::vision_rope_hf517, official against cpu::vision_rope_official
// (dims 6·(hd/6).. unrotated: 78, 79 at hd 80), with VisionModel::layout's positions for a 2-group video, a 6-group
// one (two segments: t restarts under official), a tall image (patch rows up to 63: large angles) and a wide 1×2×58.
TEST(GpuVisionOps, QkvRopeMatchesCpuTwinForBothVariants) {
  M3_SKIP_WITHOUT_GPU();
  struct Shape {
    int H, hd;
  };
  const std::array<int, 3> grids[] = {{2, 4, 6}, {6, 2, 4}, {1, 64, 4}, {1, 2, 58}};
  for (VitRope rope : {VitRope::kHf517, VitRope::kOfficial}) {
    VisionConfig vc;
    vc.rope = rope;
    const VisionModel::Layout lay = VisionModel::layout(vc, grids);
    const cuda::VisionRope crope = rope == VitRope::kHf517 ? cuda::VisionRope::kHf517 : cuda::VisionRope::kOfficial;
    for (Shape sh : {Shape{4, 16}, Shape{16, 80}}) {
      const int H = sh.H, hd = sh.hd;
      const int64_t D = int64_t(H) * hd, R = int64_t(lay.t.size());
      const auto qkv = rand_vec(size_t(R * 3 * D)), bias = rand_vec(size_t(3 * D));
      std::vector<float> full = qkv, q(size_t(R * D)), k(size_t(R * D)), v(size_t(R * D));
      cpu::add_bias(full.data(), R, 3 * D, bias.data());
      for (int64_t r = 0; r < R; ++r) {
        std::copy_n(&full[size_t(r * 3 * D)], D, &q[size_t(r * D)]);
        std::copy_n(&full[size_t(r * 3 * D + D)], D, &k[size_t(r * D)]);
        std::copy_n(&full[size_t(r * 3 * D + 2 * D)], D, &v[size_t(r * D)]);
      }
      for (float* x : {q.data(), k.data()}) {
        if (rope == VitRope::kHf517)
          cpu::vision_rope_hf517(x, R, H, hd, lay.t.data(), lay.h.data(), 10000.0);
        else
          cpu::vision_rope_official(x, R, H, hd, lay.t.data(), lay.h.data(), lay.w.data(), 10000.0);
      }
      Dev<float> dqkv(qkv), dbias(bias), dinv(cuda::vision_rope_inv_freq(hd, 10000.0, crope));
      Dev<int32_t> dpt(lay.t), dph(lay.h), dpw(lay.w);
      Dev<uint16_t> dq(q.size()), dk(k.size()), dv(v.size());
      dq.poison(), dk.poison(), dv.poison();
      cuda::vision_qkv_rope(dqkv.p(), dbias.p(), R, H, hd, crope, dpt.p(), dph.p(), dpw.p(), dinv.p(), dq.p(),
                            dk.p(), dv.p(), nullptr);
      const std::string shape = std::string(vit_rope_name(rope)) + " R " + std::to_string(R) + " H " +
                                std::to_string(H) + " hd " + std::to_string(hd);
      expect_close("vision_qkv_rope q", shape, bf16_floats(dq.get()), q, 4e-3);
      expect_close("vision_qkv_rope k", shape, bf16_floats(dk.get()), k, 4e-3);
      expect_close("vision_qkv_rope v", shape, bf16_floats(dv.get()), v, 4e-3);
    }
  }
}

TEST(GpuVisionOps, VarlenAttentionMatchesCpuPerItemAndNeverCrossesItems) {
  M3_SKIP_WITHOUT_GPU();
  struct Shape {
    int H, hd;
  };
  const std::vector<int64_t> lens = {100, 37, 200, 64};  // partial tiles, one item below a tile, one exact tile
  std::vector<int64_t> begin = {0};
  for (int64_t n : lens) begin.push_back(begin.back() + n);
  const int64_t R = begin.back();
  for (Shape sh : {Shape{4, 16}, Shape{16, 80}, Shape{2, 64}, Shape{1, 128}}) {
    const int H = sh.H, hd = sh.hd;
    const int64_t D = int64_t(H) * hd;
    // bf16-exact inputs, q scaled up so the softmax is far from uniform.
    auto q = rand_vec(size_t(R * D), 0.05f, 3.f), k = rand_vec(size_t(R * D)), v = rand_vec(size_t(R * D));
    for (auto* a : {&q, &k, &v})
      for (auto& x : *a) x = round_to_bf16(x);
    const float scale = 1.f / std::sqrt(float(hd));
    std::vector<float> ref(size_t(R * D));
    for (size_t i = 0; i + 1 < begin.size(); ++i) {
      const int64_t off = begin[i] * D;
      cpu::attention_full(q.data() + off, k.data() + off, v.data() + off, begin[i + 1] - begin[i], H, hd, scale,
                          ref.data() + off);
    }
    const auto tiles = cuda::vision_attention_tiles(begin);
    Dev<uint16_t> dq(to_bf16(q)), dk(to_bf16(k)), dv(to_bf16(v)), dout(size_t(R * D));
    Dev<int32_t> dt(tiles);
    dout.poison();
    cuda::vision_attention(dq.p(), dk.p(), dv.p(), dt.p(), int(tiles.size() / 3), H, hd, scale, dout.p(), nullptr);
    const std::string shape = "items 100+37+200+64 H " + std::to_string(H) + " hd " + std::to_string(hd);
    const auto got = bf16_floats(dout.get());
    expect_close("vision_attention", shape, got, ref, 1.5e-2);
    // Attention over all R rows as one sequence (the mistake the block-diagonal mask prevents) is far off.
    std::vector<float> joined(size_t(R * D));
    cpu::attention_full(q.data(), k.data(), v.data(), R, H, hd, scale, joined.data());
    EXPECT_GT(gpu_test::compare(joined, ref).rel, 0.1) << "the items must not see each other";
  }
  Dev<uint16_t> d1(size_t(64 * 24));
  Dev<int32_t> dt(std::vector<int32_t>{0, 4, 0});
  EXPECT_THROW(cuda::vision_attention(d1.p(), d1.p(), d1.p(), dt.p(), 1, 1, 24, 1.f, d1.p(), nullptr), Error)
      << "head dim 24 is rejected, not run";
}

TEST(GpuVisionTower, TinyVlTwoImageSizesInOneCallMatchCpuAndHf) {
  M3_SKIP_WITHOUT_GPU();
  VisionModel cpu = VisionModel::load(fixture().string());
  auto gpu = CudaVisionModel::load(fixture().string());
  const VisionConfig& c = cpu.config();
  const int64_t D = c.hidden_size, Ht = c.text_hidden_size;
  SafeTensors gold = SafeTensors::open((fixture() / "golden.safetensors").string());
  const auto pa = f32(gold, "pixel_values"), pb = f32(gold, "b.pixel_values");
  const auto ga = grid(gold, "image_grid_thw"), gb = grid(gold, "b.image_grid_thw");  // 1×6×8, 1×10×4

  // Every stage of image A against HF.
  VisionTrace tr;
  const VisionModel::Item a_only[] = {{pa, ga}};
  const auto emb_a = gpu->encode_batch(a_only, &tr);
  const double e_patch = row_rel(tr.patch_embed, f32(gold, "vision.patch_embed"), D);
  const double e_pre = row_rel(tr.pre_ln, f32(gold, "vision.pre_ln"), D);
  std::printf("[gpu-vision] tiny_vl image A vs HF: patch embed %.3e  pre-LN %.3e", e_patch, e_pre);
  EXPECT_LT(e_patch, 1e-2);
  EXPECT_LT(e_pre, 1e-2);
  for (int l = 0; l < c.num_layers; ++l) {
    const double e = row_rel(tr.layers[size_t(l)], f32(gold, "vision.layer." + std::to_string(l)), D);
    std::printf("  layer %d %.3e", l, e);
    EXPECT_LT(e, 3e-2) << "layer " << l;
  }
  const double e_proj = row_rel(tr.projected, f32(gold, "vision.projected"), Ht);
  const double e_emb = row_rel(emb_a, f32(gold, "vision.embeds"), Ht);
  std::printf("  projector %.3e  embeddings %.3e\n", e_proj, e_emb);
  EXPECT_LT(e_proj, 3e-2);
  EXPECT_LT(e_emb, 3e-2);

  // B, A, B in one call: each block against the CPU batch and HF.
  const VisionModel::Item items[] = {{pb, gb}, {pa, ga}, {pb, gb}};
  const auto got = gpu->encode_batch(items);
  const auto want = cpu.encode_batch(items);
  ASSERT_EQ(got.size(), size_t((10 + 12 + 10) * Ht));
  const double e_cpu = row_rel(got, want, Ht);
  auto block = [&](const std::vector<float>& v, int64_t r0, int64_t n) {
    return std::vector<float>(v.begin() + r0 * Ht, v.begin() + (r0 + n) * Ht);
  };
  const double e_b = row_rel(block(got, 0, 10), f32(gold, "b.embeds"), Ht);
  const double e_a = row_rel(block(got, 10, 12), f32(gold, "vision.embeds"), Ht);
  const double e_b2 = row_rel(block(got, 22, 10), f32(gold, "b.embeds"), Ht);
  const double e_sep = row_rel(block(got, 10, 12), emb_a, Ht);
  std::printf("[gpu-vision] tiny_vl B+A+B in one call: vs CPU batch %.3e; vs HF: B %.3e A %.3e B %.3e; A batched vs "
              "alone %.3e\n", e_cpu, e_b, e_a, e_b2, e_sep);
  EXPECT_LT(e_cpu, 3e-2);
  EXPECT_LT(e_b, 3e-2);
  EXPECT_LT(e_a, 3e-2);
  EXPECT_LT(e_b2, 3e-2);
  EXPECT_LT(e_sep, 1e-2) << "an item's features do not depend on its neighbours in the call";

  // Bad input: a clear error before any GPU work; empty input: empty output.
  const VisionModel::Item bad_count[] = {{std::span<const float>(pa).subspan(1), ga}};
  EXPECT_THROW(gpu->encode_batch(bad_count), Error);
  const VisionModel::Item odd_grid[] = {{std::span<const float>(pa).subspan(0, size_t(6 * 7) * 1176), {1, 6, 7}}};
  EXPECT_THROW(gpu->encode_batch(odd_grid), Error);
  EXPECT_TRUE(gpu->encode_batch({}).empty());
}

// The official variant through the whole tower, CudaVisionModel against VisionModel stage by stage: tiny_vl loaded
// with the override (head dim 16: 12 dims rotated) and a random 2-head tower at M3's head dim 80, each on image A (or
// a 6×8 image), a 6-group video (two attention segments, t restarting) and image B in one call; then the video
// alone against its two segments encoded as separate videos (per-segment scope on the GPU too).
TEST(GpuVisionTower, OfficialRopeMatchesCpuTwinOnImagesAndAVideo) {
  M3_SKIP_WITHOUT_GPU();
  auto check = [](const std::string& name, const VisionModel& cpu, CudaVisionModel& gpu,
                  std::span<const VisionModel::Item> items, std::span<const float> video, int64_t per_group) {
    const VisionConfig& c = cpu.config();
    ASSERT_EQ(c.rope, VitRope::kOfficial);
    ASSERT_EQ(gpu.config().rope, VitRope::kOfficial);
    const int64_t D = c.hidden_size, Ht = c.text_hidden_size;
    VisionTrace tc, tg;
    const auto want = cpu.encode_batch(items, &tc);
    const auto got = gpu.encode_batch(items, &tg);
    const double e_patch = row_rel(tg.patch_embed, tc.patch_embed, D);
    std::printf("[gpu-vision] %s official: patch embed %.3e", name.c_str(), e_patch);
    EXPECT_LT(e_patch, 1e-2) << name;
    ASSERT_EQ(tg.layers.size(), tc.layers.size());
    for (size_t l = 0; l < tc.layers.size(); ++l) {
      const double e = row_rel(tg.layers[l], tc.layers[l], D);
      std::printf("  layer %zu %.3e", l, e);
      EXPECT_LT(e, 3e-2) << name << " layer " << l;
    }
    const double e_proj = row_rel(tg.projected, tc.projected, Ht), e_out = row_rel(got, want, Ht);
    std::printf("  projector %.3e  embeddings %.3e\n", e_proj, e_out);
    EXPECT_LT(e_proj, 3e-2) << name;
    EXPECT_LT(e_out, 3e-2) << name;
    // The 6-group video = its first 4 groups + its last 2 as separate videos.
    const std::array<int, 3> g6{6, 2, 4}, g4{4, 2, 4}, g2{2, 2, 4};
    const VisionModel::Item whole[] = {{video, g6}};
    const VisionModel::Item parts[] = {{video.subspan(0, size_t(4 * per_group * 1176)), g4},
                                       {video.subspan(size_t(4 * per_group * 1176)), g2}};
    const double e_seg = row_rel(gpu.encode_batch(whole), gpu.encode_batch(parts), Ht);
    std::printf("[gpu-vision] %s official: 6-group video vs its segments as two videos %.3e\n", name.c_str(), e_seg);
    EXPECT_LT(e_seg, 1e-2) << name << ": attention per ≤ 4-group segment, t from 0 in each";
  };
  const int64_t per_group = 8;  // grid 2×4 per temporal group
  const auto video = rand_vec(size_t(6 * per_group * 1176));

  // tiny_vl with the official variant (the fixture pins hf517).
  {
    VisionModel cpu = VisionModel::load(fixture().string(), VitRope::kOfficial);
    auto gpu = CudaVisionModel::load(fixture().string(), VitRope::kOfficial);
    SafeTensors gold = SafeTensors::open((fixture() / "golden.safetensors").string());
    const auto pa = f32(gold, "pixel_values"), pb = f32(gold, "b.pixel_values");
    const VisionModel::Item items[] = {{pa, grid(gold, "image_grid_thw")},
                                       {video, {6, 2, 4}},
                                       {pb, grid(gold, "b.image_grid_thw")}};
    check("tiny_vl (hd 16)", cpu, *gpu, items, video, per_group);
  }
  // Head dim 80 (M3's): 2 heads, 2 layers, random weights (bf16-exact, so both towers start from the same values).
  {
    VisionConfig c;
    c.hidden_size = 160, c.num_heads = 2, c.intermediate_size = 128, c.num_layers = 2;
    c.projector_hidden_size = 64, c.text_hidden_size = 32;
    c.rope = VitRope::kOfficial;
    const int64_t D = c.hidden_size, I = c.intermediate_size, P = c.projector_hidden_size, Ht = c.text_hidden_size,
                  K = c.patch_dim();
    auto mat = [](int64_t rows, int64_t cols, float gain = 1.f) {
      auto v = rand_vec(size_t(rows * cols), 0.f, gain / std::sqrt(float(cols)));
      for (auto& x : v) x = round_to_bf16(x);
      return v;
    };
    auto ln = [](int64_t n) {
      auto v = rand_vec(size_t(n), 0.f, 0.2f);
      for (auto& x : v) x = 1.f + x;
      return v;
    };
    auto bias = [](int64_t n) { return rand_vec(size_t(n), 0.f, 0.05f); };
    VisionWeights w;
    w.patch_embed = mat(D, K), w.pre_ln_w = ln(D), w.pre_ln_b = bias(D);
    for (int l = 0; l < c.num_layers; ++l) {
      VisionLayerWeights L;
      L.ln1_w = ln(D), L.ln1_b = bias(D), L.ln2_w = ln(D), L.ln2_b = bias(D);
      L.wqkv = mat(3 * D, D), L.bqkv = bias(3 * D), L.wo = mat(D, D), L.bo = bias(D);
      L.fc1 = mat(I, D), L.fc1_b = bias(I), L.fc2 = mat(D, I), L.fc2_b = bias(D);
      w.layers.push_back(std::move(L));
    }
    w.proj1 = mat(P, D), w.proj1_b = bias(P), w.proj2 = mat(Ht, P), w.proj2_b = bias(Ht);
    w.merge1 = mat(P, 4 * Ht), w.merge1_b = bias(P), w.merge2 = mat(Ht, P), w.merge2_b = bias(Ht);
    CudaVisionModel gpu(c, w);
    const VisionModel cpu(c, std::move(w));
    const auto img = rand_vec(size_t(48 * K)), tall = rand_vec(size_t(40 * K));
    const VisionModel::Item items[] = {{img, {1, 6, 8}}, {video, {6, 2, 4}}, {tall, {1, 10, 4}}};
    check("random tower (hd 80)", cpu, gpu, items, video, per_group);
  }
}

// The CUDA executor puts image features on the slot rows (SeqInput::media_embeds) as the CPU forward does: fp32
// weights, so the comparison is tight: 5e-4 row-relative against HF (the CPU forward reaches 2.8e-6; fp32 GPU
// kernels sum in other orders), and chunked prefill against one shot.
TEST(GpuVisionTower, CudaExecutorPlacesImageFeaturesLikeTheCpuForward) {
  if (!CudaExecutor::available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixture().string();
  const M3Config c = load_m3_config(dir + "/config.json");
  SafeTensors st = SafeTensors::open(dir);
  const M3Weights w = M3Weights::load(c, st);
  SafeTensors gold = SafeTensors::open((fixture() / "golden.safetensors").string());
  const TensorRef& idt = gold.get("input_ids");
  std::vector<int32_t> ids(size_t(idt.numel()));
  std::memcpy(ids.data(), idt.data, idt.nbytes);
  VisionModel vm = VisionModel::load(dir);
  const std::vector<float> emb = vm.encode(f32(gold, "pixel_values"), grid(gold, "image_grid_thw"));
  const int64_t T = int64_t(ids.size()), V = c.vocab_size, H = c.hidden_size;
  CudaExecutorOptions opt;
  opt.bf16_weights = false;
  auto run = [&](std::span<const float> media, int64_t chunk) {
    CudaExecutor gpu(c, w, 8, opt);
    const std::vector<int32_t> pages = {0, 1, 2, 3};
    std::vector<float> logits;
    size_t used = 0;
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t len = std::min(chunk, T - s);
      const size_t n = size_t(std::count(ids.begin() + s, ids.begin() + s + len, c.image_token_id));
      SeqInput in{std::span<const int32_t>(ids.data() + s, size_t(len)), s, pages, true,
                  media.empty() ? std::span<const float>() : media.subspan(used * size_t(H), n * size_t(H))};
      used += n;
      auto out = gpu.forward(std::span<const SeqInput>(&in, 1));
      logits.insert(logits.end(), out[0].begin(), out[0].end());
    }
    return logits;
  };
  const auto got = run(emb, T);
  const double e_hf = row_rel(got, f32(gold, "logits"), V);
  const double e_chunk = row_rel(run(emb, 7), got, V);
  const double e_plain = row_rel(run({}, T), got, V);
  std::printf("[gpu-vision] CUDA executor with image A: logits vs HF %.3e; chunks of 7 vs one shot %.3e; without the "
              "features %.3e\n", e_hf, e_chunk, e_plain);
  EXPECT_LT(e_hf, 5e-4);
  EXPECT_LT(e_chunk, 5e-4);
  EXPECT_GT(e_plain, 1e-2) << "the features must change the logits";
  // A media row count that does not match the slots is an error, not a silent misplacement.
  CudaExecutor gpu(c, w, 8, opt);
  const std::vector<int32_t> pages = {0, 1, 2, 3};
  SeqInput bad{std::span<const int32_t>(ids), 0, pages, false,
               std::span<const float>(emb).subspan(0, emb.size() - size_t(H))};
  EXPECT_THROW(gpu.forward(std::span<const SeqInput>(&bad, 1)), Error);
}

}  // namespace
}  // namespace m3
