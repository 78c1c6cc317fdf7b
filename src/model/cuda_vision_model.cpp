#include "model/cuda_vision_model.h"

#include <cmath>
#include <filesystem>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/vision_ops.cuh"
#include "backend/cuda/weight_convert.cuh"
#include "base/error.h"
#include "io/safetensors.h"

namespace m3 {

using cuda::DeviceBuffer;

namespace {

struct DevLayer {
  DeviceBuffer<uint16_t> wqkv, wo, fc1, fc2;  // bf16 [3D, D], [D, D], [I, D], [D, I]
  DeviceBuffer<float> ln1_w, ln1_b, ln2_w, ln2_b, bqkv, bo, fc1_b, fc2_b;
};

void check_grid(const VisionConfig& c, const std::array<int, 3>& g) {
  M3_CHECK(g[0] > 0 && g[1] > 0 && g[2] > 0 && g[1] % c.merge_size == 0 && g[2] % c.merge_size == 0,
           "vision: grid ({}, {}, {}) must be positive with h and w multiples of {}", g[0], g[1], g[2], c.merge_size);
  M3_CHECK(int64_t(g[0]) * g[1] * g[2] < (int64_t(1) << 30), "vision: grid ({}, {}, {}) is too large", g[0], g[1],
           g[2]);
}

}  // namespace

struct CudaVisionModel::Impl {
  VisionConfig c;
  cudaStream_t s = nullptr;
  cuda::Gemm gemm;
  // Weights.
  DeviceBuffer<uint16_t> patch_embed, proj1, proj2, merge1, merge2;
  DeviceBuffer<float> pre_ln_w, pre_ln_b, proj1_b, proj2_b, merge1_b, merge2_b, inv_freq;
  std::vector<DevLayer> layers;
  DeviceBuffer<float> staging;  // fp32 weights on their way to bf16
  // Per call: positions, attention tiles, activations.
  std::vector<int32_t> h_pos, h_tiles;  // h_pos: [3R] (temporal group, patch row, patch column)
  DeviceBuffer<int32_t> d_pos, d_tiles;
  DeviceBuffer<float> px, x, qkv, f, p2, m1, out;
  DeviceBuffer<uint16_t> xnb, qb, kb, vb, attnb, fb, p2b;

  explicit Impl(VisionConfig cfg) : c(std::move(cfg)) {
    c.validate();
    M3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~Impl() {
    if (s) cudaStreamDestroy(s);
  }

  void up_f32(DeviceBuffer<float>& d, const std::vector<float>& h, size_t n) {
    M3_CHECK(h.size() == n, "vision weights: {} values where {} are expected", h.size(), n);
    d.grow(n);
    M3_CUDA_CHECK(cudaMemcpyAsync(d.get(), h.data(), n * 4, cudaMemcpyHostToDevice, s));
  }
  void up_bf16(DeviceBuffer<uint16_t>& d, const std::vector<float>& h, size_t n) {
    up_f32(staging, h, n);
    d.grow(n);
    cuda::f32_to_bf16(staging.get(), int64_t(n), d.get(), s);
    M3_CUDA_CHECK(cudaStreamSynchronize(s));  // staging is reused by the next tensor
  }

  void upload(const VisionWeights& w) {
    const size_t D = size_t(c.hidden_size), I = size_t(c.intermediate_size), P = size_t(c.projector_hidden_size),
                 Ht = size_t(c.text_hidden_size), K = size_t(c.patch_dim());
    M3_CHECK(w.layers.size() == size_t(c.num_layers), "vision weights: {} layers, config says {}", w.layers.size(),
             c.num_layers);
    up_bf16(patch_embed, w.patch_embed, D * K);
    up_f32(pre_ln_w, w.pre_ln_w, D), up_f32(pre_ln_b, w.pre_ln_b, D);
    layers.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const VisionLayerWeights& L = w.layers[l];
      DevLayer& d = layers[l];
      up_f32(d.ln1_w, L.ln1_w, D), up_f32(d.ln1_b, L.ln1_b, D), up_f32(d.ln2_w, L.ln2_w, D),
          up_f32(d.ln2_b, L.ln2_b, D);
      up_bf16(d.wqkv, L.wqkv, 3 * D * D), up_f32(d.bqkv, L.bqkv, 3 * D);
      up_bf16(d.wo, L.wo, D * D), up_f32(d.bo, L.bo, D);
      up_bf16(d.fc1, L.fc1, I * D), up_f32(d.fc1_b, L.fc1_b, I);
      up_bf16(d.fc2, L.fc2, D * I), up_f32(d.fc2_b, L.fc2_b, D);
    }
    up_bf16(proj1, w.proj1, P * D), up_f32(proj1_b, w.proj1_b, P);
    up_bf16(proj2, w.proj2, Ht * P), up_f32(proj2_b, w.proj2_b, Ht);
    up_bf16(merge1, w.merge1, P * 4 * Ht), up_f32(merge1_b, w.merge1_b, P);
    up_bf16(merge2, w.merge2, Ht * P), up_f32(merge2_b, w.merge2_b, Ht);
    staging.reset();
    finish_setup();
  }

  cuda::VisionRope rope() const {
    return c.rope == VitRope::kHf517 ? cuda::VisionRope::kHf517 : cuda::VisionRope::kOfficial;
  }

  void finish_setup() {
    const auto inv = cuda::vision_rope_inv_freq(c.head_dim(), c.rope_theta, rope());
    up_f32(inv_freq, inv, inv.size());
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void random(uint64_t seed) {
    const int64_t D = c.hidden_size, I = c.intermediate_size, P = c.projector_hidden_size, Ht = c.text_hidden_size,
                  K = c.patch_dim();
    uint64_t key = seed * 0x9E3779B97F4A7C15ull;
    auto mat = [&](DeviceBuffer<uint16_t>& d, int64_t rows, int64_t cols) {
      d.grow(size_t(rows * cols));
      cuda::fill_counter_uniform(d.get(), true, rows * cols, ++key, 1.0f / std::sqrt(float(cols)), s);
    };
    auto vec = [&](DeviceBuffer<float>& d, int64_t n, float scale) {
      d.grow(size_t(n));
      cuda::fill_counter_uniform(d.get(), false, n, ++key, scale, s);
    };
    mat(patch_embed, D, K), vec(pre_ln_w, D, 1.f), vec(pre_ln_b, D, 0.1f);
    layers.resize(size_t(c.num_layers));
    for (DevLayer& d : layers) {
      vec(d.ln1_w, D, 1.f), vec(d.ln1_b, D, 0.1f), vec(d.ln2_w, D, 1.f), vec(d.ln2_b, D, 0.1f);
      mat(d.wqkv, 3 * D, D), vec(d.bqkv, 3 * D, 0.02f), mat(d.wo, D, D), vec(d.bo, D, 0.02f);
      mat(d.fc1, I, D), vec(d.fc1_b, I, 0.02f), mat(d.fc2, D, I), vec(d.fc2_b, D, 0.02f);
    }
    mat(proj1, P, D), vec(proj1_b, P, 0.02f), mat(proj2, Ht, P), vec(proj2_b, Ht, 0.02f);
    mat(merge1, P, 4 * Ht), vec(merge1_b, P, 0.02f), mat(merge2, Ht, P), vec(merge2_b, Ht, 0.02f);
    finish_setup();
  }

  std::vector<float> download(const float* d, size_t n) {
    std::vector<float> h(n);
    M3_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * 4, cudaMemcpyDeviceToHost, s));
    M3_CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
  }

  // The whole encoder on stream s (docs/MEDIA.md "Vision tower on CUDA" lists the op sequence).
  const float* enqueue(std::span<const std::array<int, 3>> grids, const float* d_px, VisionTrace* trace) {
    const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim(), I = c.intermediate_size,
                  P = c.projector_hidden_size, Ht = c.text_hidden_size, K = c.patch_dim();
    const int64_t m2 = int64_t(c.merge_size) * c.merge_size;
    for (const auto& g : grids) check_grid(c, g);
    // The CPU model's layout: rotary positions per variant, one attention sequence per image / video segment.
    const VisionModel::Layout lay = VisionModel::layout(c, grids);
    const int64_t R = lay.seq.back(), N = R / m2;
    if (R == 0) return nullptr;
    h_pos.assign(lay.t.begin(), lay.t.end());  // [pos_t (R) | pos_h (R) | pos_w (R)]
    h_pos.insert(h_pos.end(), lay.h.begin(), lay.h.end());
    h_pos.insert(h_pos.end(), lay.w.begin(), lay.w.end());
    h_tiles = cuda::vision_attention_tiles(lay.seq);
    const int num_tiles = int(h_tiles.size() / 3);
    // Pageable sources: the copy returns once the data is staged, so the host vectors may change afterwards.
    cuda::upload(d_pos, h_pos.data(), h_pos.size(), s);
    cuda::upload(d_tiles, h_tiles.data(), h_tiles.size(), s);
    x.grow(size_t(R * D)), qkv.grow(size_t(R * 3 * D)), f.grow(size_t(R * std::max(I, P)));
    p2.grow(size_t(R * Ht)), m1.grow(size_t(N * P)), out.grow(size_t(N * Ht));
    xnb.grow(size_t(R * D)), qb.grow(size_t(R * D)), kb.grow(size_t(R * D)), vb.grow(size_t(R * D));
    attnb.grow(size_t(R * D)), fb.grow(size_t(R * std::max(I, P))), p2b.grow(size_t(R * Ht));
    const int32_t* pos_t = d_pos.get();
    const int32_t* pos_h = d_pos.get() + R;
    const int32_t* pos_w = d_pos.get() + 2 * R;
    const float scale = 1.0f / std::sqrt(float(hd));

    // Patch embedding (the Conv3d as a [D, 1176] matmul), then pre_layrnorm in place on the fp32 stream.
    gemm.nt(d_px, R, K, patch_embed.get(), cuda::WType::BF16, D, x.get(), false, s);
    if (trace) trace->patch_embed = download(x.get(), size_t(R * D));
    cuda::vision_layer_norm(x.get(), R, D, pre_ln_w.get(), pre_ln_b.get(), c.layer_norm_eps, x.get(), nullptr, s);
    if (trace) {
      trace->pre_ln = download(x.get(), size_t(R * D));
      trace->layers.clear();
    }
    for (const DevLayer& L : layers) {
      // x += out_proj(attention(rope(qkv(LN1(x))))) + bo
      cuda::vision_layer_norm(x.get(), R, D, L.ln1_w.get(), L.ln1_b.get(), c.layer_norm_eps, nullptr, xnb.get(), s);
      gemm.nt_bf16(xnb.get(), R, D, L.wqkv.get(), 3 * D, qkv.get(), false, s);
      cuda::vision_qkv_rope(qkv.get(), L.bqkv.get(), R, int(H), int(hd), rope(), pos_t, pos_h, pos_w,
                            inv_freq.get(), qb.get(), kb.get(), vb.get(), s);
      cuda::vision_attention(qb.get(), kb.get(), vb.get(), d_tiles.get(), num_tiles, int(H), int(hd), scale,
                             attnb.get(), s);
      gemm.nt_bf16(attnb.get(), R, D, L.wo.get(), D, x.get(), true, s);
      cuda::vision_bias_act(x.get(), R, D, L.bo.get(), false, true, nullptr, s);
      // x += fc2(gelu(fc1(LN2(x)) + b1)) + b2
      cuda::vision_layer_norm(x.get(), R, D, L.ln2_w.get(), L.ln2_b.get(), c.layer_norm_eps, nullptr, xnb.get(), s);
      gemm.nt_bf16(xnb.get(), R, D, L.fc1.get(), I, f.get(), false, s);
      cuda::vision_bias_act(f.get(), R, I, L.fc1_b.get(), true, false, fb.get(), s);
      gemm.nt_bf16(fb.get(), R, I, L.fc2.get(), D, x.get(), true, s);
      cuda::vision_bias_act(x.get(), R, D, L.fc2_b.get(), false, true, nullptr, s);
      if (trace) trace->layers.push_back(download(x.get(), size_t(R * D)));
    }
    // Projector per patch (linear_1 → GELU → linear_2), then the merge MLP over each window's 4 consecutive rows:
    // p2 [R, Ht] read as [R/4, 4·Ht] (docs/M3_MODEL.md §5.5).
    gemm.nt(x.get(), R, D, proj1.get(), cuda::WType::BF16, P, f.get(), false, s);
    cuda::vision_bias_act(f.get(), R, P, proj1_b.get(), true, false, fb.get(), s);
    gemm.nt_bf16(fb.get(), R, P, proj2.get(), Ht, p2.get(), false, s);
    cuda::vision_bias_act(p2.get(), R, Ht, proj2_b.get(), false, trace != nullptr, p2b.get(), s);
    if (trace) trace->projected = download(p2.get(), size_t(R * Ht));
    gemm.nt_bf16(p2b.get(), N, m2 * Ht, merge1.get(), P, m1.get(), false, s);
    cuda::vision_bias_act(m1.get(), N, P, merge1_b.get(), true, false, fb.get(), s);
    gemm.nt_bf16(fb.get(), N, P, merge2.get(), Ht, out.get(), false, s);
    cuda::vision_bias_act(out.get(), N, Ht, merge2_b.get(), false, true, nullptr, s);
    return out.get();
  }
};

CudaVisionModel::CudaVisionModel() = default;
CudaVisionModel::~CudaVisionModel() = default;

CudaVisionModel::CudaVisionModel(const VisionConfig& cfg, const VisionWeights& w)
    : impl_(std::make_unique<Impl>(cfg)) {
  impl_->upload(w);
}

std::unique_ptr<CudaVisionModel> CudaVisionModel::random(const VisionConfig& cfg, uint64_t seed) {
  std::unique_ptr<CudaVisionModel> m(new CudaVisionModel());
  m->impl_ = std::make_unique<Impl>(cfg);
  m->impl_->random(seed);
  return m;
}

std::unique_ptr<CudaVisionModel> CudaVisionModel::load(const std::string& model_dir, std::optional<VitRope> rope) {
  const VisionConfig c = load_vision_config((std::filesystem::path(model_dir) / "config.json").string(), rope);
  const SafeTensors st = SafeTensors::open(model_dir);
  return std::make_unique<CudaVisionModel>(c, load_vision_weights(st, c));
}

const VisionConfig& CudaVisionModel::config() const { return impl_->c; }
cudaStream_t CudaVisionModel::stream() const { return impl_->s; }

const float* CudaVisionModel::enqueue(std::span<const std::array<int, 3>> grids, const float* d_pixels,
                                      VisionTrace* trace) {
  return impl_->enqueue(grids, d_pixels, trace);
}

std::vector<float> CudaVisionModel::encode_batch(std::span<const VisionModel::Item> items, VisionTrace* trace) {
  std::lock_guard<std::mutex> lock(mu_);
  Impl& m = *impl_;
  const VisionConfig& c = m.c;
  const int64_t K = c.patch_dim(), Ht = c.text_hidden_size, m2 = int64_t(c.merge_size) * c.merge_size;
  std::vector<std::array<int, 3>> grids;
  int64_t R = 0;
  for (const VisionModel::Item& it : items) {  // every check before any GPU work
    const auto& g = it.grid_thw;
    check_grid(c, g);
    const int64_t Ri = int64_t(g[0]) * g[1] * g[2];
    M3_CHECK(int64_t(it.pixels.size()) == Ri * K, "vision: {} pixel values for grid ({}, {}, {}); expected {} × {}",
             it.pixels.size(), g[0], g[1], g[2], Ri, K);
    grids.push_back(g);
    R += Ri;
  }
  if (R == 0) return {};
  m.px.grow(size_t(R * K));
  int64_t off = 0;
  for (const VisionModel::Item& it : items) {
    M3_CUDA_CHECK(cudaMemcpyAsync(m.px.get() + off, it.pixels.data(), it.pixels.size() * 4, cudaMemcpyHostToDevice,
                                  m.s));
    off += int64_t(it.pixels.size());
  }
  const float* d_out = m.enqueue(grids, m.px.get(), trace);
  return m.download(d_out, size_t(R / m2 * Ht));
}

double CudaVisionModel::flops(const VisionConfig& c, std::span<const std::array<int, 3>> grids) {
  const double D = c.hidden_size, I = c.intermediate_size, P = c.projector_hidden_size, Ht = c.text_hidden_size,
               K = c.patch_dim(), L = c.num_layers, m2 = double(c.merge_size) * c.merge_size;
  double total = 0;
  const VisionModel::Layout lay = VisionModel::layout(c, grids);
  for (size_t i = 0; i + 1 < lay.seq.size(); ++i) {  // Q·Kᵀ and P·V over all heads, per attention sequence
    const double S = double(lay.seq[i + 1] - lay.seq[i]);
    total += L * 4 * S * S * D;
  }
  for (const auto& g : grids) {
    const double R = double(g[0]) * g[1] * g[2];
    total += 2 * R * (K * D + L * (4 * D * D + 2 * D * I) + D * P + P * Ht);  // per-patch GEMMs
    total += 2 * (R / m2) * (m2 * Ht * P + P * Ht);                          // merge MLP
  }
  return total;
}

}  // namespace m3
