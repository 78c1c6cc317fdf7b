// CPU twins of the FP8 formats and GEMMs (backend/cpu/fp8.h).
#include "backend/cpu/fp8.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "base/dtype.h"
#include "base/error.h"

namespace m3::cpu {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 2^e as an fp32 built from its bits (exact for e in [-126, 127]; the formats never leave that range).
float pow2f(int e) { return std::ldexp(1.0f, e); }

float scale_at(const void* scales, Fp8Scale fmt, int64_t N, int64_t K, int64_t n, int64_t k) {
  const int64_t i = fp8_scale_index(fmt, N, K, n, k);
  if (fmt == Fp8Scale::G32) return ue8m0_to_f32(static_cast<const uint8_t*>(scales)[i]);
  return static_cast<const float*>(scales)[i];
}

}  // namespace

uint8_t e4m3_rne(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0x1p-6f) {  // subnormal range: multiples of 2^-9; code 8 (= 2^-6) is the next normal, so no special case
    const int m = int(std::nearbyint(a * 512.0f));
    return sign | uint8_t(m);
  }
  int e = std::ilogb(a);
  int m = int(std::nearbyint((a * pow2f(-e) - 1.0f) * 8.0f));  // exact products; nearbyint: ties to even
  if (m == 8) m = 0, ++e;
  return sign | uint8_t(((e + 7) << 3) | m);
}

int pow2_exponent_for(float amax) {
  if (!(amax > 0.f)) return 0;
  int S = std::ilogb(amax) - 8;  // amax ∈ [2^e, 2^(e+1)); 448·2^(e−8) = 1.75·2^e
  if (amax > 448.0f * pow2f(S)) ++S;
  return S;
}

void fp8_dequant(const uint8_t* q, const void* scales, Fp8Scale fmt, int64_t N, int64_t K, float* out) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      out[n * K + k] = e4m3_to_f32(q[n * K + k]) * scale_at(scales, fmt, N, K, n, k);
}

void fp8_requant_from_mx(const uint8_t* q, const uint8_t* ue8m0, int64_t N, int64_t K, Fp8Scale fmt, uint8_t* q_out,
                         float* s_out) {
  M3_CHECK(fmt != Fp8Scale::G32, "fp8_requant_from_mx: the target must be Row128 or Blk128");
  const int64_t L = ceil_div(K, 128), rows_per_block = fmt == Fp8Scale::Blk128 ? 128 : 1;
  std::fill(s_out, s_out + fp8_scale_count(fmt, N, K), 1.0f);
  const int64_t sk = ceil_div(K, 32);
  auto value = [&](int64_t n, int64_t k) { return e4m3_to_f32(q[n * K + k]) * ue8m0_to_f32(ue8m0[n * sk + k / 32]); };
  for (int64_t n0 = 0; n0 < N; n0 += rows_per_block) {
    const int64_t n1 = std::min(N, n0 + rows_per_block);
    for (int64_t kb = 0; kb < L; ++kb) {
      const int64_t k0 = kb * 128, k1 = std::min(K, k0 + 128);
      float amax = 0.f;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(value(n, k)));
      const int S = pow2_exponent_for(amax);
      const float inv = pow2f(-S);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k) q_out[n * K + k] = e4m3_rne(value(n, k) * inv);
      s_out[fp8_scale_index(fmt, N, K, n0, k0)] = pow2f(S);
    }
  }
}

void mx_quantize(const float* w, int64_t N, int64_t K, uint8_t* q, uint8_t* ue8m0) {
  M3_CHECK(K % 32 == 0, "mx_quantize: K must be a multiple of 32, got {}", K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < K / 32; ++g) {
      const float* src = w + n * K + g * 32;
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
      const int S = std::clamp(pow2_exponent_for(amax), -127, 127);
      ue8m0[n * (K / 32) + g] = uint8_t(S + 127);
      const float inv = std::ldexp(1.0f, -S);
      for (int i = 0; i < 32; ++i) q[n * K + g * 32 + i] = e4m3_rne(src[i] * inv);
    }
}

void fp8_quantize_act_1x128(const float* x, int64_t T, int64_t K, uint8_t* q, float* s, int64_t ld_s) {
  M3_CHECK(K % 128 == 0, "fp8_quantize_act_1x128: K must be a multiple of 128, got {}", K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t kb = 0; kb < K / 128; ++kb) {
      const float* src = x + t * K + kb * 128;
      float amax = 0.f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float sc = amax > 0.f ? amax / 448.0f : 1.0f;
      s[kb * ld_s + t] = sc;
      for (int i = 0; i < 128; ++i) q[t * K + kb * 128 + i] = e4m3_rne(src[i] / sc);
    }
}

void matmul_fp8_w8a16(const float* x, int64_t T, int64_t K, const uint8_t* q, const void* scales, Fp8Scale fmt,
                      int64_t N, float* y) {
  std::vector<float> W(size_t(N * K));
  fp8_dequant(q, scales, fmt, N, K, W.data());
  matmul_nt(x, T, K, W.data(), N, y);
}

void matmul_fp8_blockscaled(const uint8_t* xq, const float* xs, int64_t ld_s, int64_t T, int64_t K, const uint8_t* q,
                            const float* scales, Fp8Scale fmt, int64_t N, float* y) {
  std::vector<float> W(size_t(N * K)), X(size_t(T * K));
  fp8_dequant(q, scales, fmt, N, K, W.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) X[t * K + k] = e4m3_to_f32(xq[t * K + k]) * xs[(k / 128) * ld_s + t];
  matmul_nt(X.data(), T, K, W.data(), N, y);
}

void kv_quantize_e4m3(const float* x, int64_t n, float scale, uint8_t* q) {
  M3_CHECK(scale > 0.f, "kv_quantize_e4m3: scale must be > 0, got {}", scale);
  for (int64_t i = 0; i < n; ++i) q[i] = e4m3_rne(x[i] / scale);
}

void kv_dequantize_e4m3(const uint8_t* q, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(q[i]) * scale;
}

}  // namespace m3::cpu
