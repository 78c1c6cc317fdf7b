// CUDA-event timing shared by the benches (bench_gemm, bench_prefill_tc, bench_msa, bench_vision): `warm` untimed
// calls, then `reps` calls each bracketed by events on stream `s` (default: the legacy default stream); returns the
// per-call times in ms, sorted ascending (median = t[t.size() / 2], spread = front/back).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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

// f(s) captured once into a CUDA graph on a fresh stream (after `eager` plain calls, so first-use work such as
// attribute setting stays outside the capture), then `warm` untimed replays and `reps` timed replays queued back to
// back (no host sync in between, so the GPU never idles waiting for the host); returns each timed replay's ms, in
// order — replay i is the time between the events recorded before and after it.
inline std::vector<float> graph_replay_ms(const std::function<void(cudaStream_t)>& f, int eager, int warm,
                                          int reps) {
  cudaStream_t s;
  M3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < eager; ++i) f(s);
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  M3_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  f(s);
  M3_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  M3_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < warm; ++i) M3_CUDA_CHECK(cudaGraphLaunch(ge, s));
  std::vector<cudaEvent_t> ev(size_t(reps) + 1);
  for (auto& e : ev) M3_CUDA_CHECK(cudaEventCreate(&e));
  M3_CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < reps; ++i) {
    M3_CUDA_CHECK(cudaGraphLaunch(ge, s));
    M3_CUDA_CHECK(cudaEventRecord(ev[size_t(i) + 1], s));
  }
  M3_CUDA_CHECK(cudaEventSynchronize(ev[size_t(reps)]));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]));
    t.push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return t;
}

// Median µs per call and coefficient of variation of 25 graph replays (after 5 warm-ups) of f(s), which makes
// `calls_per_replay` calls — the decode and MoE benchmarks' timing.
struct CallTiming {
  double median_us = 0, cv = 0;
};
inline CallTiming graph_call_timing(const std::function<void(cudaStream_t)>& f, int calls_per_replay) {
  const std::vector<float> ms = graph_replay_ms(f, 1, 5, 25);
  std::vector<double> t;
  for (float x : ms) t.push_back(1e3 * x / calls_per_replay);
  std::vector<double> sorted = t;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0, var = 0;
  for (double x : t) mean += x / double(t.size());
  for (double x : t) var += (x - mean) * (x - mean);
  return CallTiming{sorted[sorted.size() / 2], std::sqrt(var / double(t.size())) / mean};
}

// The MSA benchmark protocol for small kernels: graph replays (launch gaps do not count, as in a graph-replayed
// serving step), sorted ascending like time_sorted_ms.
inline std::vector<float> time_graph_sorted_ms(const std::function<void(cudaStream_t)>& f, int warm, int reps) {
  std::vector<float> t = graph_replay_ms(f, std::max(warm, 1), 1, reps);
  std::sort(t.begin(), t.end());
  return t;
}

}  // namespace m3::bench
