// CUDA-event timing shared by the benches (bench_gemm, bench_prefill_tc, bench_msa, bench_vision): `warm` untimed
// calls, then `reps` calls each bracketed by events on stream `s` (default: the legacy default stream); returns the
// per-call times in ms, sorted ascending (median = t[t.size() / 2], spread = front/back).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "backend/cuda/common.cuh"

namespace m3::bench {

inline std::vector<float> time_sorted_ms(const std::function<void()>& f, int warm, int reps,
                                         cudaStream_t s = nullptr) {
  cudaEvent_t a, b;
  M3_CUDA_CHECK(cudaEventCreate(&a));
  M3_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) f();
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    M3_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    M3_CUDA_CHECK(cudaEventRecord(b, s));
    M3_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t;
}

}  // namespace m3::bench
