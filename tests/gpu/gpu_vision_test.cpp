// The vision tower on CUDA (issue 12 item 4; docs/MEDIA.md "Vision tower on CUDA"): every op of
// backend/cuda/vision_ops.cuh against its CPU twin (backend/cpu/vision_ops.cpp), the whole tower (CudaVisionModel)
// against the CPU VisionModel and HF's golden stages on the tiny_vl fixture with two images of different sizes in one
// call, and the CUDA executor placing image features in the prompt against the CPU forward and HF's logits.
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

TEST(GpuVisionOps, QkvRopeMatchesCpuTwinOnTwoItems) {
  M3_SKIP_WITHOUT_GPU();
  struct Shape {
    int H, hd;
  };
  for (Shape sh : {Shape{4, 16}, Shape{16, 80}}) {
    const int H = sh.H, hd = sh.hd;
    const int64_t D = int64_t(H) * hd;
    // Two items: a 2-frame video group grid and a tall image (patch rows up to 63: large angles).
    std::vector<int32_t> pa, pb, t, h, w;
    for (std::array<int, 3> g : {std::array<int, 3>{2, 4, 6}, std::array<int, 3>{1, 64, 4}}) {
      VisionModel::patch_positions(g, 2, t, h, w);
      pa.insert(pa.end(), t.begin(), t.end());
      pb.insert(pb.end(), h.begin(), h.end());
    }
    const int64_t R = int64_t(pa.size());
    const auto qkv = rand_vec(size_t(R * 3 * D)), bias = rand_vec(size_t(3 * D));
    std::vector<float> full = qkv, q(size_t(R * D)), k(size_t(R * D)), v(size_t(R * D));
    cpu::add_bias(full.data(), R, 3 * D, bias.data());
    for (int64_t r = 0; r < R; ++r) {
      std::copy_n(&full[size_t(r * 3 * D)], D, &q[size_t(r * D)]);
      std::copy_n(&full[size_t(r * 3 * D + D)], D, &k[size_t(r * D)]);
      std::copy_n(&full[size_t(r * 3 * D + 2 * D)], D, &v[size_t(r * D)]);
    }
    cpu::vision_rope_hf517(q.data(), R, H, hd, pa.data(), pb.data(), 10000.0);
    cpu::vision_rope_hf517(k.data(), R, H, hd, pa.data(), pb.data(), 10000.0);
    Dev<float> dqkv(qkv), dbias(bias), dinv(cuda::vision_rope_inv_freq(hd, 10000.0));
    Dev<int32_t> dpa(pa), dpb(pb);
    Dev<uint16_t> dq(q.size()), dk(k.size()), dv(v.size());
    dq.poison(), dk.poison(), dv.poison();
    cuda::vision_qkv_rope(dqkv.p(), dbias.p(), R, H, hd, dpa.p(), dpb.p(), dinv.p(), dq.p(), dk.p(), dv.p(), nullptr);
    const std::string shape = "R " + std::to_string(R) + " H " + std::to_string(H) + " hd " + std::to_string(hd);
    expect_close("vision_qkv_rope q", shape, bf16_floats(dq.get()), q, 4e-3);
    expect_close("vision_qkv_rope k", shape, bf16_floats(dk.get()), k, 4e-3);
    expect_close("vision_qkv_rope v", shape, bf16_floats(dv.get()), v, 4e-3);
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
