// Gemma RMSNorm and partial NeoX RoPE (CPU reference).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace m3::cpu {

void rms_norm_gemma(const float* x, int64_t rows, int64_t D, const float* w, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    double ss = 0.0;  // sum of squares in double: cheap, and keeps the reference free of order effects
    for (int64_t i = 0; i < D; ++i) ss += double(xr[i]) * double(xr[i]);
    const float inv = float(1.0 / std::sqrt(ss / double(D) + double(eps)));
    for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * (1.0f + w[i]);
  }
}

void rope_neox_partial(float* x, int64_t T, int64_t H, int64_t D, int64_t rotary_dim, const int32_t* positions,
                       double theta) {
  const int64_t half = rotary_dim / 2;
  if (half == 0) return;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = float(1.0 / std::pow(theta, double(2 * i) / double(rotary_dim)));
  std::vector<float> cs(half), sn(half);
  for (int64_t t = 0; t < T; ++t) {
    const float p = float(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float a = p * inv_freq[i];
      cs[i] = std::cos(a);
      sn[i] = std::sin(a);
    }
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

}  // namespace m3::cpu
