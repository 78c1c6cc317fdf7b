// Tensor Memory Accelerator (TMA): host-side tensor maps and the device-side bulk tensor copies (shared ↔ global).
// A map describes a 2-D row-major tensor [rows, cols] (cols contiguous) and the box one copy moves; the copy lands
// in shared memory in the map's swizzle layout (128B swizzle: rows of 128 bytes, 16-byte chunks XOR-permuted by
// row % 8, the layout wgmma's 128B-swizzle descriptors read; docs/KERNELS.md §7). Out-of-bounds box elements are
// filled with zeros, so tiles that overhang the tensor's edge need no special case in the mainloop.
// Maps are passed to kernels by value as `const __grid_constant__ CUtensorMap`.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched from the runtime, no -lcuda)

#include <cstdint>

#ifdef __CUDACC__
#include "backend/cuda/hopper/mbarrier.cuh"
#endif

namespace m3::cuda::hopper {

enum class TmaDtype : uint8_t { BF16, F32, U8 };
enum class TmaSwizzle : uint8_t { None, B128 };

// Map over `base` viewed as [rows, cols] with `row_stride` elements between rows; one copy moves
// [box_rows, box_cols]. Throws m3::Error when the driver rejects it (base not 16-byte aligned, row stride not a
// multiple of 16 bytes, box over 256, a 128B-swizzled box whose row is not 128 bytes, ...).
CUtensorMap make_tma_map_2d(const void* base, TmaDtype dt, uint64_t rows, uint64_t cols, uint64_t row_stride,
                            uint32_t box_rows, uint32_t box_cols, TmaSwizzle swizzle);
// 3-D map: dims {d0 (contiguous), d1, d2}, element strides s1, s2 of dims 1 and 2, box {b0, b1, b2}; a box lands in
// shared memory as b2·b1 rows of b0 elements (the paged HND cache [P, Hkv·B, D], q [T, Hq, D]).
CUtensorMap make_tma_map_3d(const void* base, TmaDtype dt, const uint64_t dims[3], const uint64_t strides[2],
                            const uint32_t box[3], TmaSwizzle swizzle);

#ifdef __CUDACC__
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Copies the box whose first element is (row, col) into `dst` (shared, 1024-byte aligned for 128B swizzle) and
// signals `bar` with the box's byte count (the waiter must have announced it with mbar_arrive_expect_tx).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// The reverse copy: the box at `src` (shared, in the map's swizzle layout, 1024-byte aligned for 128B swizzle) to the
// tensor at (c0, c1, c2), as one bulk-async group of this thread. Make the thread's (and, after a __syncwarp, the
// warp's) generic shared-memory writes visible first (fence_proxy_async_smem); before `src` is written again, this
// thread waits with tma_store_wait_read.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(src))
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed store groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
#endif

}  // namespace m3::cuda::hopper
