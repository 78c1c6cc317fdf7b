// Token sampling on the CPU: greedy, temperature, top-k, top-p, min-p, seeded. One Sampler per request choice;
// its RNG is keyed by (seed, choice index) so a seeded request draws the same tokens whatever else is batched.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>

namespace m3 {

struct SamplingParams {
  float temperature = 1.0f;  // 0 → greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = -1;            // −1 or 0 → disabled
  float min_p = 0.0f;        // [0, 1]
  std::optional<uint64_t> seed;

  // Throws m3::Error naming the field when a value is out of range.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p, uint64_t choice_index = 0);
  // logits: [V]; returns the chosen id. Greedy ties go to the lower id.
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace m3
