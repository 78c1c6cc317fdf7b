// GEMMs through cuBLASLt: y[T, N] (+)= x[T, K] · W[N, K]ᵀ, row-major, FP32 accumulate, FP32 output.
// Weights are BF16 (the serving default; x is rounded to BF16 on the fly) or FP32 (exact fp32 math, used to compare
// whole-model logits with the CPU reference at tight tolerance).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/common.cuh"

namespace m3::cuda {

enum class WType : uint8_t { F32, BF16 };

// Rounds n fp32 values to bf16 (round-to-nearest-even), stream-ordered. dst: [n] __nv_bfloat16 as uint16_t.
void f32_to_bf16(const float* src, int64_t n, uint16_t* dst, cudaStream_t s);

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[T, N] = x[T, K] · W[N, K]ᵀ (+ y when accumulate). x, y fp32 on the device, W of type wt.
  // T = 0 is a no-op. Throws m3::Error on any cuBLASLt failure (unsupported shape, no algorithm).
  void nt(const float* x, int64_t T, int64_t K, const void* W, WType wt, int64_t N, float* y, bool accumulate,
          cudaStream_t s);
  // The same with x already bf16 (xb: [T, K] bf16 bits, e.g. a tensor-core attention output) and bf16 weights.
  void nt_bf16(const uint16_t* xb, int64_t T, int64_t K, const void* W, int64_t N, float* y, bool accumulate,
               cudaStream_t s);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int>;  // T, K, N, wtype, accumulate, alignment
  Plan& plan_for(int64_t T, int64_t K, int64_t N, WType wt, bool accumulate, int align);
  void matmul(const void* xin, int64_t T, int64_t K, const void* W, WType wt, int64_t N, float* y, bool accumulate,
              cudaStream_t s);

  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer<uint8_t> workspace_;
  DeviceBuffer<uint16_t> xb_;  // x rounded to bf16
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace m3::cuda
