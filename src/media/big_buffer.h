// Memory for the large pixel buffers (decoded pictures, [rows, 1176] tensors): huge pages where the kernel has them.
#pragma once

#include <cstddef>

namespace m3::media::detail {

// Buffers of at least this many bytes come from big_alloc (NoInitAllocator in image.h).
inline constexpr size_t kBigBufferBytes = size_t(4) << 20;

// 2 MiB-aligned anonymous memory advised MADV_HUGEPAGE, or a recently freed block (≤ 64 MiB) of the same rounded
// length.
// Throws std::bad_alloc when the kernel refuses. Pair with big_free(p, the same bytes).
void* big_alloc(size_t bytes);
void big_free(void* p, size_t bytes) noexcept;

}  // namespace m3::media::detail
