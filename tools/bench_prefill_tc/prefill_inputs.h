// Inputs shared by the prefill benchmarks (bench_prefill_tc, bench_prefill_cases): random bf16 device buffers and
// synthetic MSA selections at M3 shapes (4 KV heads, top-16, 128-token blocks).
//   random: history blocks uniform without replacement (low neighbour overlap, the vLLM anchor's setting);
//   spread: history spread evenly over [0, local) with a per-head offset (neighbouring rows choose the same blocks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm.cuh"

namespace m3::bench {

void fill_uniform(float* p, int64_t n, uint64_t seed, float lo, float hi);

// Device bf16 buffer of n random values (never zero).
inline void fill_bf16(cuda::DeviceBuffer<uint16_t>& dst, size_t n, uint64_t seed) {
  cuda::DeviceBuffer<float> tmp(n);
  fill_uniform(tmp.get(), int64_t(n), seed, 0.05f, 1.f);
  cuda::f32_to_bf16(tmp.get(), int64_t(n), dst.get(), nullptr);
  M3_CUDA_CHECK(cudaDeviceSynchronize());
}

// Selection [Hkv, T, top_k] for rows at positions pos (contract: history unique and < local, local last, −1 pad).
inline std::vector<int32_t> make_selection(const std::vector<int32_t>& pos, bool spread, std::mt19937_64& g,
                                           int Hkv = 4, int top_k = 16, int block = 128) {
  const int T = int(pos.size());
  std::vector<int32_t> sel(size_t(Hkv) * T * top_k, -1);
  for (int h = 0; h < Hkv; ++h)
    for (int t = 0; t < T; ++t) {
      const int local = pos[t] / block, nh = std::min(top_k - 1, local);
      int32_t* row = &sel[(size_t(h) * T + t) * top_k];
      if (spread) {
        for (int i = 0; i < nh; ++i) row[i] = int32_t((i + (h + 0.5) / Hkv) * local / nh);
      } else {
        std::set<int32_t> picked;
        std::uniform_int_distribution<int32_t> u(0, std::max(0, local - 1));
        while (int(picked.size()) < nh) picked.insert(u(g));
        int i = 0;
        for (int32_t b : picked) row[i++] = b;
      }
      row[nh] = local;
    }
  return sel;
}

// Useful attention FLOPs of rows at positions pos by the MSA convention: 4·D·Hq·Σ selected tokens.
inline double sparse_useful_flops(const std::vector<int32_t>& pos, int Hq, int D = 128, int top_k = 16, int block = 128) {
  double toks = 0;
  for (int p : pos) toks += double((std::min(top_k, p / block + 1) - 1) * block + p % block + 1);
  return 4.0 * D * Hq * toks;
}

}  // namespace m3::bench
