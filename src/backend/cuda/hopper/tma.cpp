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

}  // namespace

CUtensorMap make_tma_map_2d(const void* base, TmaDtype dt, uint64_t rows, uint64_t cols, uint64_t row_stride,
                            uint32_t box_rows, uint32_t box_cols, TmaSwizzle swizzle) {
  const uint32_t elem = dt == TmaDtype::F32 ? 4 : dt == TmaDtype::BF16 ? 2 : 1;
  const CUtensorMapDataType type = dt == TmaDtype::F32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dt == TmaDtype::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  M3_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(base) % 16 == 0, "TMA base %p is not 16-byte aligned", base);
  M3_CUDA_REQUIRE((row_stride * elem) % 16 == 0, "TMA row stride of %llu bytes is not a multiple of 16",
                  (unsigned long long)(row_stride * elem));
  M3_CUDA_REQUIRE(rows > 0 && cols > 0 && box_rows >= 1 && box_rows <= 256 && box_cols >= 1 && box_cols <= 256,
                  "TMA shape [%llu, %llu] box [%u, %u] out of range", (unsigned long long)rows,
                  (unsigned long long)cols, box_rows, box_cols);
  M3_CUDA_REQUIRE(swizzle != TmaSwizzle::B128 || box_cols * elem == 128,
                  "a 128B-swizzled TMA box needs 128-byte rows (got %u bytes)", box_cols * elem);
  CUtensorMap map;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride * elem};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estride[2] = {1, 1};
  const CUresult r = encoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box, estride,
                               CU_TENSOR_MAP_INTERLEAVE_NONE,
                               swizzle == TmaSwizzle::B128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  M3_CUDA_REQUIRE(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult %d) for [%llu, %llu] box [%u, %u]",
                  int(r), (unsigned long long)rows, (unsigned long long)cols, box_rows, box_cols);
  return map;
}

}  // namespace m3::cuda::hopper
