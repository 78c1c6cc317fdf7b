// The MiniMax-M3 vision tower + projector + 2×2 merge on CUDA (issue 12 item 4; docs/MEDIA.md "Vision tower on
// CUDA"): the GPU twin of VisionModel (model/vision_model.h), same contract. Weights are uploaded once as bf16
// (matrices) and fp32 (LayerNorm weights, biases); GEMMs take bf16 inputs with fp32 accumulation (cuBLASLt,
// backend/cuda/gemm.cuh), the residual stream stays fp32; the other ops are backend/cuda/vision_ops.cuh.
// Items of different sizes share one call: every GEMM runs over all rows, attention is per image / video segment
// (block-diagonal, VisionModel::layout). Both rotary variants (VisionConfig::rope).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "model/vision_model.h"

namespace m3 {

class CudaVisionModel {
 public:
  // Uploads the weights (on the current device). Host copies are not kept.
  CudaVisionModel(const VisionConfig& cfg, const VisionWeights& w);
  // Random weights filled on the device (benchmarks at M3's widths without a host copy): matrices uniform in
  // ±1/sqrt(fan-in), LayerNorm weights in ±1, small biases (base/counter_hash.h counters, seed `seed`).
  static std::unique_ptr<CudaVisionModel> random(const VisionConfig& cfg, uint64_t seed);
  // `rope`, when set, overrides the config's vit_rope (load_vision_config).
  static std::unique_ptr<CudaVisionModel> load(const std::string& model_dir,
                                               std::optional<VitRope> rope = std::nullopt);
  ~CudaVisionModel();
  CudaVisionModel(const CudaVisionModel&) = delete;
  CudaVisionModel& operator=(const CudaVisionModel&) = delete;

  const VisionConfig& config() const;

  // VisionModel::encode_batch on the GPU: returns the items' [R_i/4, text hidden] blocks concatenated (fp32, on the
  // host). Bad grids / pixel counts throw m3::Error before any GPU work. Thread-safe (calls are serialised).
  std::vector<float> encode_batch(std::span<const VisionModel::Item> items, VisionTrace* trace = nullptr);

  // The device part alone (benchmarks): pixels [R, 1176] fp32 already on the device for these grids; enqueues the
  // whole encoder on stream() and returns the device output [R/4, text hidden] (valid until the next call). Not
  // thread-safe; the caller synchronises.
  const float* enqueue(std::span<const std::array<int, 3>> grids, const float* d_pixels, VisionTrace* trace = nullptr);
  cudaStream_t stream() const;

  // FLOPs of one encoder call over these grids (GEMMs + attention, 2 per multiply-add), for effective TFLOP/s.
  static double flops(const VisionConfig& cfg, std::span<const std::array<int, 3>> grids);

 private:
  CudaVisionModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::mutex mu_;
};

}  // namespace m3
