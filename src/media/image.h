// Decoded pictures and the preprocessing of docs/M3_MODEL.md §5.1–5.3 (smart resize, torchvision-exact
// antialiased bicubic on uint8, fused rescale+normalise, patchify into 1176-wide rows in 2×2 merge-window order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "media/big_buffer.h"

namespace m3::media {

// A vector allocator whose resize() leaves new elements uninitialised: pixel buffers are always fully written, and
// zero-filling them cost more than the resampling itself (perf on bench_media: memset ≈ 1/3 of the time). Buffers
// of ≥ 4 MiB come from big_alloc (huge pages: big_buffer.cpp says why).
template <typename T>
struct NoInitAllocator : std::allocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind { using other = NoInitAllocator<U>; };
  NoInitAllocator() = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n * sizeof(T) >= detail::kBigBufferBytes) return static_cast<T*>(detail::big_alloc(n * sizeof(T)));
    return std::allocator<T>::allocate(n);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) >= detail::kBigBufferBytes) return detail::big_free(p, n * sizeof(T));
    std::allocator<T>::deallocate(p, n);
  }
  template <typename U>
  void construct(U* p) noexcept { ::new (static_cast<void*>(p)) U; }
  template <typename U, typename... A>
  void construct(U* p, A&&... a) { ::new (static_cast<void*>(p)) U(std::forward<A>(a)...); }
};
using ByteBuffer = std::vector<uint8_t, NoInitAllocator<uint8_t>>;
using FloatBuffer = std::vector<float, NoInitAllocator<float>>;

// Interleaved RGB8, row-major: data[(y*w + x)*3 + c].
struct RgbImage {
  int w = 0, h = 0;
  ByteBuffer data;
  RgbImage() = default;
  RgbImage(int w_, int h_) : w(w_), h(h_), data(size_t(w_) * size_t(h_) * 3) {}
};

struct ResizeLimits {
  int64_t min_pixels = 3136;    // 56²  (docs/M3_MODEL.md §5.1.2)
  int64_t max_pixels = 451584;  // 672²; video frames use 602112
};
inline constexpr int64_t kImageMaxPixels = 451584;
inline constexpr int64_t kVideoFrameMaxPixels = 602112;
inline constexpr int kPatch = 14, kMerge = 2, kTemporal = 2, kFactor = kPatch * kMerge;
inline constexpr int kRowWidth = 3 * kTemporal * kPatch * kPatch;  // 1176

// HF smart_resize (factor 28, double precision, the reference operation order). Returns {h̄, w̄}.
// Throws MediaError when the aspect ratio exceeds 200 or the result has a zero side.
std::pair<int, int> smart_resize(int h, int w, const ResizeLimits& lim);

// PyTorch CPU uint8 antialiased bicubic (a = -0.5), width pass then height pass, each skipped when unchanged.
RgbImage resize_bicubic_aa(const RgbImage& src, int out_h, int out_w);

// Patch rows for one group of frames (1 for an image, 1–2 for a video group: a single frame fills both temporal
// slots). Appends gh*gw rows of 1176 floats to `out` in merge-window order; the frames must share one size.
void append_patch_rows(const RgbImage& f0, const RgbImage& f1, FloatBuffer& out);

// Fused normalisation constants: y = (float(x) - M_c) / S_c in float32 (docs/M3_MODEL.md §5.1.4).
float normalize_value(uint8_t x, int c);

struct PixelTensor {
  FloatBuffer values;          // [rows, 1176]
  int t = 0, gh = 0, gw = 0;  // grid_thw
  int64_t rows() const { return int64_t(t) * gh * gw; }
  int64_t tokens() const { return rows() / (kMerge * kMerge); }
};

// The image processor: smart resize → resample → normalise → patchify (grid_t = 1).
PixelTensor preprocess_image(const RgbImage& img, const ResizeLimits& lim = {});
// The video processor on already-sampled frames (all the same size): per-frame resize to the size smart_resize gives
// for the source frame, pad to even by repeating the last frame, grid_t = ceil(n/2).
PixelTensor preprocess_video(const std::vector<RgbImage>& frames,
                             const ResizeLimits& lim = {3136, kVideoFrameMaxPixels});

// preprocess_image for a picture that arrives top to bottom in batches of rows (a JPEG decoder's scanlines): each
// batch goes through the width pass while it is in cache, so the full-size picture is never stored (where the
// width changes and the AVX2 loops run; otherwise the rows are collected and preprocess_image runs at the end).
// The result equals preprocess_image of the whole picture. Use: while (int n = batch()) { fill row(0 … n−1);
// consume(); } then finish(). Throws MediaError like smart_resize; one thread at a time (thread-local scratch).
class RowStreamPreprocessor {
 public:
  RowStreamPreprocessor(int h, int w, const ResizeLimits& lim = {});
  ~RowStreamPreprocessor();
  RowStreamPreprocessor(const RowStreamPreprocessor&) = delete;
  RowStreamPreprocessor& operator=(const RowStreamPreprocessor&) = delete;
  int batch() const;     // rows to fill now; 0 once every row is in
  uint8_t* row(int i);   // row i of the batch: w*3 bytes of RGB
  void consume();        // the batch is filled
  PixelTensor finish();  // after the last batch

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

namespace detail {
// Tests only: run the portable resample and normalisation loops even where the AVX2 ones would run (they must give
// the same bytes and floats).
void force_scalar_resize(bool on);
// Tests and benchmarks only: use the AVX2 width pass where the AVX-512 one would run (the same bytes).
void disable_avx512(bool on);
}  // namespace detail

}  // namespace m3::media
