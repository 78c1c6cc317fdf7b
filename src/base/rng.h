// The one random-number definition of token sampling, shared by the CPU sampler (engine/sampler.cpp) and the GPU
// sampler (backend/cuda/sampling.cu): a counter hash, so the draw for (seed, choice, step) is the same on every
// device and does not depend on what else is batched or on how many draws came before.
#pragma once

#include <cmath>
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
// A candidate's weight is fixed point: w = trunc(e(x) · 2^40) as an integer, x = (l − m) / T in fp32, m the row's
// largest logit, e(x) the fp32 exp below, so the top candidate weighs exactly 2^40 and a whole row of 200,064 sums
// below 2^58. Everything is defined by IEEE fp32 operations with round-to-nearest (explicit intrinsics on the device,
// plain operations on the host, which m3_sampler compiles with -ffp-contract=off), so CPU and GPU compute the very
// same weights; integer sums are associative, so every running mass (top-p cut, the draw) is the same whatever order
// or thread tree adds it up. Weights of x < −28 (below 2^−40 of the top one) are 0: such tokens are never drawn.
constexpr double kSampleWeightScale = 1099511627776.0;  // 2^40
constexpr float kSampleWeightMinX = -28.f;

#if defined(__CUDACC__)
#define M3_SAMPLE_FN __host__ __device__ __forceinline__
#else
#define M3_SAMPLE_FN inline
#endif

M3_SAMPLE_FN float sample_fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
M3_SAMPLE_FN float sample_fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
M3_SAMPLE_FN float sample_fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// e^x for x ∈ [−28, 0] (relative error ~2e−7): x = k·ln2 + r with k = rint(x · log2 e), |r| ≤ 0.35, e^r by its
// degree-6 Taylor polynomial, times 2^k (exact). ln2 is split so k · ln2_hi is exact.
M3_SAMPLE_FN float sample_exp(float x) {
  const float k = rintf(sample_fmul(x, 1.44269504f));
  float r = sample_fadd(x, -sample_fmul(k, 0.693145752f));
  r = sample_fadd(r, -sample_fmul(k, 1.42860677e-06f));
  float p = 1.f / 720.f;
  p = sample_fadd(sample_fmul(p, r), 1.f / 120.f);
  p = sample_fadd(sample_fmul(p, r), 1.f / 24.f);
  p = sample_fadd(sample_fmul(p, r), 1.f / 6.f);
  p = sample_fadd(sample_fmul(p, r), 0.5f);
  p = sample_fadd(sample_fmul(p, r), 1.f);
  p = sample_fadd(sample_fmul(p, r), 1.f);
  return ldexpf(p, int(k));
}

// The fixed-point weight of logit l in a row whose largest logit is m, at temperature t > 0.
M3_SAMPLE_FN uint64_t sample_weight_of(float l, float m, float t) {
  const float x = sample_fdiv(sample_fadd(l, -m), t);
  if (!(x >= kSampleWeightMinX)) return 0;  // also −inf logits (min_tokens) and NaN
  return uint64_t(double(sample_exp(x)) * kSampleWeightScale);
}

// The draw inside a kept mass `total` > 0: r = floor(bits · total / 2^53) ∈ [0, total); the pick is the first
// candidate whose running mass exceeds r.
constexpr uint64_t sample_draw_point(uint64_t bits53, uint64_t total) {
  return uint64_t((unsigned __int128)(bits53) * total >> 53);
}

}  // namespace m3
