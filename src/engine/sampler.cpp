#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"

namespace m3 {

void SamplingParams::validate() const {
  M3_CHECK(std::isfinite(temperature) && temperature >= 0.f && temperature <= 100.f,
           "temperature must be in [0, 100], got {}", temperature);
  M3_CHECK(std::isfinite(top_p) && top_p > 0.f && top_p <= 1.f, "top_p must be in (0, 1], got {}", top_p);
  M3_CHECK(top_k >= -1, "top_k must be -1 (disabled) or a positive integer, got {}", top_k);
  M3_CHECK(std::isfinite(min_p) && min_p >= 0.f && min_p <= 1.f, "min_p must be in [0, 1], got {}", min_p);
}

namespace {
uint64_t mix(uint64_t x) {  // splitmix64: decorrelates nearby seeds / choice indices
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Sampler::Sampler(const SamplingParams& p, uint64_t choice_index) : p_(p) {
  p_.validate();
  const uint64_t seed = p.seed ? *p.seed : std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  rng_.seed(mix(seed ^ mix(choice_index + 1)));
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  return best;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int64_t V = int64_t(logits.size());
  M3_CHECK(V > 0, "sample: empty logits");
  if (p_.temperature == 0.f || p_.top_k == 1) return argmax(logits);
  // Candidates sorted by logit (desc, ties by id) — stable and independent of the RNG.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = V;
  if (p_.top_k > 0) keep = std::min<int64_t>(keep, p_.top_k);
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
    prob[i] = std::exp((double(logits[idx[i]]) - m) / double(p_.temperature));
    sum += prob[i];
  }
  for (auto& x : prob) x /= sum;
  size_t n = prob.size();
  if (p_.min_p > 0.f) {  // drop candidates below min_p × the top probability
    const double floor = p_.min_p * prob[0];
    while (n > 1 && prob[n - 1] < floor) --n;
  }
  if (p_.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double c = 0.0;
    size_t cut = n;
    for (size_t i = 0; i < n; ++i) {
      c += prob[i];
      if (c >= p_.top_p) {
        cut = i + 1;
        break;
      }
    }
    n = cut;
  }
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), c = 0.0;
  for (size_t i = 0; i < n; ++i) {
    c += prob[i];
    if (r < c) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace m3
