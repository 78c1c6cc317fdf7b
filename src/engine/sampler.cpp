#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/rng.h"
#include "engine/request.h"

namespace m3 {

void SamplingParams::validate() const {
  M3_CHECK(std::isfinite(temperature) && temperature >= 0.f && temperature <= 100.f,
           "temperature must be in [0, 100], got {}", temperature);
  M3_CHECK(std::isfinite(top_p) && top_p > 0.f && top_p <= 1.f, "top_p must be in (0, 1], got {}", top_p);
  M3_CHECK(top_k >= -1, "top_k must be -1 (disabled) or a positive integer, got {}", top_k);
  M3_CHECK(std::isfinite(min_p) && min_p >= 0.f && min_p <= 1.f, "min_p must be in [0, 1], got {}", min_p);
}

uint64_t random_seed() {
  std::random_device rd;
  return uint64_t(rd()) ^ (uint64_t(rd()) << 32);
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  return best;
}

void adjust_logits(std::span<float> lg, const RowSampling& row) {
  const GenerationParams& p = *row.params;
  if (p.repetition_penalty != 1.f) {
    std::unordered_set<int32_t> seen(row.tokens.begin(), row.tokens.end());
    for (int32_t t : seen) lg[t] = lg[t] > 0 ? lg[t] / p.repetition_penalty : lg[t] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    std::unordered_map<int32_t, int> counts;
    for (size_t i = size_t(row.prompt_len); i < row.tokens.size(); ++i) ++counts[row.tokens[i]];
    for (auto [t, n] : counts) lg[t] -= p.presence_penalty + p.frequency_penalty * float(n);
  }
  for (auto [t, b] : p.logit_bias) lg[t] += b;
  const int generated = int(row.tokens.size()) - row.prompt_len;
  if (generated < p.min_tokens) {
    const float ninf = -std::numeric_limits<float>::infinity();
    if (row.eos_token_id >= 0 && !p.ignore_eos) lg[row.eos_token_id] = ninf;
    for (int32_t t : p.stop_token_ids) lg[t] = ninf;
  }
  if (row.allowed) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < lg.size(); ++i)
      if (!((row.allowed[i >> 5] >> (i & 31)) & 1u)) lg[i] = ninf;
  }
}

uint64_t sample_weight(float logit, float max_logit, float temperature) {
  return sample_weight_of(logit, max_logit, temperature);
}

int32_t choose_token(std::span<const float> logits, const SamplingParams& p, double u) {
  return choose_token_bits(logits, p, uint64_t(u * 9007199254740992.0));
}

int32_t choose_token_bits(std::span<const float> logits, const SamplingParams& p, uint64_t bits53) {
  const int64_t V = int64_t(logits.size());
  M3_CHECK(V > 0, "sample: empty logits");
  if (p.temperature == 0.f || p.top_k == 1) return argmax(logits);
  const int32_t top = argmax(logits);
  const float m = logits[size_t(top)];
  if (!std::isfinite(m)) return top;  // every token masked (or an overflow): nothing to weigh
  // Candidates sorted by logit (desc, ties by id) — stable and independent of the RNG. Only candidates with a
  // weight can be drawn or move a cut, and they come first in this order, so the rest need no sorting.
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < int32_t(V); ++i)
    if (sample_weight(logits[size_t(i)], m, p.temperature) > 0) idx.push_back(i);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  std::sort(idx.begin(), idx.end(), by_logit);
  // top_k: the k best of the whole row; the weightless ones among them add nothing.
  size_t n1 = idx.size();
  if (p.top_k > 0) n1 = std::min<size_t>(n1, size_t(p.top_k));
  std::vector<uint64_t> cum(n1);  // running mass in fixed point (base/rng.h)
  uint64_t c = 0;
  for (size_t i = 0; i < n1; ++i) cum[i] = c += sample_weight(logits[size_t(idx[i])], m, p.temperature);
  const uint64_t s1 = c;  // the mass top_p is a fraction of
  size_t n = n1;
  if (p.min_p > 0.f) {  // keep weights ≥ min_p × the top weight (2^40): a prefix, never empty
    const double floor = double(p.min_p) * kSampleWeightScale;
    size_t k = 0;
    while (k < n && double(cum[k] - (k ? cum[k - 1] : 0)) >= floor) ++k;
    n = std::max<size_t>(k, 1);
  }
  if (p.top_p < 1.f) {  // smallest prefix whose mass reaches top_p of the top-k mass
    const double x = double(p.top_p) * double(s1);
    for (size_t i = 0; i < n; ++i)
      if (double(cum[i]) >= x) {
        n = i + 1;
        break;
      }
  }
  const uint64_t r = sample_draw_point(bits53, cum[n - 1]);
  for (size_t i = 0; i < n; ++i)
    if (r < cum[i]) return idx[i];
  return idx[n - 1];
}

TokenLogprob logprobs_of(std::span<const float> raw, int32_t chosen, int top) {
  double m = -INFINITY;
  for (float x : raw) m = std::max(m, double(x));
  double sum = 0;
  for (float x : raw) sum += std::exp(double(x) - m);
  const double lse = m + std::log(sum);
  TokenLogprob lp;
  lp.id = chosen;
  lp.logprob = float(double(raw[chosen]) - lse);
  if (top > 0) {
    std::vector<int32_t> idx(raw.size());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min(size_t(top), idx.size());
    std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                      [&](int32_t a, int32_t b) { return raw[a] != raw[b] ? raw[a] > raw[b] : a < b; });
    for (size_t i = 0; i < k; ++i) lp.top.emplace_back(idx[i], float(double(raw[idx[i]]) - lse));
  }
  return lp;
}

SampledToken sample_row(std::span<float> logits, const RowSampling& row) {
  const GenerationParams& p = *row.params;
  const std::vector<float> raw = p.top_logprobs >= 0 ? std::vector<float>(logits.begin(), logits.end())
                                                     : std::vector<float>{};
  adjust_logits(logits, row);
  const uint64_t step = uint64_t(row.tokens.size()) - uint64_t(row.prompt_len);
  SampledToken out;
  out.id = choose_token_bits(logits, p.sampling, uniform_bits_from_seed(row.seed, p.choice_index, step));
  if (p.top_logprobs >= 0) out.logprob = logprobs_of(raw, out.id, p.top_logprobs);
  return out;
}

Sampler::Sampler(const SamplingParams& p, uint64_t choice_index)
    : p_(p), seed_(p.seed ? *p.seed : random_seed()), choice_(choice_index) {
  p_.validate();
}

int32_t Sampler::sample(std::span<const float> logits) {
  return choose_token_bits(logits, p_, uniform_bits_from_seed(seed_, choice_, step_++));
}

}  // namespace m3
