// The CUDA executor (issue 5): the M3 forward of M3Model::forward on one GPU, over a device-resident paged cache
// with the same page-unit layout as kv/kv_cache.h (fp32 storage in this first version; the unit is padded to a
// multiple of block·head_dim floats so the attention kernels can view it as virtual pages).
// Weights are BF16 on the device by default (cuBLASLt BF16 GEMMs, FP32 accumulate); `bf16_weights = false` keeps
// FP32 weights and exact FP32 GEMMs, which the whole-model test compares with the CPU reference at tight tolerance.
// Built only with -DM3_WITH_CUDA=ON (targets linking m3_cuda_executor see the definition M3_WITH_CUDA=1); CUDA types
// stay behind the pimpl so C++ callers need no CUDA headers.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/executor.h"
#include "model/m3_weights.h"

namespace m3 {

struct CudaExecutorOptions {
  bool bf16_weights = true;
  bool validate = false;  // check every sparse layer's selection against the MSA contract (syncs; tests)
  int device = 0;
};

class CudaExecutor final : public ModelExecutor {
 public:
  // num_pages ≤ 0: as many KV pages as fit in 90 % of the free device memory (minus 1 GiB) after the weights.
  CudaExecutor(const M3Config& cfg, const M3Weights& weights, int32_t num_pages, CudaExecutorOptions opt = {});
  // Loads config.json + safetensors of a model directory (MXFP8 dequantised at load, then stored as opt says).
  static std::unique_ptr<CudaExecutor> load(const std::string& model_dir, int32_t num_pages,
                                            CudaExecutorOptions opt = {});
  ~CudaExecutor() override;

  // True when at least one CUDA device is usable (never throws).
  static bool available();

  const M3Config& config() const override;
  PagePool& pool() override;
  // Same contract as M3Model::forward. Trace: capture_hidden and capture_selection are supported
  // (selection per sequence [Hidx, n, top_k], history ids in ascending order, local last — as the CPU's).
  std::vector<std::vector<float>> forward(std::span<const SeqInput> seqs, ForwardTrace* trace = nullptr) override;
  std::string describe() const override;
  int64_t page_bytes() const override;
  // Page unit of this executor for a config: the CPU layout padded to a multiple of B·D floats.
  static int64_t page_bytes_for(const M3Config& c);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3
