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
}

int32_t choose_token(std::span<const float> logits, const SamplingParams& p, double u) {
  const int64_t V = int64_t(logits.size());
  M3_CHECK(V > 0, "sample: empty logits");
  if (p.temperature == 0.f || p.top_k == 1) return argmax(logits);
  // Candidates sorted by logit (desc, ties by id) — stable and independent of the RNG.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = V;
  if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  if (keep < V) {
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
    idx.resize(size_t(keep));
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  // Softmax with temperature over the kept candidates (fp64 for a stable cumulative sum).
  std::vector<double> prob(idx.size());
  const double m = logits[idx[0]];
  double sum = 0.0;
  for (size_t i = 0; i < idx.size(); ++i) {
    prob[i] = std::exp((double(logits[idx[i]]) - m) / double(p.temperature));
    sum += prob[i];
  }
  for (auto& x : prob) x /= sum;
  size_t n = prob.size();
  if (p.min_p > 0.f) {  // drop candidates below min_p × the top probability
    const double floor = p.min_p * prob[0];
    while (n > 1 && prob[n - 1] < floor) --n;
  }
  if (p.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double c = 0.0;
    size_t cut = n;
    for (size_t i = 0; i < n; ++i) {
      c += prob[i];
      if (c >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    n = cut;
  }
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  const double r = u * total;
  double c = 0.0;
  for (size_t i = 0; i < n; ++i) {
    c += prob[i];
    if (r < c) return idx[i];
  }
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
  out.id = choose_token(logits, p.sampling, uniform_from_seed(row.seed, p.choice_index, step));
  if (p.top_logprobs >= 0) out.logprob = logprobs_of(raw, out.id, p.top_logprobs);
  return out;
}

Sampler::Sampler(const SamplingParams& p, uint64_t choice_index)
    : p_(p), seed_(p.seed ? *p.seed : random_seed()), choice_(choice_index) {
  p_.validate();
}

int32_t Sampler::sample(std::span<const float> logits) {
  return choose_token(logits, p_, uniform_from_seed(seed_, choice_, step_++));
}

}  // namespace m3
