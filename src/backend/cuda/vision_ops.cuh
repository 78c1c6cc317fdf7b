// Vision-tower ops of the CUDA backend (issue 12 item 4; docs/MEDIA.md "Vision tower on CUDA"): LayerNorm with bias,
// bias + exact GELU, the q/k/v split with either RoPE variant, and bidirectional varlen attention (one sequence per
// image or video segment, several per call) on tensor cores. bf16 GEMM inputs, fp32 accumulation and fp32 residual
// stream. CPU twins: cpu::layer_norm, cpu::add_bias + cpu::gelu_erf, cpu::vision_rope_hf517 /
// cpu::vision_rope_official, cpu::attention_full
// (backend/cpu/cpu_ops.h); tests/gpu/gpu_vision_test.cpp compares each op and the whole tower. C++17 (the CUDA
// library's standard), so no std::span here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace m3::cuda {

// y = (x − μ)/sqrt(σ² + eps) · w + b per row of D (mean and variance in fp32, two passes). Writes fp32 y (may
// alias x) when y is not null and bf16 yb (round to nearest even) when yb is not null. x, y: [rows, D].
void vision_layer_norm(const float* x, int64_t rows, int64_t D, const float* w, const float* b, float eps, float* y,
                       uint16_t* yb, cudaStream_t s);

// y[r, :] += b (b may be null: no bias), then exact (erf) GELU when gelu. The result goes to y (fp32, in place)
// when write_f32, and to yb (bf16) when yb is not null. y: [rows, N].
void vision_bias_act(float* y, int64_t rows, int64_t N, const float* b, bool gelu, bool write_f32, uint16_t* yb,
                     cudaStream_t s);

// The rotary variant (m3::VitRope, model/vision_model.h; docs/MEDIA.md "Rotary variants").
enum class VisionRope : int {
  kHf517 = 0,     // HF 5.17 axial: twin cpu::vision_rope_hf517
  kOfficial = 1,  // official / vLLM 3D: twin cpu::vision_rope_official
};

// The RoPE table, in fp32 exactly as the CPU twin computes it. kHf517: inv_freq[k] = θ^(−2k/(hd/2)) for k < hd/4;
// kOfficial: inv_freq[k] = θ^(−2k/(2n)) for k < n = hd/6.
std::vector<float> vision_rope_inv_freq(int head_dim, double theta, VisionRope rope = VisionRope::kHf517);

// qkv [R, 3·H·hd] fp32 (the fused projection, q | k | v) + bias [3·H·hd] → q, k, v bf16 [R, H, hd]; q and k get the
// RoPE in fp32 before the bf16 rounding. kHf517: angles [pos_t·inv | pos_h·inv] over rotate-half pairs
// (i, i + hd/2), pos_w unused (may be null). kOfficial: angles [pos_t·inv | pos_h·inv | pos_w·inv] (n = hd/6 each)
// over NeoX pairs (i, i + 3n), dims 6n..hd−1 unrotated. pos_t, pos_h, pos_w: [R] on the device; inv_freq: the
// variant's vision_rope_inv_freq on the device.
void vision_qkv_rope(const float* qkv, const float* bias, int64_t R, int H, int hd, VisionRope rope,
                     const int32_t* pos_t, const int32_t* pos_h, const int32_t* pos_w, const float* inv_freq,
                     uint16_t* q, uint16_t* k, uint16_t* v, cudaStream_t s);

// Query tiles of a varlen batch: for items whose rows start at begin[i] (begin.back() = total rows), one
// (item first row, item length, first query row within the item) triple per 64-row query tile. Host side.
std::vector<int32_t> vision_attention_tiles(const std::vector<int64_t>& begin);
constexpr int kVisionAttnTileRows = 64;

// Bidirectional attention per item: out[r, h, :] = softmax(q[r, h]·k[j, h]ᵀ·scale) · v[j, h] over the rows j of r's
// item only. q, k, v, out: bf16 [R, H, hd]; tiles: the device copy of vision_attention_tiles (num_tiles triples).
// Scores and softmax in fp32, probabilities rounded to bf16 for the P·V product (fp32 accumulation). hd must be a
// multiple of 16 in [16, 128] (M3: 80); anything else throws m3::Error.
void vision_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* tiles, int num_tiles,
                      int H, int hd, float scale, uint16_t* out, cudaStream_t s);

}  // namespace m3::cuda
