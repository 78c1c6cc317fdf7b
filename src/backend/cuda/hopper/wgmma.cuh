// Warpgroup matrix multiply-accumulate (wgmma, sm_90a) as inline PTX, with shared-memory matrix descriptors.
// One warpgroup (4 consecutive warps, the first at a warp index divisible by 4) issues m64nNkK: D[64, N] fp32 in
// registers (+)= A[64, K] · B[N, K]ᵀ with A and B K-major tiles in shared memory in the 128B-swizzle layout that TMA
// writes (hopper/tma.cuh). The operand dtype is a template parameter (bf16: K = 16; e4m3: K = 32 — one k step is
// 32 bytes of a 128-byte row for both).
//
// Accumulator layout (per thread t of the warpgroup, warp w = t / 32, lane l): register i of d[N / 2] holds
//   row = 16·w + l / 4 + 8·((i / 2) % 2),  col = 8·(i / 4) + 2·(l % 4) + i % 2.
// Issue order (docs/KERNELS.md §7): wgmma_fence() before the first mma that touches registers written by ordinary
// code, the mmas, wgmma_commit(), then wgmma_wait<n>() (at most n groups still in flight) before reading d or
// releasing the shared-memory tiles the finished groups read.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/hopper/mbarrier.cuh"

namespace m3::cuda::hopper {

using bf16_t = __nv_bfloat16;
using e4m3_t = __nv_fp8_e4m3;

// Descriptor of a K-major tile in 128B swizzle: rows of 128 bytes (64 bf16), 8-row groups 1024 bytes apart
// (stride byte offset); the leading byte offset is unused by this layout. `p` must lie in a 1024-byte aligned tile;
// stepping K inside the 128-byte row is done by adding bytes / 16 to the descriptor (see desc_advance).
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* p) {
  const uint64_t addr = smem_addr(p);
  uint64_t d = (addr & 0x3FFFFu) >> 4;  // start address, bits 0–13
  d |= uint64_t(1) << 16;               // leading byte offset (ignored for swizzled K-major)
  d |= uint64_t(1024 >> 4) << 32;       // stride byte offset: one 8-row × 128 B core-matrix group
  d |= uint64_t(1) << 62;               // layout: 128B swizzle
  return d;
}
// Descriptor of an MN-major tile in 128B swizzle (B[K, N] with N contiguous, e.g. V [keys, D]): 64-element N chunks
// of 128-byte rows, one K row per 128 bytes, 8-row K groups 1024 bytes apart (stride byte offset), consecutive
// 64-wide N chunks `chunk_bytes` apart (leading byte offset; one TMA box each). Step K by 16 rows = 2048 bytes.
__device__ __forceinline__ uint64_t smem_desc_sw128_mn(const void* p, uint32_t chunk_bytes) {
  const uint64_t addr = smem_addr(p);
  uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= uint64_t((chunk_bytes >> 4) & 0x3FFFu) << 16;
  d |= uint64_t(1024 >> 4) << 32;
  d |= uint64_t(1) << 62;
  return d;
}
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across an asynchronous wgmma region.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// "+f" operand lists of accumulator registers d[i .. i + 63] (the inline asm below names them positionally).
#define M3_WGMMA_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define M3_WGMMA_ACC64(d, i)                                                                                  \
  M3_WGMMA_ACC8(d, i), M3_WGMMA_ACC8(d, i + 8), M3_WGMMA_ACC8(d, i + 16), M3_WGMMA_ACC8(d, i + 24),            \
      M3_WGMMA_ACC8(d, i + 32), M3_WGMMA_ACC8(d, i + 40), M3_WGMMA_ACC8(d, i + 48), M3_WGMMA_ACC8(d, i + 56)

// Wgmma<T, N>::mma_ss(d, desc_a, desc_b, scale_d): one m64nNkK instruction, A and B from shared memory.
template <typename T, int N>
struct Wgmma;

template <>
struct Wgmma<bf16_t, 256> {
  static constexpr int kK = 16;
  // d [64, 256] (+)= A[64, 16] · B[256, 16]ᵀ, both K-major in shared memory; scale_d = 0 overwrites d.
  __device__ __forceinline__ static void mma_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}"
        : M3_WGMMA_ACC64(d, 0), M3_WGMMA_ACC64(d, 64)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
};

template <>
struct Wgmma<bf16_t, 128> {
  static constexpr int kK = 16;
  // d [64, 128] (+)= A[64, 16] · B[128, 16]ᵀ, both K-major in shared memory; scale_d = 0 overwrites d.
  __device__ __forceinline__ static void mma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}"
        : M3_WGMMA_ACC64(d, 0)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
  // d [64, 128] += A[64, 16] · B[16, 128] with A in registers (the accumulator layout of a previous mma, packed
  // to bf16 pairs: a[i] = cols 2·(l % 4) + 8·(i / 2) of rows l / 4 + 8·(i % 2)) and B N-major in shared memory (the
  // V tile [keys, D] of attention read without a transpose; descriptor from smem_desc_sw128_mn).
  __device__ __forceinline__ static void mma_rs_nmajor(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
        : M3_WGMMA_ACC64(d, 0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  }
};

template <>
struct Wgmma<e4m3_t, 128> {
  static constexpr int kK = 32;
  // d [64, 128] (+)= A[64, 32] · B[128, 32]ᵀ, e4m3 × e4m3 → fp32, both K-major in shared memory (the only layout
  // wgmma takes for 8-bit types: no transpose immediates); scale_d = 0 overwrites d.
  __device__ __forceinline__ static void mma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}"
        : M3_WGMMA_ACC64(d, 0)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
};

#undef M3_WGMMA_ACC64
#undef M3_WGMMA_ACC8

}  // namespace m3::cuda::hopper
