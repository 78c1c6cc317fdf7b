// SwiGLU-OAI activation and sigmoid MoE routing (CPU reference).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace m3::cpu {

void swiglu_oai(const float* gate_up, int64_t T, int64_t I, float alpha, float limit, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    float* o = out + t * I;
    for (int64_t i = 0; i < I; ++i) {
      const float gc = std::min(g[i], limit);
      const float uc = std::clamp(u[i], -limit, limit);
      const float sig = 1.0f / (1.0f + std::exp(-alpha * gc));
      o[i] = gc * sig * (uc + 1.0f);
    }
  }
}

void moe_route(const float* logits, int64_t T, int64_t E, const float* bias, int top_k, float scale, int32_t* ids,
               float* weights) {
  std::vector<float> s(E), choice(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-logits[t * E + e]));
      choice[e] = s[e] + (bias ? bias[e] : 0.0f);
      if (std::isnan(choice[e])) choice[e] = -std::numeric_limits<float>::infinity();  // keeps the sort well-defined
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      return choice[a] != choice[b] ? choice[a] > choice[b] : a < b;
    });
    float sum = 0.f;
    for (int k = 0; k < top_k; ++k) sum += s[order[k]];
    for (int k = 0; k < top_k; ++k) {
      ids[t * top_k + k] = order[k];
      weights[t * top_k + k] = s[order[k]] / sum * scale;
    }
  }
}

}  // namespace m3::cpu
