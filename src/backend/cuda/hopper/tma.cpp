// Host side of hopper/tma.cuh: cuTensorMapEncodeTiled fetched once through the runtime's driver entry point, so the
// backend needs no link against libcuda.
#include "backend/cuda/hopper/tma.cuh"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "backend/cuda/common.cuh"

namespace m3::cuda::hopper {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    M3_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    M3_CUDA_REQUIRE(q == cudaDriverEntryPointSuccess && p, "cuTensorMapEncodeTiled is not available in this driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// dims[0] is contiguous; strides[i] (elements) is the step of dims[i + 1].
CUtensorMap encode(const void* base, TmaDtype dt, int rank, const uint64_t* dims, const uint64_t* strides,
                   const uint32_t* box, TmaSwizzle swizzle) {
  const uint32_t elem = dt == TmaDtype::F32 ? 4 : dt == TmaDtype::BF16 ? 2 : 1;
  const CUtensorMapDataType type = dt == TmaDtype::F32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dt == TmaDtype::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(base) % 16 == 0, "TMA base %p is not 16-byte aligned", base);
  cuuint64_t gdims[3], gstrides[2];
  cuuint32_t gbox[3], estride[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    M3_CUDA_REQUIRE(dims[i] > 0 && box[i] >= 1 && box[i] <= 256, "TMA dim %d: size %llu box %u out of range", i,
                    (unsigned long long)dims[i], box[i]);
    gdims[i] = dims[i];
    gbox[i] = box[i];
    if (i + 1 < rank) {
      M3_CUDA_REQUIRE((strides[i] * elem) % 16 == 0, "TMA stride of %llu bytes is not a multiple of 16",
                      (unsigned long long)(strides[i] * elem));
      gstrides[i] = strides[i] * elem;
    }
  }
  M3_CUDA_REQUIRE(swizzle != TmaSwizzle::B128 || box[0] * elem == 128,
                  "a 128B-swizzled TMA box needs 128-byte rows (got %u bytes)", box[0] * elem);
  CUtensorMap map;
  const CUresult r = encoder()(&map, type, cuuint32_t(rank), const_cast<void*>(base), gdims, gstrides, gbox, estride,
                               CU_TENSOR_MAP_INTERLEAVE_NONE,
                               swizzle == TmaSwizzle::B128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  M3_CUDA_REQUIRE(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult %d) for a rank-%d map", int(r), rank);
  return map;
}

}  // namespace

CUtensorMap make_tma_map_2d(const void* base, TmaDtype dt, uint64_t rows, uint64_t cols, uint64_t row_stride,
                            uint32_t box_rows, uint32_t box_cols, TmaSwizzle swizzle) {
  const uint64_t dims[2] = {cols, rows}, strides[1] = {row_stride};
  const uint32_t box[2] = {box_cols, box_rows};
  return encode(base, dt, 2, dims, strides, box, swizzle);
}

CUtensorMap make_tma_map_3d(const void* base, TmaDtype dt, const uint64_t dims[3], const uint64_t strides[2],
                            const uint32_t box[3], TmaSwizzle swizzle) {
  return encode(base, dt, 3, dims, strides, box, swizzle);
}

}  // namespace m3::cuda::hopper
