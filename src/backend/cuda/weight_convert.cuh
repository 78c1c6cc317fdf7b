// Weight conversion on the device (issue 9 item 5): checkpoint bytes staged to the GPU are converted there to the
// executor's compute dtype, so no fp32 copy of the model ever exists on the host. The results are bit for bit what
// the host path gives (SafeTensors::read_f32 to fp32, then base/dtype.h f32_to_bf16 for bf16 weights), which
// tests/gpu/gpu_load_test.cpp checks on the fixture checkpoints. Also the dummy weights' fill (base/counter_hash.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace m3::cuda {

enum class SrcType : uint8_t { F32, F64, BF16, F16, E4M3 };

// dst[i] = convert(src[i]) for i ∈ [0, n): dst is bf16 (round to nearest even, NaN kept quiet) when dst_bf16, else
// fp32. E4M3 (MXFP8) needs `scales`: one UE8M0 byte per 32 consecutive elements of a row of `cols` elements, rows of
// `scols` bytes; `base` is the index of src[0] within its tensor (a chunk of a larger tensor).
void convert_weights(const void* src, SrcType st, int64_t n, void* dst, bool dst_bf16, const uint8_t* scales = nullptr,
                     int64_t base = 0, int64_t cols = 1, int64_t scols = 1, cudaStream_t s = nullptr);

// dst[i] = counter_uniform(key, i, scale) (base/counter_hash.h) for i ∈ [0, n), in bf16 or fp32.
void fill_counter_uniform(void* dst, bool dst_bf16, int64_t n, uint64_t key, float scale, cudaStream_t s = nullptr);

}  // namespace m3::cuda
