// Element types of the KV / index-K pools (issue 9): fp32 for the exact verification path (--dtype float32), bf16
// for serving. Kernels that read or write the cache are templated on the element type; the views carry a tag and
// run() dispatches. Loads widen to fp32 in registers, stores round to nearest even (the CPU twin: f32_to_bf16 in
// base/dtype.h), so a bf16 cache differs from the fp32 reference by the rounding of K, V and index-K only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace m3::cuda {

// E4M3: FP8 pools with per-tensor scales (kv_fp8.cuh; issue 15 item 4). Written by heads_norm_rope and
// kv_quantize_e4m3, read by PagedDecodeTc<e4m3_t> and MsaDecodeIndex::run<e4m3_t>; the other cache readers take
// F32 / BF16 only (the executor's prefill reads a bf16 staging copy made by kv_dequantize_pages_e4m3).
enum class KvType : uint8_t { F32, BF16, E4M3 };

inline size_t kv_elem_bytes(KvType t) { return t == KvType::BF16 ? 2 : t == KvType::E4M3 ? 1 : 4; }

#ifdef __CUDACC__
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ float kv_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Four consecutive elements as a float4: p 16-byte aligned (fp32) or 8-byte aligned (bf16).
__device__ __forceinline__ float4 kv_load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 kv_load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
#endif

}  // namespace m3::cuda
