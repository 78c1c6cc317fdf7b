// Large pixel buffers (src/media/big_buffer.cpp): 2 MiB-aligned, reused after free, small ones untouched.
#include <gtest/gtest.h>

#include <cstdint>

#include "media/image.h"

namespace m3::media {
namespace {

TEST(MediaBigBuffer, TensorSizedBuffersAreHugePageAligned) {
  FloatBuffer t;
  t.resize(size_t(2304) * kRowWidth);  // a 1080p image's tensor, 10.8 MB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % (uintptr_t(2) << 20), 0u);
  t.back() = 1.0f;  // the whole rounded block is writable
  EXPECT_EQ(t.back(), 1.0f);
}

TEST(MediaBigBuffer, AFreedBlockServesTheNextBufferOfItsSize) {
  const size_t n = size_t(1296) * kRowWidth;  // 6.1 MB
  const float* first = nullptr;
  {
    FloatBuffer a(n);
    first = a.data();
  }
  FloatBuffer b(n);
  EXPECT_EQ(b.data(), first);
}

TEST(MediaBigBuffer, SmallBuffersUseTheOrdinaryHeap) {
  ByteBuffer small(4096);
  ByteBuffer big(detail::kBigBufferBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % (uintptr_t(2) << 20), 0u);
  // malloc's 16-byte alignment; a 4 KiB heap block is not 2 MiB-aligned by design (only checked where it is not).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 16, 0u);
}

}  // namespace
}  // namespace m3::media
