// GPU token sampling with the CPU Sampler's semantics (engine/sampler.h): greedy (temperature 0 or top_k 1, ties to
// the lower id), else candidates sorted by logit (desc, ties by id), cut to top_k, softmax with temperature in fp64,
// min_p cut (below min_p × top probability), top_p cut (smallest prefix reaching top_p), then the candidate where
// the running mass first exceeds u · (kept mass).
// The uniform u ∈ [0, 1) of each row is an input: uniform_from_seed() derives it from (seed, choice, step) with a
// counter-based hash, so seeded requests are reproducible whatever else is batched. The sort is CUB's segmented
// radix sort (stable: equal logits keep ascending ids); the per-row pass is one CTA per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/common.cuh"
#include "base/rng.h"

namespace m3::cuda {

struct SampleRow {
  float temperature = 1.f;
  float top_p = 1.f;
  int top_k = -1;  // ≤ 0: disabled
  float min_p = 0.f;
  float u = 0.f;   // uniform in [0, 1)
};

// u ∈ [0, 1) from (seed, choice, step): the definition the CPU sampler uses too (base/rng.h).
using m3::uniform_from_seed;

class GpuSampler {
 public:
  // logits: [R, V] fp32 on the device; rows: [R] parameters. Returns the chosen ids (syncs the stream).
  std::vector<int32_t> sample(const float* logits, int R, int V, const std::vector<SampleRow>& rows, cudaStream_t s);

 private:
  DeviceBuffer<float> keys_;
  DeviceBuffer<int32_t> ids_in_, ids_out_, offsets_, out_;
  DeviceBuffer<uint8_t> temp_;
  DeviceBuffer<SampleRow> rows_;
};

}  // namespace m3::cuda
