// The NCCL communicator (issue 17) on the GPUs of one host: the collectives' results, one thread per rank. Needs
// two devices; skips otherwise (the one-GPU machine included).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "dist/nccl_communicator.h"

namespace m3 {
namespace {

int devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

TEST(GpuNccl, AllGatherAndReduceScatterAcrossTheDevicesOfOneHost) {
  const int P = devices();
  if (P < 2) GTEST_SKIP() << "needs 2 GPUs, found " << P;
  std::vector<int> ids(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) ids[size_t(i)] = i;
  dist::NcclGroup g(ids);
  const size_t n = 1024;
  std::vector<std::vector<float>> gathered(static_cast<size_t>(P)), scattered(static_cast<size_t>(P));
  std::vector<std::thread> th;
  for (int r = 0; r < P; ++r)
    th.emplace_back([&, r] {
      cudaSetDevice(g.device(r));
      dist::Communicator& c = g.rank(r);
      std::vector<float> mine(n), all(n * size_t(P));
      for (size_t i = 0; i < n * size_t(P); ++i) all[i] = float(r + 1);  // reduce_scatter input: (r + 1) everywhere
      for (size_t i = 0; i < n; ++i) mine[i] = float(r * 10000 + int(i));
      float *d_mine, *d_gather, *d_all, *d_out;
      cudaMalloc(&d_mine, n * 4), cudaMalloc(&d_gather, n * 4 * size_t(P)), cudaMalloc(&d_all, n * 4 * size_t(P));
      cudaMalloc(&d_out, n * 4);
      cudaMemcpy(d_mine, mine.data(), n * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(d_all, all.data(), n * 4 * size_t(P), cudaMemcpyHostToDevice);
      c.all_gather(d_mine, n * 4, d_gather);
      c.reduce_scatter_sum(d_all, d_out, n);
      c.barrier();
      gathered[size_t(r)].resize(n * size_t(P)), scattered[size_t(r)].resize(n);
      cudaMemcpy(gathered[size_t(r)].data(), d_gather, n * 4 * size_t(P), cudaMemcpyDeviceToHost);
      cudaMemcpy(scattered[size_t(r)].data(), d_out, n * 4, cudaMemcpyDeviceToHost);
      cudaFree(d_mine), cudaFree(d_gather), cudaFree(d_all), cudaFree(d_out);
    });
  for (auto& t : th) t.join();
  const float sum = float(P * (P + 1) / 2);
  for (int r = 0; r < P; ++r) {
    for (int q = 0; q < P; ++q)
      for (size_t i = 0; i < n; i += 97) EXPECT_EQ(gathered[size_t(r)][size_t(q) * n + i], float(q * 10000 + int(i)));
    for (size_t i = 0; i < n; i += 97) EXPECT_EQ(scattered[size_t(r)][i], sum);
  }
}

}  // namespace
}  // namespace m3
