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

// u ∈ [0, 1) with 53 random bits for draw `step` (the index of the token being sampled) of choice `choice_index`.
constexpr double uniform_from_seed(uint64_t seed, uint64_t choice_index, uint64_t step) {
  const uint64_t x = splitmix64(seed ^ splitmix64(choice_index + 1) ^ splitmix64(splitmix64(step + 0x51ed)));
  return double(x >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace m3
