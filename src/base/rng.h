// The one random-number definition of token sampling, shared by the CPU sampler (engine/sampler.cpp) and the GPU
// sampler (backend/cuda/sampling.cu): a counter hash, so the draw for (seed, choice, step) is the same on every
// device and does not depend on what else is batched or on how many draws came before.
#pragma once

#include <cstdint>

namespace m3 {

// splitmix64's finaliser: decorrelates nearby seeds, choice indices and steps.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The 53 random bits of draw `step` (the index of the token being sampled) of choice `choice_index`.
constexpr uint64_t uniform_bits_from_seed(uint64_t seed, uint64_t choice_index, uint64_t step) {
  const uint64_t x = splitmix64(seed ^ splitmix64(choice_index + 1) ^ splitmix64(splitmix64(step + 0x51ed)));
  return x >> 11;
}

// u ∈ [0, 1): the same draw as a double (u = bits / 2^53, exact).
constexpr double uniform_from_seed(uint64_t seed, uint64_t choice_index, uint64_t step) {
  return double(uniform_bits_from_seed(seed, choice_index, step)) * (1.0 / 9007199254740992.0);
}

// ---- the sampling arithmetic both samplers share (engine/sampler.cpp, backend/cuda/sampling.cu) ----------------
// A candidate's weight is fixed point: w = trunc(exp((l − m) / T) · 2^40) as an integer, with m the row's largest
// logit, so the top candidate weighs exactly 2^40 and a whole row of 200,064 sums below 2^58. Integer sums are
// associative: every running mass (top-p cut, the draw) is the same whatever order or thread tree adds it up, so
// the CPU's sequential loop and the GPU's parallel scans agree bit for bit. Weights below 1 (x < −27.7) are 0:
// such tokens (probability < 1e−12 of the top one) are never drawn. exp() itself may differ by 1 ulp between libm
// and CUDA; that moves a weight by one unit (2^−40) only when the product straddles an integer, so a draw can
// differ only if it lands within 2^−40 of a boundary.
constexpr double kSampleWeightScale = 1099511627776.0;  // 2^40
constexpr double kSampleWeightMinX = -28.0;             // exp(−28) · 2^40 = 0.76 < 1: weight 0 without exp()

// The draw inside a kept mass `total` > 0: r = floor(bits · total / 2^53) ∈ [0, total); the pick is the first
// candidate whose running mass exceeds r.
constexpr uint64_t sample_draw_point(uint64_t bits53, uint64_t total) {
  return uint64_t((unsigned __int128)(bits53) * total >> 53);
}

}  // namespace m3
