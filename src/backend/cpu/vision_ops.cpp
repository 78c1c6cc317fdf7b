// Vision-tower ops of the CPU reference backend (issue 12 item 4; docs/M3_MODEL.md §5.4–5.5): LayerNorm with bias,
// exact GELU, bias add, the two vision RoPE variants (HF 5.17 axial, official 3D) and bidirectional attention over
// one image's patches.
#include <cmath>
#include <algorithm>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "base/thread_pool.h"

namespace m3::cpu {

void layer_norm(const float* x, int64_t rows, int64_t D, const float* w, const float* b, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    double s = 0.0;
    for (int64_t i = 0; i < D; ++i) s += xr[i];
    const double mean = s / double(D);
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
    const double inv = 1.0 / std::sqrt(ss / double(D) + double(eps));
    for (int64_t i = 0; i < D; ++i) yr[i] = float((xr[i] - mean) * inv) * w[i] + b[i];
  }
}

void gelu_erf(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
}

void add_bias(float* y, int64_t rows, int64_t N, const float* b) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < N; ++i) y[r * N + i] += b[i];
}

void vision_rope_hf517(float* x, int64_t T, int64_t H, int64_t D, const int32_t* pos_a, const int32_t* pos_b,
                       double theta) {
  // inv_freq[k] = θ^(−2k / (D/2)), k < D/4, in fp32 like torch (base ** (arange(0, D/2, 2) / (D/2))).
  const int64_t q = D / 4, half = D / 2;
  std::vector<float> inv(static_cast<size_t>(q));
  for (int64_t k = 0; k < q; ++k) {
    const float e = float(2 * k) / float(half);
    inv[size_t(k)] = 1.0f / std::pow(float(theta), e);
  }
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < q; ++k) {
      const float a = float(pos_a[t]) * inv[size_t(k)], b = float(pos_b[t]) * inv[size_t(k)];
      cs[size_t(k)] = std::cos(a);
      sn[size_t(k)] = std::sin(a);
      cs[size_t(q + k)] = std::cos(b);
      sn[size_t(q + k)] = std::sin(b);
    }
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
        v[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
      }
    }
  }
}

void vision_rope_official(float* x, int64_t T, int64_t H, int64_t D, const int32_t* pos_t, const int32_t* pos_h,
                          const int32_t* pos_w, double theta) {
  // inv[k] = θ^(−2k/(2n)) in fp32, the form of torch's 1 / base ** (arange(0, 2n, 2) / (2n)).
  const int64_t n = D / 6, rot = 3 * n;
  std::vector<float> inv(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) inv[size_t(k)] = 1.0f / std::pow(float(theta), float(2 * k) / float(2 * n));
  std::vector<float> cs(static_cast<size_t>(rot)), sn(static_cast<size_t>(rot));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t pos[3] = {pos_t[t], pos_h[t], pos_w[t]};
    for (int64_t i = 0; i < rot; ++i) {
      const float a = float(pos[i / n]) * inv[size_t(i % n)];
      cs[size_t(i)] = std::cos(a);
      sn[size_t(i)] = std::sin(a);
    }
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * D;
      for (int64_t i = 0; i < rot; ++i) {
        const float a = v[i], b = v[i + rot];
        v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
        v[i + rot] = b * cs[size_t(i)] + a * sn[size_t(i)];
      }
    }
  }
}

void attention_full(const float* q, const float* k, const float* v, int64_t T, int64_t H, int64_t D, float scale,
                    float* out) {
  ThreadPool::global().parallel_for(T * H, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(static_cast<size_t>(T));
    for (int64_t th = lo; th < hi; ++th) {
      const int64_t t = th / H, h = th % H;
      const float* qr = q + (t * H + h) * D;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        const float* kr = k + (j * H + h) * D;
        float d = 0.f;
        for (int64_t i = 0; i < D; ++i) d += qr[i] * kr[i];
        s[size_t(j)] = d * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < T; ++j) {
        s[size_t(j)] = std::exp(s[size_t(j)] - mx);
        sum += s[size_t(j)];
      }
      const float inv = float(1.0 / sum);
      float* o = out + (t * H + h) * D;
      for (int64_t i = 0; i < D; ++i) o[i] = 0.f;
      for (int64_t j = 0; j < T; ++j) {
        const float p = s[size_t(j)] * inv;
        const float* vr = v + (j * H + h) * D;
        for (int64_t i = 0; i < D; ++i) o[i] += p * vr[i];
      }
    }
  });
}

}  // namespace m3::cpu
