// Warp-level tensor-core and async-copy primitives (sm_80+ PTX, used on sm_90a): cp.async with zero fill and an
// optional L2 evict-first policy, ldmatrix (plain and transposed), mma.sync m16n8k16 bf16 → fp32, PDL controls,
// and what the decode kernels share: the 128-dim bf16 shared-memory tile swizzle and the online-softmax step
// (docs/KERNELS.md §9).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace m3::cuda {

#ifdef __CUDACC__
// A [rows, 128] bf16 tile in shared memory: a row is 256 bytes = 16 chunks of 16 bytes; chunk c of row r is stored
// at chunk c ^ (r & 7), so the 8 row addresses of one ldmatrix 8×8 matrix hit 8 distinct 16-byte bank groups.
__device__ __forceinline__ uint32_t swz128(int row, int chunk) {
  return uint32_t(row * 256 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 16-byte async copy global → shared; src_bytes = 0 writes zeros (masked rows never carry stale or NaN data).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16_policy(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "l"(policy));
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c[4] += A[16×16] · B[16×8]; a: 4 bf16x2 regs (row-major A fragment), b: 2 bf16x2 regs (column-major B fragment).
__device__ __forceinline__ void mma_bf16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same shape on f16 operands (fp32 accumulate): exact e4m3 values become f16 in one cvt per pair (kv_fp8.cuh).
__device__ __forceinline__ void mma_f16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (sm_90): let the next grid in the stream start launching; wait until the previous
// grid completed and its writes are visible. Both are no-ops in grids launched without the programmatic
// stream-serialization attribute.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// The online-softmax step of the decode kernels on N n-tiles of S accumulators (m16n8 layout: sc[j][0..1] row
// g = lane / 4, sc[j][2..3] row g + 8, token tb + 8j + (e & 1) for element e, tb = the warp's first token +
// 2·(lane % 4)): scale by sl2 (log2 domain), mask tokens ≥ vis to −inf, take the row max over the quad, rescale the
// running (m, l) and the 16 O n-tiles, and leave P = exp2(S − m) in sc for the P·V mma.
template <int N>
__device__ __forceinline__ void online_softmax_step(float (&sc)[N][4], int tb, int vis, float sl2, float& m0,
                                                    float& m1, float& l0, float& l1, float (&o)[16][4]) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = tb + j * 8 + (e & 1) < vis ? sc[j][e] * sl2 : -INFINITY;
      sc[j][e] = x;
      if (e < 2) mx0 = fmaxf(mx0, x);
      else mx1 = fmaxf(mx1, x);
    }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
  // A row with no valid key yet keeps m = −inf: subtract 0 instead so exp2 gives 0, never NaN.
  const float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
  const float al0 = exp2f(m0 - b0), al1 = exp2f(m1 - b1);
  m0 = mn0, m1 = mn1;
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    sc[j][0] = exp2f(sc[j][0] - b0), sc[j][1] = exp2f(sc[j][1] - b0);
    sc[j][2] = exp2f(sc[j][2] - b1), sc[j][3] = exp2f(sc[j][3] - b1);
    s0 += sc[j][0] + sc[j][1], s1 += sc[j][2] + sc[j][3];
  }
  l0 = l0 * al0 + s0, l1 = l1 * al1 + s1;
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] *= al0, o[n][1] *= al0, o[n][2] *= al1, o[n][3] *= al1;
}

// A GPU-scope acquire-release fence: the release / acquire halves of a flag or ticket hand-off between CTAs (cheaper
// than __threadfence's sequentially consistent fence).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
#endif

}  // namespace m3::cuda
