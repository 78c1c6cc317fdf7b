// Large pixel buffers straight from mmap (big_buffer.h). Why: a 1080p image's tensor is 10.8 MB, and the media cache
// (gateway.cpp) keeps every tensor it makes, so each image's tensor is fresh memory: with 4 KiB pages that is ≈ 2,600
// page faults per image, and on the dev VM (bench/results/2026-12-02c-media-cpu.md) faults cost more than the whole
// decode + preprocessing. 2 MiB-aligned blocks advised MADV_HUGEPAGE take 6 faults where transparent huge pages are
// in `madvise` or `always` mode (elsewhere the advice is ignored and nothing changes). A few freed blocks (≤ 64 MiB
// each, so at most 256 MiB) are kept for the next buffer of the same rounded length, already faulted in. Cost: the
// length is rounded up to 2 MiB (12 MiB for a 10.8 MB tensor).
#include "media/big_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace m3::media::detail {
namespace {

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kKeep = 4;                  // freed blocks kept for reuse …
constexpr size_t kKeepMax = size_t(64) << 20;  // … of at most 64 MiB each (a 1080p tensor is 12 MiB rounded; a long
                                               // video's can be hundreds of MiB and is given back at once)

size_t rounded(size_t bytes) { return (bytes + kHuge - 1) / kHuge * kHuge; }

struct FreeBlocks {
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> blocks;  // (block, rounded length), oldest first
};
FreeBlocks& free_blocks() {
  static FreeBlocks* f = new FreeBlocks;  // never destroyed: buffers may be freed during static destruction
  return *f;
}

}  // namespace

void* big_alloc(size_t bytes) {
  const size_t len = rounded(bytes);
  {
    FreeBlocks& f = free_blocks();
    std::lock_guard lock(f.mu);
    for (size_t i = f.blocks.size(); i-- > 0;)
      if (f.blocks[i].second == len) {
        void* p = f.blocks[i].first;
        f.blocks.erase(f.blocks.begin() + std::ptrdiff_t(i));
        return p;
      }
  }
  // Map one huge page more than needed, then unmap the unaligned head and the tail.
  void* raw = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t a = (r + kHuge - 1) / kHuge * kHuge;
  if (a > r) munmap(raw, a - r);
  if (const size_t tail = r + len + kHuge - (a + len)) munmap(reinterpret_cast<void*>(a + len), tail);
  void* p = reinterpret_cast<void*>(a);
  madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP the block is ordinary memory
  return p;
}

void big_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  const size_t len = rounded(bytes);
  if (len > kKeepMax) {
    munmap(p, len);
    return;
  }
  std::pair<void*, size_t> evict{nullptr, 0};
  {
    FreeBlocks& f = free_blocks();
    std::lock_guard lock(f.mu);
    if (f.blocks.size() == kKeep) {
      evict = f.blocks.front();
      f.blocks.erase(f.blocks.begin());
    }
    f.blocks.emplace_back(p, len);
  }
  if (evict.first) munmap(evict.first, evict.second);
}

}  // namespace m3::media::detail
