// Preprocessing of docs/M3_MODEL.md §5.1–5.3, matched to HF 5.17's CPU path (tests/media/media_fixture_test.cpp).
#include "media/image.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define M3_MEDIA_X86 1
#endif

#include "media/media_error.h"

namespace m3::media {

namespace detail {
std::atomic<bool> g_force_scalar_resize{false};
void force_scalar_resize(bool on) { g_force_scalar_resize.store(on); }
std::atomic<bool> g_no_avx512{false};
void disable_avx512(bool on) { g_no_avx512.store(on); }
}  // namespace detail

std::pair<int, int> smart_resize(int h, int w, const ResizeLimits& lim) {
  if (h <= 0 || w <= 0) media_fail("image has an empty side ({}x{})", w, h);
  // Aspect check first, in double, exactly 200 accepted (HF: "absolute aspect ratio must be smaller than 200").
  const double ratio = double(std::max(h, w)) / double(std::min(h, w));
  if (ratio > 200.0) media_fail("image aspect ratio {:.1f} ({}x{}) exceeds the limit of 200", ratio, w, h);
  const double f = kFactor;
  // Python round(): ties to even — nearbyint under the default FE_TONEAREST mode.
  double hb = f * std::nearbyint(double(h) / f);
  double wb = f * std::nearbyint(double(w) / f);
  const double hw = double(h) * double(w);
  if (hb * wb > double(lim.max_pixels)) {
    const double beta = std::sqrt(hw / double(lim.max_pixels));
    hb = std::max(f, f * std::floor(double(h) / beta / f));  // order `side / β / 28` matters (176×2816)
    wb = std::max(f, f * std::floor(double(w) / beta / f));
  } else if (hb * wb < double(lim.min_pixels)) {
    const double beta = std::sqrt(double(lim.min_pixels) / hw);
    hb = f * std::ceil(double(h) * beta / f);
    wb = f * std::ceil(double(w) * beta / f);
  }
  if (hb < f || wb < f || hb > 1e6 || wb > 1e6) media_fail("image {}x{} has no valid target size", w, h);
  return {int(hb), int(wb)};
}

namespace {

// One axis of torch's uint8 antialiased resample: per output index a tap window and int16 weights at precision P.
struct AxisTaps {
  int P = 0;
  int ksize = 0;                 // taps stored per output (max window)
  std::vector<int> xmin, n;      // [out]
  std::vector<int16_t> q;        // [out, ksize]
};

double keys_cubic(double x) {  // a = -0.5, torch's aa_filter for bicubic
  const double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

AxisTaps make_taps(int in, int out) {
  AxisTaps t;
  const double scale = double(in) / double(out);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double inv = scale >= 1.0 ? 1.0 / scale : 1.0;
  t.ksize = int(std::ceil(support)) * 2 + 1;
  t.xmin.resize(out);
  t.n.resize(out);
  std::vector<double> w(size_t(out) * t.ksize, 0.0);
  double wmax = 0.0;
  for (int i = 0; i < out; ++i) {
    const double c = scale * (i + 0.5);
    const int64_t xmin = std::max<int64_t>(int64_t(c - support + 0.5), 0);
    const int64_t n = std::min<int64_t>(int64_t(c + support + 0.5), in) - xmin;
    t.xmin[i] = int(xmin);
    t.n[i] = int(std::clamp<int64_t>(n, 0, t.ksize));
    double* wi = &w[size_t(i) * t.ksize];
    double total = 0.0;
    for (int j = 0; j < t.n[i]; ++j) {
      wi[j] = keys_cubic((j + xmin - c + 0.5) * inv);
      total += wi[j];
    }
    for (int j = 0; j < t.n[i]; ++j) {
      if (total != 0.0) wi[j] /= total;
      wmax = std::max(wmax, wi[j]);
    }
  }
  int p = 0;
  for (; p < 22; ++p) {
    if (int(0.5 + wmax * double(1 << (p + 1))) >= (1 << 15)) break;
  }
  t.P = p;
  t.q.assign(w.size(), 0);
  const double s = double(1 << p);
  for (size_t k = 0; k < w.size(); ++k) t.q[k] = int16_t(int(w[k] * s + (w[k] < 0 ? -0.5 : 0.5)));
  return t;
}

inline uint8_t clamp_shift(int32_t acc, int P) {
  int32_t v = acc >> P;  // arithmetic shift (C++20 defines it for negatives)
  return uint8_t(std::clamp(v, 0, 255));
}

// Vertical taps over rows of `stride` bytes: out row y = Σ_j q_j · src row (xmin_y + j). The inner loop runs along a
// whole row, so it vectorises; the horizontal pass reuses it on the transposed image.
void vertical_pass(const uint8_t* src, size_t stride, const AxisTaps& t, int out_rows, uint8_t* dst) {
  const int32_t half = 1 << (t.P - 1);
  thread_local std::vector<int32_t> acc;
  acc.resize(stride);
  for (int y = 0; y < out_rows; ++y) {
    std::fill(acc.begin(), acc.end(), half);
    const int16_t* q = &t.q[size_t(y) * t.ksize];
    // Integer adds are exact in any order: the same sums as torch's per-element loop.
    for (int j = 0; j < t.n[y]; ++j) {
      const uint8_t* row = src + size_t(t.xmin[y] + j) * stride;
      const int32_t qj = q[j];
      int32_t* a = acc.data();
      for (size_t k = 0; k < stride; ++k) a[k] += int32_t(row[k]) * qj;
    }
    uint8_t* orow = dst + size_t(y) * stride;
    for (size_t k = 0; k < stride; ++k) orow[k] = clamp_shift(acc[k], t.P);
  }
}

// [h, w, 3] → [w, h, 3], in tiles for cache locality.
void transpose_rgb(const uint8_t* src, int h, int w, uint8_t* dst) {
  constexpr int B = 32;
  for (int y0 = 0; y0 < h; y0 += B)
    for (int x0 = 0; x0 < w; x0 += B)
      for (int y = y0; y < std::min(h, y0 + B); ++y)
        for (int x = x0; x < std::min(w, x0 + B); ++x) {
          const uint8_t* s = src + (size_t(y) * w + x) * 3;
          uint8_t* d = dst + (size_t(x) * h + y) * 3;
          d[0] = s[0];
          d[1] = s[1];
          d[2] = s[2];
        }
}

#ifdef M3_MEDIA_X86
// The AVX2 twins of the passes above (same integer sums, so the same bytes; media_preprocess_test compares them
// with the scalar path on random images). Both multiply uint8 pixels, widened to int16, by the int16 taps two at
// a time with vpmaddwd (a·q_j + b·q_{j+1} per int32 lane) — torch's own AVX2 resampler does the same.

// (q_2g, q_2g+1) as one int32 per pair and output: [out, pairs], zero past the window.
std::vector<int32_t> tap_pairs(const AxisTaps& t, int out, int pairs) {
  std::vector<int32_t> v(size_t(out) * pairs, 0);
  for (int i = 0; i < out; ++i)
    for (int g = 0; g < pairs; ++g) {
      const int j = 2 * g;
      const int16_t a = j < t.n[i] ? t.q[size_t(i) * t.ksize + j] : 0;
      const int16_t b = j + 1 < t.n[i] ? t.q[size_t(i) * t.ksize + j + 1] : 0;
      v[size_t(i) * pairs + g] = int32_t(uint32_t(uint16_t(a)) | (uint32_t(uint16_t(b)) << 16));
    }
  return v;
}

// Output pixel x of the four rows from (r, g, b, ·) words: a 4-byte store where the 4th byte is the next pixel's
// (written next), 3 bytes for the last pixel of a row.
// Constant-size copies (one store each) in both branches.
inline void store_pixel_x4(uint8_t* const* d, int x, int out_w, const uint32_t (&px)[4]) {
  if (x + 1 < out_w) {
    for (int i = 0; i < 4; ++i) std::memcpy(d[i] + size_t(x) * 3, &px[i], 4);
  } else {
    for (int i = 0; i < 4; ++i) std::memcpy(d[i] + size_t(x) * 3, &px[i], 3);
  }
}

// Width pass on interleaved RGB, four rows at a time (two per ymm, one per 128-bit lane). 16 bytes at pixel p hold
// pixels p … p+3 (and a byte of p+4); two byte shuffles turn them into the int16 lanes (r_p, r_p+1, g_p, g_p+1, b_p,
// b_p+1, 0, 0) and (r_p+2, r_p+3, …), so vpmaddwd with a tap pair broadcast gives (Σr, Σg, Σb, 0) for two taps.
// Loads read up to 13 bytes past the last pixel of a row (weights 0 there): every row pointer needs 16 readable
// bytes after its last pixel. Output rows are written 4 bytes per pixel, left to right, the last pixel 3 bytes.
// Output x reads nq[x] quads from pixel xs[x] (WidthPlan).
__attribute__((target("avx2"))) void hpass_rows_avx2(const uint8_t* const* r, const int* xs, const int* nq, int P,
                                                      const int32_t* pairs, int np, int out_w, uint8_t* const* d) {
  const __m256i ma = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,  //
                                      0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i mb = _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,  //
                                      6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
  const __m256i half = _mm256_set1_epi32(1 << (P - 1));
  const __m128i shift = _mm_cvtsi32_si128(P);
  auto ld = [](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  for (int x = 0; x < out_w; ++x) {
    const int quads = nq[x];
    const size_t off = size_t(xs[x]) * 3;
    const int32_t* pq = pairs + size_t(x) * np;
    __m256i acc01 = half, acc23 = half;
    for (int k = 0; k < quads; ++k) {
      const size_t o = off + 12 * size_t(k);
      const __m256i v01 = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(r[0] + o)), ld(r[1] + o), 1);
      const __m256i v23 = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(r[2] + o)), ld(r[3] + o), 1);
      const __m256i wa = _mm256_set1_epi32(pq[2 * k]), wb = _mm256_set1_epi32(pq[2 * k + 1]);
      acc01 = _mm256_add_epi32(acc01, _mm256_add_epi32(_mm256_madd_epi16(_mm256_shuffle_epi8(v01, ma), wa),
                                                       _mm256_madd_epi16(_mm256_shuffle_epi8(v01, mb), wb)));
      acc23 = _mm256_add_epi32(acc23, _mm256_add_epi32(_mm256_madd_epi16(_mm256_shuffle_epi8(v23, ma), wa),
                                                       _mm256_madd_epi16(_mm256_shuffle_epi8(v23, mb), wb)));
    }
    // Saturating packs clamp to [0, 255] exactly as clamp_shift does. Lane 0: rows 0, 2; lane 1: rows 1, 3.
    const __m256i w16 = _mm256_packs_epi32(_mm256_sra_epi32(acc01, shift), _mm256_sra_epi32(acc23, shift));
    const __m256i b8 = _mm256_packus_epi16(w16, w16);
    const __m128i l0 = _mm256_castsi256_si128(b8), l1 = _mm256_extracti128_si256(b8, 1);
    const uint32_t px[4] = {uint32_t(_mm_cvtsi128_si32(l0)), uint32_t(_mm_cvtsi128_si32(l1)),
                            uint32_t(_mm_extract_epi32(l0, 1)), uint32_t(_mm_extract_epi32(l1, 1))};
    store_pixel_x4(d, x, out_w, px);
  }
}

// The same width pass with AVX-512BW: the four rows share one zmm (one per 128-bit lane), so each tap quad costs
// two shuffles, two vpmaddwd and two adds for all four rows instead of twice that; the clamp is a max with 0 and
// vpmovusdb (unsigned saturation to [0, 255]) — the same bytes as clamp_shift. Same loads, same padding rules.
// GCC 12's AVX-512 headers trip -Wuninitialized on their own `__Y = __Y` placeholders (fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw"))) void hpass_rows_avx512(const uint8_t* const* r, const int* xs,
                                                                    const int* nq, int P, const int32_t* pairs,
                                                                    int np, int out_w, uint8_t* const* d) {
  const __m512i ma = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1));
  const __m512i mb = _mm512_broadcast_i32x4(_mm_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1));
  const __m512i half = _mm512_set1_epi32(1 << (P - 1));
  const __m128i shift = _mm_cvtsi32_si128(P);
  const __m512i zero = _mm512_setzero_si512();
  auto ld = [](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  for (int x = 0; x < out_w; ++x) {
    const int quads = nq[x];
    const size_t off = size_t(xs[x]) * 3;
    const int32_t* pq = pairs + size_t(x) * np;
    __m512i acc = half;
    for (int k = 0; k < quads; ++k) {
      const size_t o = off + 12 * size_t(k);
      __m512i v = _mm512_castsi128_si512(ld(r[0] + o));
      v = _mm512_inserti32x4(v, ld(r[1] + o), 1);
      v = _mm512_inserti32x4(v, ld(r[2] + o), 2);
      v = _mm512_inserti32x4(v, ld(r[3] + o), 3);
      const __m512i wa = _mm512_set1_epi32(pq[2 * k]), wb = _mm512_set1_epi32(pq[2 * k + 1]);
      acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_madd_epi16(_mm512_shuffle_epi8(v, ma), wa),
                                                   _mm512_madd_epi16(_mm512_shuffle_epi8(v, mb), wb)));
    }
    // Lane i = row i: (r, g, b, 0) as int32 → bytes 4i … 4i+3.
    const __m128i b8 = _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_sra_epi32(acc, shift), zero));
    const uint32_t px[4] = {uint32_t(_mm_cvtsi128_si32(b8)), uint32_t(_mm_extract_epi32(b8, 1)),
                            uint32_t(_mm_extract_epi32(b8, 2)), uint32_t(_mm_extract_epi32(b8, 3))};
    store_pixel_x4(d, x, out_w, px);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool use_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has && !detail::g_no_avx512.load(std::memory_order_relaxed);
}

// The width pass's plan: per output, the first pixel read, the tap quads read and the tap pairs.
struct WidthPlan {
  AxisTaps t;
  int np = 0;                  // tap pairs per output, even: the loop takes two at a time
  std::vector<int> xs, nq;     // [out] first pixel read (xmin), quads read
  std::vector<int32_t> pairs;  // [out, np]
  WidthPlan(int in, int out)
      : t(make_taps(in, out)), np(((t.ksize + 1) / 2 + 1) / 2 * 2), xs(t.xmin), nq(size_t(out)),
        pairs(tap_pairs(t, out, np)) {
    for (int x = 0; x < out; ++x) nq[size_t(x)] = (t.n[size_t(x)] + 3) / 4;
  }
};

// Four rows through the widest width kernel this CPU has.
void hpass_rows(const uint8_t* const* r, const WidthPlan& wp, int out_w, uint8_t* const* d) {
  if (use_avx512())
    return hpass_rows_avx512(r, wp.xs.data(), wp.nq.data(), wp.t.P, wp.pairs.data(), wp.np, out_w, d);
  hpass_rows_avx2(r, wp.xs.data(), wp.nq.data(), wp.t.P, wp.pairs.data(), wp.np, out_w, d);
}

// Width pass over n source rows at `src` (stride in_row; `readable` bytes from src may be read) into n rows at dst.
// Groups of 4 rows whose loads stay inside `readable` run in place; the rest (the last rows, or all of a tiny
// image) through a zero-padded copy, with spare output rows past the last.
void hpass_block(const uint8_t* src, size_t in_row, size_t readable, int n, const WidthPlan& wp, int out_w,
                 uint8_t* dst) {
  const size_t out_row = size_t(out_w) * 3;
  int y = 0;
  for (; y + 4 <= n && size_t(y + 4) * in_row + 16 <= readable; y += 4) {
    const uint8_t* r[4] = {src + y * in_row, src + (y + 1) * in_row, src + (y + 2) * in_row, src + (y + 3) * in_row};
    uint8_t* d[4] = {dst + y * out_row, dst + (y + 1) * out_row, dst + (y + 2) * out_row, dst + (y + 3) * out_row};
    hpass_rows(r, wp, out_w, d);
  }
  if (y < n) {
    thread_local ByteBuffer pad, spare;
    const int rows = n - y;
    pad.resize(size_t(rows + 4) * in_row + 16);
    std::memcpy(pad.data(), src + y * in_row, rows * in_row);
    std::memset(pad.data() + rows * in_row, 0, pad.size() - rows * in_row);
    spare.resize(4 * out_row + 4);
    for (int g = 0; g < rows; g += 4) {
      const uint8_t* r[4];
      uint8_t* d[4];
      for (int i = 0; i < 4; ++i) {
        r[i] = pad.data() + size_t(g + i) * in_row;
        d[i] = g + i < rows ? dst + (y + g + i) * out_row : spare.data() + size_t(i) * out_row;
      }
      hpass_rows(r, wp, out_w, d);
    }
  }
}

void resize_width_avx2(const RgbImage& src, int out_w, RgbImage& dst) {
  const WidthPlan wp(src.w, out_w);
  dst.w = out_w;
  dst.h = src.h;
  dst.data.resize(size_t(out_w) * src.h * 3);
  hpass_block(src.data.data(), size_t(src.w) * 3, src.data.size(), src.h, wp, out_w, dst.data.data());
}

// Height pass: 16 bytes of a row at a time, widened to int16; rows j and j+1 interleaved (vpunpck{l,h}wd) so
// vpmaddwd adds both taps; the packs at the end undo the in-lane interleave. Output rows y0 … y1−1 go to dst's rows
// 0 … y1−y0−1, so a band of rows can be made while the next stage waits for it in cache.
struct HeightPlan {
  AxisTaps t;
  int np = 0;                  // tap pairs per output row
  std::vector<int32_t> pairs;  // [out, np]
  HeightPlan(int in, int out) : t(make_taps(in, out)), np((t.ksize + 1) / 2), pairs(tap_pairs(t, out, np)) {}
};

__attribute__((target("avx2"))) void height_rows_avx2(const uint8_t* src, size_t stride, const HeightPlan& hp, int y0,
                                                       int y1, uint8_t* dst) {
  const AxisTaps& t = hp.t;
  const int np = hp.np;
  const __m256i half = _mm256_set1_epi32(1 << (t.P - 1));
  const __m128i shift = _mm_cvtsi32_si128(t.P);
  const size_t vec_end = stride / 16 * 16;
  for (int y = y0; y < y1; ++y) {
    const int n = t.n[y];
    const uint8_t* base = src + size_t(t.xmin[y]) * stride;
    const int32_t* pq = &hp.pairs[size_t(y) * np];
    uint8_t* orow = dst + size_t(y - y0) * stride;
    for (size_t k = 0; k < vec_end; k += 16) {
      __m256i lo = half, hi = half;
      for (int j = 0; j < n; j += 2) {
        const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + j * stride + k)));
        const __m256i b = j + 1 < n ? _mm256_cvtepu8_epi16(_mm_loadu_si128(
                                          reinterpret_cast<const __m128i*>(base + (j + 1) * stride + k)))
                                    : _mm256_setzero_si256();
        const __m256i w = _mm256_set1_epi32(pq[j / 2]);
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));
      }
      lo = _mm256_sra_epi32(lo, shift);
      hi = _mm256_sra_epi32(hi, shift);
      const __m256i w16 = _mm256_packs_epi32(lo, hi);                      // elements 0..15 in order
      const __m256i b8 = _mm256_permute4x64_epi64(_mm256_packus_epi16(w16, w16), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(orow + k), _mm256_castsi256_si128(b8));
    }
    const int16_t* q = &t.q[size_t(y) * t.ksize];
    for (size_t k = vec_end; k < stride; ++k) {
      int32_t acc = 1 << (t.P - 1);
      for (int j = 0; j < n; ++j) acc += int32_t(base[j * stride + k]) * q[j];
      orow[k] = clamp_shift(acc, t.P);
    }
  }
}

bool use_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !detail::g_force_scalar_resize.load(std::memory_order_relaxed);
}
#else
bool use_avx2() { return false; }
struct WidthPlan {
  WidthPlan(int, int) {}
};
void hpass_block(const uint8_t*, size_t, size_t, int, const WidthPlan&, int, uint8_t*) {}
void resize_width_avx2(const RgbImage&, int, RgbImage&) {}
struct HeightPlan {
  AxisTaps t;
  HeightPlan(int in, int out) : t(make_taps(in, out)) {}
};
void height_rows_avx2(const uint8_t*, size_t, const HeightPlan&, int, int, uint8_t*) {}
#endif

void resize_width(const RgbImage& src, int out_w, RgbImage& dst) {
  if (use_avx2()) return resize_width_avx2(src, out_w, dst);
  const AxisTaps t = make_taps(src.w, out_w);
  thread_local ByteBuffer tin, tout;
  tin.resize(size_t(src.w) * src.h * 3);
  tout.resize(size_t(out_w) * src.h * 3);
  transpose_rgb(src.data.data(), src.h, src.w, tin.data());                // [w, h, 3]
  vertical_pass(tin.data(), size_t(src.h) * 3, t, out_w, tout.data());     // [out_w, h, 3]
  dst.w = out_w;
  dst.h = src.h;
  dst.data.resize(size_t(out_w) * src.h * 3);
  transpose_rgb(tout.data(), out_w, src.h, dst.data.data());               // [h, out_w, 3]
}

void resize_height(const RgbImage& src, int out_h, RgbImage& dst) {
  dst.w = src.w;
  dst.h = out_h;
  dst.data.resize(size_t(src.w) * out_h * 3);
  if (use_avx2()) {
    const HeightPlan hp(src.h, out_h);
    return height_rows_avx2(src.data.data(), size_t(src.w) * 3, hp, 0, out_h, dst.data.data());
  }
  const AxisTaps t = make_taps(src.h, out_h);
  vertical_pass(src.data.data(), size_t(src.w) * 3, t, out_h, dst.data.data());
}

// Resizes into `out` using `mid` for the width pass; returns the image to read (src itself when no pass is needed).
// The buffers are reused across calls by preprocess_* (thread_local): fresh multi-MB buffers cost page faults.
const RgbImage& resize_into(const RgbImage& src, int out_h, int out_w, RgbImage& mid, RgbImage& out) {
  if (out_h <= 0 || out_w <= 0) media_fail("resize to an empty size {}x{}", out_w, out_h);
  if (src.w == out_w && src.h == out_h) return src;
  if (src.w != out_w) {
    if (src.h == out_h) {
      resize_width(src, out_w, out);
      return out;
    }
    resize_width(src, out_w, mid);
    resize_height(mid, out_h, out);
    return out;
  }
  resize_height(src, out_h, out);
  return out;
}

struct Scratch {
  RgbImage mid, out;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// f32(f32(mean)·255) and f32(f32(std)·255) as bit patterns (docs/M3_MODEL.md §5.1.4).
const float kMean[3] = {std::bit_cast<float>(0x42f58ab9u), std::bit_cast<float>(0x42e97df6u),
                        std::bit_cast<float>(0x42d02ffeu)};
const float kStd[3] = {std::bit_cast<float>(0x42890046u), std::bit_cast<float>(0x428543abu),
                       std::bit_cast<float>(0x428ca575u)};

struct NormTable {
  float v[3][256];
  NormTable() {
    for (int c = 0; c < 3; ++c)
      for (int x = 0; x < 256; ++x) v[c][x] = (float(x) - kMean[c]) / kStd[c];
  }
};
const NormTable& norm_table() {
  static const NormTable t;
  return t;
}

}  // namespace

float normalize_value(uint8_t x, int c) { return norm_table().v[c][x]; }

RgbImage resize_bicubic_aa(const RgbImage& src, int out_h, int out_w) {
  RgbImage mid, out;
  const RgbImage& r = resize_into(src, out_h, out_w, mid, out);
  return &r == &src ? src : std::move(out);
}

#ifdef M3_MEDIA_X86
// 14 pixels of interleaved RGB (reads 48 bytes) → three runs of 14 normalised floats. The channels are separated
// with byte shuffles; (float(x) − M_c) / S_c in IEEE single precision is what the table holds, bit for bit.
static __attribute__((target("avx2"))) void normalize_px14_avx2(const uint8_t* src, float* r0, float* r1, float* r2) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
#define M3_PICK(ma, mb, mc) \
  _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, ma), _mm_shuffle_epi8(b, mb)), _mm_shuffle_epi8(c, mc))
  const __m128i ch[3] = {
      M3_PICK(_mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
           _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1),
           _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13)),
      M3_PICK(_mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
           _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1),
           _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14)),
      M3_PICK(_mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
           _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1),
           _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15))};
#undef M3_PICK
  float* dst[3] = {r0, r1, r2};
  for (int k = 0; k < 3; ++k) {
    const __m256 m = _mm256_set1_ps(kMean[k]), sd = _mm256_set1_ps(kStd[k]);
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(ch[k]));                     // pixels 0..7
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(ch[k], 6)));  // pixels 6..13
    _mm256_storeu_ps(dst[k], _mm256_div_ps(_mm256_sub_ps(lo, m), sd));
    _mm256_storeu_ps(dst[k] + 6, _mm256_div_ps(_mm256_sub_ps(hi, m), sd));
  }
}
#else
static void normalize_px14_avx2(const uint8_t*, float*, float*, float*) {}
#endif

// One merge row of patch rows (docs/M3_MODEL.md §5.2): rows[t] points at the kFactor = 28 source rows of temporal
// slot t (w·3 bytes each, `readable[t]` bytes from there may be read); writes (w/28)·4 rows of 1176 floats at out.
// Row layout (channel, temporal, ky, kx); rows by merge column, then the 2×2 window row-major. One pass over each
// source pixel writes its three channels; an image (frames = 1) fills both temporal slots with the same values.
static void patch_band(const uint8_t* const rows[2], const size_t readable[2], int frames, int w, bool simd,
                       float* out) {
  const int gw = w / kPatch;
  const size_t stride = size_t(w) * 3;
  const NormTable& nt = norm_table();
  constexpr int kBlock = kPatch * kPatch;  // 196 values per (channel, temporal)
  for (int mc = 0; mc < gw / kMerge; ++mc)
    for (int dy = 0; dy < kMerge; ++dy)
      for (int dx = 0; dx < kMerge; ++dx) {
        const int px = mc * kMerge + dx;
        float* row = out;
        for (int t = 0; t < frames; ++t) {
          float* r0 = row + (0 * kTemporal + t) * kBlock;
          float* r1 = row + (1 * kTemporal + t) * kBlock;
          float* r2 = row + (2 * kTemporal + t) * kBlock;
          for (int ky = 0; ky < kPatch; ++ky) {
            const size_t at = size_t(dy * kPatch + ky) * stride + size_t(px) * kPatch * 3;
            const uint8_t* src = rows[t] + at;
            if (simd && at + 48 <= readable[t]) {
              normalize_px14_avx2(src, r0 + ky * kPatch, r1 + ky * kPatch, r2 + ky * kPatch);
              continue;
            }
            for (int kx = 0; kx < kPatch; ++kx) {
              r0[ky * kPatch + kx] = nt.v[0][src[kx * 3 + 0]];
              r1[ky * kPatch + kx] = nt.v[1][src[kx * 3 + 1]];
              r2[ky * kPatch + kx] = nt.v[2][src[kx * 3 + 2]];
            }
          }
        }
        if (frames == 1)
          for (int c = 0; c < 3; ++c)
            std::memcpy(row + (c * kTemporal + 1) * kBlock, row + c * kTemporal * kBlock, kBlock * sizeof(float));
        out += kRowWidth;
      }
}

void append_patch_rows(const RgbImage& f0, const RgbImage& f1, FloatBuffer& out) {
  const int gh = f0.h / kPatch, gw = f0.w / kPatch;
  // An image fills both temporal slots with the same frame: compute slot 0 only.
  const int frames = (&f0 == &f1 || f0.data.data() == f1.data.data()) ? 1 : kTemporal;
  const bool simd = use_avx2();
  size_t pos = out.size();
  out.resize(pos + size_t(gh) * gw * kRowWidth);
  for (int mr = 0; mr < gh / kMerge; ++mr) {
    const size_t at = size_t(mr) * kFactor * f0.w * 3;
    const uint8_t* rows[2] = {f0.data.data() + at, f1.data.data() + at};
    const size_t readable[2] = {f0.data.size() - at, f1.data.size() - at};
    patch_band(rows, readable, frames, f0.w, simd, &out[pos]);
    pos += size_t(gw) * kMerge * kRowWidth;
  }
}

namespace {
// Height pass and patchify of one merge row (output rows 28·mr … 28·mr + 27; AVX2 only) from width-passed rows in
// `mid`: the band of resized rows (28 × w × 3 bytes, 75 KB at 1080p) goes through `band` (kFactor rows + 48
// bytes) and is still in L2 when patchify reads it, where a whole resized picture used to be written and read
// back. Without a height change (hp null) patchify reads mid's rows directly. The same integer sums and floats as
// resize_height + append_patch_rows.
void band_avx2(const RgbImage& mid, const HeightPlan* hp, int mr, ByteBuffer& band, float* out) {
  const size_t stride = size_t(mid.w) * 3;
  const uint8_t* rows[2];
  size_t readable[2];
  if (hp) {
    if (band.size() != size_t(kFactor) * stride + 48) {
      band.resize(size_t(kFactor) * stride + 48);
      std::memset(band.data() + size_t(kFactor) * stride, 0, 48);  // read (and discarded) past the last pixel
    }
    height_rows_avx2(mid.data.data(), stride, *hp, mr * kFactor, (mr + 1) * kFactor, band.data());
    rows[0] = rows[1] = band.data();
    readable[0] = readable[1] = band.size();
  } else {
    const size_t at = size_t(mr) * kFactor * stride;
    rows[0] = rows[1] = mid.data.data() + at;
    readable[0] = readable[1] = mid.data.size() - at;
  }
  patch_band(rows, readable, 1, mid.w, true, out);
}

void height_patchify_avx2(const RgbImage& mid, int th, FloatBuffer& out) {
  const HeightPlan hp(mid.h, th);
  thread_local ByteBuffer band;
  const int gh = th / kPatch, gw = mid.w / kPatch;
  size_t pos = out.size();
  out.resize(pos + size_t(gh) * gw * kRowWidth);
  for (int mr = 0; mr < gh / kMerge; ++mr, pos += size_t(gw) * kMerge * kRowWidth)
    band_avx2(mid, &hp, mr, band, &out[pos]);
}
}  // namespace

PixelTensor preprocess_image(const RgbImage& img, const ResizeLimits& lim) {
  auto [th, tw] = smart_resize(img.h, img.w, lim);
  Scratch& sc = scratch();
  PixelTensor pt;
  pt.t = 1;
  pt.gh = th / kPatch;
  pt.gw = tw / kPatch;
  pt.values.reserve(size_t(pt.rows()) * kRowWidth);
  if (use_avx2() && img.h != th) {
    const RgbImage* m = &img;
    if (img.w != tw) {
      resize_width(img, tw, sc.mid);
      m = &sc.mid;
    }
    height_patchify_avx2(*m, th, pt.values);
    return pt;
  }
  const RgbImage& r = resize_into(img, th, tw, sc.mid, sc.out);
  append_patch_rows(r, r, pt.values);
  return pt;
}

struct RowStreamPreprocessor::Impl {
  int h, w, th, tw;
  ResizeLimits lim;
  int filled = 0;         // source rows consumed
  bool stream = false;    // width pass per batch (else the rows collect in `full`)
  RgbImage full;
  ByteBuffer batch;       // kBatch rows + 16 readable bytes
  std::optional<WidthPlan> plan;
  std::optional<HeightPlan> hplan;  // when the height changes too
  ByteBuffer band;                  // band_avx2's rows
  int bands = 0;                    // merge rows of `out` written so far
  PixelTensor out;
  static constexpr int kBatch = 16;
  // Rows of the width-passed picture that band `mr` reads end before this source row.
  int band_needs(int mr) const {
    if (!hplan) return (mr + 1) * kFactor;
    const int y = (mr + 1) * kFactor - 1;
    return hplan->t.xmin[size_t(y)] + hplan->t.n[size_t(y)];
  }
};

RowStreamPreprocessor::RowStreamPreprocessor(int h, int w, const ResizeLimits& lim) : p_(std::make_unique<Impl>()) {
  Impl& p = *p_;
  auto [th, tw] = smart_resize(h, w, lim);
  p.h = h;
  p.w = w;
  p.th = th;
  p.tw = tw;
  p.lim = lim;
  p.stream = tw != w && use_avx2();
  if (p.stream) {
    p.plan.emplace(w, tw);
    if (th != h) p.hplan.emplace(h, th);
    p.batch.resize(size_t(Impl::kBatch) * w * 3 + 16);
    std::memset(p.batch.data(), 0, p.batch.size());
    RgbImage& mid = scratch().mid;
    mid.w = tw;
    mid.h = h;
    mid.data.resize(size_t(tw) * h * 3);
    p.out.t = 1;
    p.out.gh = th / kPatch;
    p.out.gw = tw / kPatch;
    p.out.values.resize(size_t(p.out.rows()) * kRowWidth);
  } else {
    p.full = RgbImage(w, h);
  }
}

RowStreamPreprocessor::~RowStreamPreprocessor() = default;

int RowStreamPreprocessor::batch() const { return std::min(Impl::kBatch, p_->h - p_->filled); }

uint8_t* RowStreamPreprocessor::row(int i) {
  Impl& p = *p_;
  const size_t in_row = size_t(p.w) * 3;
  return p.stream ? p.batch.data() + size_t(i) * in_row : p.full.data.data() + size_t(p.filled + i) * in_row;
}

// Each batch goes through the width pass into scratch().mid; every merge row of the output whose source rows are
// all there is then made at once (band_avx2), while those rows are still in cache, and the decoder goes on.
void RowStreamPreprocessor::consume() {
  Impl& p = *p_;
  const int n = batch();
  if (p.stream) {
    RgbImage& mid = scratch().mid;
    hpass_block(p.batch.data(), size_t(p.w) * 3, p.batch.size(), n, *p.plan, p.tw,
                mid.data.data() + size_t(p.filled) * p.tw * 3);
    p.filled += n;
    const size_t band_floats = size_t(p.out.gw) * kMerge * kRowWidth;
    for (; p.bands < p.out.gh / kMerge && p.band_needs(p.bands) <= p.filled; ++p.bands)
      band_avx2(mid, p.hplan ? &*p.hplan : nullptr, p.bands, p.band, p.out.values.data() + p.bands * band_floats);
    return;
  }
  p.filled += n;
}

PixelTensor RowStreamPreprocessor::finish() {
  Impl& p = *p_;
  if (p.filled != p.h) media_fail("image ended after {} of {} rows", p.filled, p.h);
  if (!p.stream) return preprocess_image(p.full, p.lim);
  if (p.bands != p.out.gh / kMerge) media_fail("internal: {} of {} merge rows made", p.bands, p.out.gh / kMerge);
  return std::move(p.out);
}

PixelTensor preprocess_video(const std::vector<RgbImage>& frames, const ResizeLimits& lim) {
  if (frames.empty()) media_fail("video has no frames");
  const int h = frames[0].h, w = frames[0].w;
  for (const auto& f : frames)
    if (f.h != h || f.w != w) media_fail("video frames change size ({}x{} then {}x{})", w, h, f.w, f.h);
  auto [th, tw] = smart_resize(h, w, lim);
  std::vector<RgbImage> rs;
  rs.reserve(frames.size() + 1);
  for (const auto& f : frames) rs.push_back(resize_bicubic_aa(f, th, tw));
  if (rs.size() % 2) rs.push_back(rs.back());  // pad to even with the last frame
  PixelTensor pt;
  pt.t = int(rs.size() / 2);
  pt.gh = th / kPatch;
  pt.gw = tw / kPatch;
  pt.values.reserve(size_t(pt.rows()) * kRowWidth);
  for (size_t g = 0; g < rs.size(); g += 2) append_patch_rows(rs[g], rs[g + 1], pt.values);
  return pt;
}

}  // namespace m3::media
