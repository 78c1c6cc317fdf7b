// Host glue of the CUDA backend that needs fmt (kept out of .cu files).
#include "backend/cuda/common.cuh"

#include <atomic>
#include <cstdarg>
#include <cstdio>

#include "base/error.h"

namespace m3::cuda {

void raise_cuda_error(const char* expr, int code, const char* msg, const char* file, int line) {
  fail("CUDA error {} ({}) in {} at {}:{}", msg, code, expr, file, line);
}

void failf(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  fail("{}", buf);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later checks start clean
    return 0;
  }
  return n;
}

namespace {
std::atomic<uint64_t> g_alloc_epoch{0};
}

uint64_t alloc_epoch() { return g_alloc_epoch.load(std::memory_order_relaxed); }
void bump_alloc_epoch() { g_alloc_epoch.fetch_add(1, std::memory_order_relaxed); }

int sm_count() {
  static const int n = [] {
    int dev = 0, c = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      return 132;
    }
    return c;
  }();
  return n;
}

}  // namespace m3::cuda
