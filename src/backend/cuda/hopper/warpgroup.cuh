// Warp specialisation helpers for sm_90a: warpgroup roles, register re-allocation (setmaxnreg), proxy fences and
// programmatic dependent launch (PDL). setmaxnreg needs a kernel with a register cap at entry
// (__launch_bounds__(threads, 1)) and each role in one branch of an if/else (docs/KERNELS.md §7).
#pragma once

#include <cstdint>

namespace m3::cuda::hopper {

__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }

// Gives registers back to the pool (producer) / takes them (consumers). Counts are multiples of 8 in [24, 256].
template <uint32_t Regs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}
template <uint32_t Regs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA, wgmma) reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier among `threads` threads of the CTA (id 0 is __syncthreads'); lets one warpgroup sync alone.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Counts this thread's arrival at named barrier `id` without waiting (the producer side of a hand-off: the
// threads that bar.sync on it proceed once `threads` arrivals, theirs included, have come in).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// PDL: the dependent grid may start its prologue once every CTA called launch_dependents (or exited);
// grid_dependency_wait blocks until the preceding grid has completed and its memory is visible.
// Both are no-ops when the kernel was launched without the programmatic-serialization attribute.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace m3::cuda::hopper
