// A counter-based hash for deterministic random weights (`--load-format dummy`): the value of element i of a weight
// tensor depends only on (seed, tensor, i), so the GPU fill (backend/cuda/weight_convert.cu) and its CPU twin
// (model/weight_plan.cpp dummy_weights) give the same bits, in any order and for any launch shape, and a truncated
// model's weights are a prefix of the full model's. Header-only and usable from CUDA device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define M3_HOST_DEVICE __host__ __device__
#else
#define M3_HOST_DEVICE
#endif

namespace m3 {

// splitmix64's finaliser (the same mix as base/rng.h, restated here so device code can call it).
M3_HOST_DEVICE inline uint64_t counter_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The per-tensor key: computed once on the host, passed to the kernel.
M3_HOST_DEVICE inline uint64_t counter_key(uint64_t seed, uint64_t stream) {
  return counter_mix(seed ^ counter_mix(stream + 0x632be59bd9b4e019ull));
}

// Element `index` of the tensor with `key`: uniform in [-scale, scale), on 2^24 levels. The integer k ∈ [-2^23,
// 2^23) converts exactly, the power-of-two scaling is exact, and the one multiply by `scale` rounds once (no FMA can
// be formed), so host and device agree bit for bit.
M3_HOST_DEVICE inline float counter_uniform(uint64_t key, uint64_t index, float scale) {
  const int32_t k = int32_t(counter_mix(key + index) >> 40) - (1 << 23);
  return (float(k) * 0x1p-23f) * scale;
}

}  // namespace m3
