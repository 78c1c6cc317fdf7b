// Logits → token on the CPU. For one row: penalties, logit_bias and min_tokens suppression (adjust_logits), then
// greedy or temperature / top-k / top-p / min-p sampling with the counter RNG of base/rng.h keyed by (seed, choice
// index, step = tokens generated so far), and the logprobs of the raw logits when asked. A seeded request draws the
// same tokens whatever else is batched, and the GPU sampler (backend/cuda/sampling.cuh) uses the same draws.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace m3 {

struct GenerationParams;

struct SamplingParams {
  float temperature = 1.0f;  // 0 → greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = -1;            // −1 or 0 → disabled
  float min_p = 0.0f;        // [0, 1]
  std::optional<uint64_t> seed;

  // Throws m3::Error naming the field when a value is out of range.
  void validate() const;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs alternatives, descending
};

// One row to sample: the request's parameters and its sequence so far. The step of the RNG is the number of
// generated tokens (tokens.size() − prompt_len).
struct RowSampling {
  const GenerationParams* params = nullptr;  // nullptr: the row needs no token this step
  std::span<const int32_t> tokens;           // prompt followed by the tokens generated so far
  int prompt_len = 0;
  uint64_t seed = 0;                         // params->sampling.seed, or the random one drawn for the request
  int32_t eos_token_id = -1;                 // suppressed before min_tokens unless ignore_eos; −1: none
  // Constrained decoding (grammar/constraint.h): a packed bitmask [ceil(V / 32)], bit id set = token id allowed;
  // the others go to −inf after penalties and bias. nullptr: unconstrained.
  const uint32_t* allowed = nullptr;
};

struct SampledToken {
  int32_t id = -1;                      // −1 for rows without sampling
  std::optional<TokenLogprob> logprob;  // when params->top_logprobs ≥ 0
};

// Penalties (repetition on prompt + generated, presence / frequency on generated), logit_bias and min_tokens
// suppression of EOS and stop ids, in place on logits [V] (vLLM semantics); then the grammar mask (row.allowed).
void adjust_logits(std::span<float> logits, const RowSampling& row);
// Greedy (ties to the lower id) or sampled with the 53 random bits `bits53` of a draw (base/rng.h): candidates
// sorted by logit (desc, ties by id), each weighed w = trunc(e((l − max) / T) · 2^40) (sample_weight: the fp32
// arithmetic of base/rng.h, bit-identical to the GPU's), cut to
// top_k; min_p keeps the prefix with w ≥ min_p · 2^40; top_p keeps the smallest prefix whose running mass reaches
// top_p × (top-k mass); the pick is the first candidate whose running mass exceeds r = sample_draw_point(bits53,
// kept mass). All masses are integers, so the GPU sampler (backend/cuda/sampling.cuh) reproduces every choice.
int32_t choose_token_bits(std::span<const float> logits, const SamplingParams& p, uint64_t bits53);
// The same with u ∈ [0, 1) (bits53 = u · 2^53, exact for the draws of uniform_from_seed).
int32_t choose_token(std::span<const float> logits, const SamplingParams& p, double u);
// The fixed-point weight of a logit (0 when below 2^−40 of the top one, or −inf).
uint64_t sample_weight(float logit, float max_logit, float temperature);
// log-softmax of `raw` at `chosen`, and the `top` best (descending, ties to the lower id).
TokenLogprob logprobs_of(std::span<const float> raw, int32_t chosen, int top);
// The whole row: adjusts `logits` in place, then chooses. What every executor's sampling call does per row.
SampledToken sample_row(std::span<float> logits, const RowSampling& row);

// A seeded stream of draws for one request choice without penalties (tests, simple callers): draw i uses step i.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p, uint64_t choice_index = 0);
  // logits: [V]; returns the chosen id. Greedy ties go to the lower id.
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams p_;
  uint64_t seed_ = 0, choice_ = 0, step_ = 0;
};

int32_t argmax(std::span<const float> logits);
// A seed for requests that give none.
uint64_t random_seed();

}  // namespace m3
