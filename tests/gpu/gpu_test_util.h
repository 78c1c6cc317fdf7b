// Helpers for the GPU op harness (in the style of llama.cpp's test-backend-ops): fresh random inputs (never zero),
// device buffers poisoned before each run, every output element checked written, per-dtype tolerances, and a
// one-line report per (op, shape) that scripts/gpu_run.sh collects.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"

namespace m3::gpu_test {

#define M3_SKIP_WITHOUT_GPU()                                       \
  do {                                                              \
    if (::m3::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// One generator per test binary run, seeded freshly (printed, override with M3_GPU_TEST_SEED).
inline std::mt19937_64& rng() {
  static std::mt19937_64 g = [] {
    uint64_t seed = std::random_device{}();
    if (const char* s = std::getenv("M3_GPU_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
    std::printf("[gpu-test] seed %llu\n", (unsigned long long)seed);
    return std::mt19937_64(seed);
  }();
  return g;
}

// Uniform in ±[lo, hi] with a random sign: never zero.
inline std::vector<float> rand_vec(size_t n, float lo = 0.05f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::bernoulli_distribution sgn(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = sgn(rng()) ? u(rng()) : -u(rng());
  return v;
}

template <typename T>
struct Dev {
  cuda::DeviceBuffer<T> buf;
  size_t n = 0;
  Dev() = default;
  explicit Dev(const std::vector<T>& h) { set(h); }
  explicit Dev(size_t count) : n(count) { buf.grow(count); }
  void set(const std::vector<T>& h) {
    n = h.size();
    buf.grow(n);
    if (n) M3_CUDA_CHECK(cudaMemcpy(buf.get(), h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  // Poison: all bytes 0xFF (a NaN for floats, −1 for ints) or 0x7F (a huge id / 3.4e38 float).
  void poison(int byte = 0xFF) { M3_CUDA_CHECK(cudaMemset(buf.get(), byte, n * sizeof(T))); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    M3_CUDA_CHECK(cudaDeviceSynchronize());
    if (n) M3_CUDA_CHECK(cudaMemcpy(h.data(), buf.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* p() { return buf.get(); }
};

struct ErrStats {
  double max_abs = 0, ref_max = 0, rel = 0;
  size_t bad = 0;  // NaN where the reference is finite (unwritten or broken), or mismatched infinities
};

// Compares fp32 outputs; rel = max|got − ref| / max|ref| over finite references. −inf must match exactly.
inline ErrStats compare(const std::vector<float>& got, const std::vector<float>& ref) {
  ErrStats s;
  EXPECT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i]) ++s.bad;
      continue;
    }
    if (std::isnan(got[i]) || std::isnan(ref[i])) {
      if (!(std::isnan(got[i]) && std::isnan(ref[i]))) ++s.bad;
      continue;
    }
    s.max_abs = std::max(s.max_abs, double(std::fabs(got[i] - ref[i])));
    s.ref_max = std::max(s.ref_max, double(std::fabs(ref[i])));
  }
  s.rel = s.ref_max > 0 ? s.max_abs / s.ref_max : s.max_abs;
  return s;
}

// Reports and asserts one (op, shape) result.
inline void expect_close(const std::string& op, const std::string& shape, const std::vector<float>& got,
                         const std::vector<float>& ref, double tol) {
  const ErrStats s = compare(got, ref);
  std::printf("[gpu-op] %-28s %-44s max_abs %.3e  rel %.3e  (tol %.0e)  bad %zu  n %zu\n", op.c_str(), shape.c_str(),
              s.max_abs, s.rel, tol, s.bad, got.size());
  EXPECT_EQ(s.bad, 0u) << op << " " << shape << ": NaN/inf mismatches (unwritten outputs?)";
  EXPECT_LE(s.rel, tol) << op << " " << shape;
}

inline void expect_equal_ids(const std::string& op, const std::string& shape, const std::vector<int32_t>& got,
                             const std::vector<int32_t>& ref) {
  size_t diff = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) diff += got[i] != ref[i];
  std::printf("[gpu-op] %-28s %-44s mismatches %zu of %zu (exact)\n", op.c_str(), shape.c_str(), diff, got.size());
  EXPECT_EQ(got.size(), ref.size());
  EXPECT_EQ(diff, 0u) << op << " " << shape;
}

}  // namespace m3::gpu_test
