// Media preprocessing throughput per core (issue 12 item 3): images/s for one thread at 1080p and 4k, on decoded
// RGB (the HF comparison in bench/results/2026-12-01-media-preprocess-cpu.md) and with a JPEG decode in front (the
// gateway's path, preprocess_encoded_image, and decode_image + preprocess_image), then a per-stage breakdown.
// The input is the oracle's synthetic "grad" image (scripts/oracle/make_media_fixtures.py, seed 99) so the HF
// numbers recorded there are on the same pixels. Usage: bench_media [seconds_per_case=3]
//   bench_media SECS decode|jpeg   one 1080p loop alone (tjDecompress2 / the gateway path), for a profiler or A/B
//   bench_media SECS jpeg-kept     the gateway path keeping each tensor (32 at a time), as the media cache does:
//                                  every image's tensor is then fresh memory (page faults; big_buffer.cpp)
//   bench_media SECS stages [R]    the gateway's 1080p JPEG path split into its stages, R rounds interleaved
//                                  (median, min and max per stage over the rounds)
#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <csetjmp>
#include <jpeglib.h>
#include <turbojpeg.h>

#include "media/decode.h"
#include "media/gateway.h"
#include "media/image.h"

using namespace m3::media;

static uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
  return x;
}

static RgbImage grad(int h, int w, int seed) {
  RgbImage img(w, h);
  const uint32_t mix = uint32_t(uint64_t(seed) * 0x9E3779B9ULL);
  for (size_t i = 0; i < img.data.size(); ++i) {
    uint64_t c = i % 3, x = (i / 3) % w, y = i / (3 * size_t(w));
    img.data[i] = uint8_t((7 * x + 13 * y + 85 * c + (lowbias32(uint32_t(i) ^ mix) >> 29)) & 255);
  }
  return img;
}

static std::vector<uint8_t> jpeg(const RgbImage& img) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  tjCompress2(tj, img.data.data(), img.w, 0, img.h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0);
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// Images per second of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): a shared, oversubscribed machine
// stretches wall time far more than the CPU time one preprocessing call costs.
static double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
// Calls per second from the median call: other jobs on a shared machine still slow some calls down (caches, SMT
// siblings) even in CPU time, and the median ignores those.
template <typename F>
static double rate(F&& f, double secs) {
  f();  // warm
  std::vector<double> t;
  const double t0 = cpu_now();
  double last = t0;
  do {
    f();
    const double now = cpu_now();
    t.push_back(now - last);
    last = now;
  } while (last - t0 < secs || t.size() < 5);
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return 1.0 / t[t.size() / 2];
}

// libjpeg's scanline decode alone with the gateway's settings (decode.cpp preprocess_jpeg_streamed: JCS_EXT_RGB,
// defaults otherwise) into one reused 16-row buffer: the decoder's share of the gateway path, no preprocessing.
// Starts an RGB scanline decode of `jpg` with the gateway's settings (the caller finishes and destroys `cinfo`).
static void start_rgb_decode(jpeg_decompress_struct& cinfo, jpeg_error_mgr& jerr, const std::vector<uint8_t>& jpg) {
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, jpg.data(), static_cast<unsigned long>(jpg.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_EXT_RGB;
  jpeg_start_decompress(&cinfo);
}

static void decode_scanlines(const std::vector<uint8_t>& jpg, ByteBuffer& rows16) {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr jerr{};
  start_rgb_decode(cinfo, jerr, jpg);
  const size_t stride = size_t(cinfo.output_width) * 3;
  rows16.resize(16 * stride);
  JSAMPROW rows[16];
  for (int i = 0; i < 16; ++i) rows[i] = rows16.data() + size_t(i) * stride;
  while (cinfo.output_scanline < cinfo.output_height)
    jpeg_read_scanlines(&cinfo, rows, std::min<JDIMENSION>(16, cinfo.output_height - cinfo.output_scanline));
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
}

// The gateway path rebuilt from the public API (libjpeg scanlines into a RowStreamPreprocessor, as decode.cpp does)
// with the thread CPU time of each part summed over one image: {decode, width pass, finish = height pass + patchify}.
static std::array<double, 3> split_gateway(const std::vector<uint8_t>& jpg) {
  std::array<double, 3> t{};
  double t0 = cpu_now();
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr jerr{};
  start_rgb_decode(cinfo, jerr, jpg);
  RowStreamPreprocessor sp(int(cinfo.output_height), int(cinfo.output_width));
  JSAMPROW rows[64];
  while (const int n = sp.batch()) {
    for (int i = 0; i < n; ++i) rows[i] = sp.row(i);
    for (int got = 0; got < n;) got += int(jpeg_read_scanlines(&cinfo, rows + got, JDIMENSION(n - got)));
    double t1 = cpu_now();
    t[0] += t1 - t0;
    sp.consume();
    t0 = cpu_now();
    t[1] += t0 - t1;
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  double t1 = cpu_now();
  t[0] += t1 - t0;
  volatile auto n = sp.finish().values.size();
  (void)n;
  t[2] += cpu_now() - t1;
  return t;
}

// The 1080p gateway path and its stages, ms of thread CPU time per call (median call of each case), R rounds with the
// cases interleaved so a slow minute of this shared VM hits all of them.
static int stages(double secs, int rounds) {
  RgbImage img = grad(1080, 1920, 99);
  const auto jpg = jpeg(img);
  auto [th, tw] = smart_resize(img.h, img.w, ResizeLimits{});
  const RgbImage mid = resize_bicubic_aa(img, img.h, tw);
  const RgbImage out = resize_bicubic_aa(mid, th, tw);
  ByteBuffer rows16;
  FloatBuffer reused;
  struct Stage { const char* name; std::function<void()> f; std::vector<double> ms; };
  std::vector<Stage> st = {
      {"gateway path (preprocess_encoded_image)", [&] { volatile auto n = preprocess_encoded_image(jpg).values.size(); (void)n; }, {}},
      {"libjpeg scanlines alone", [&] { decode_scanlines(jpg, rows16); }, {}},
      {"width pass 1920→896 (1080 rows)", [&] { volatile auto n = resize_bicubic_aa(img, img.h, tw).data.size(); (void)n; }, {}},
      {"height pass 1080→504 (896 wide)", [&] { volatile auto n = resize_bicubic_aa(mid, th, tw).data.size(); (void)n; }, {}},
      {"normalise + patchify, fresh tensor", [&] { FloatBuffer fb; fb.reserve(size_t(th / kPatch) * (tw / kPatch) * kRowWidth); append_patch_rows(out, out, fb); volatile auto n = fb.size(); (void)n; }, {}},
      {"normalise + patchify, reused buffer", [&] { reused.clear(); append_patch_rows(out, out, reused); }, {}},
  };
  std::vector<std::array<double, 3>> split;
  for (int r = 0; r < rounds; ++r) {
    for (auto& s : st) s.ms.push_back(1e3 / rate(s.f, secs));
    for (int k = 0; k < 9; ++k) split.push_back(split_gateway(jpg));
  }
  std::printf("| stage (1080p q90 JPEG, %d rounds) | median ms | min | max |\n|---|---|---|---|\n", rounds);
  for (auto& s : st) {
    std::sort(s.ms.begin(), s.ms.end());
    std::printf("| %s | %.2f | %.2f | %.2f |\n", s.name, s.ms[s.ms.size() / 2], s.ms.front(), s.ms.back());
  }
  const char* part[3] = {"decode (scanlines)", "width pass (consume)", "height pass + patchify (finish)"};
  for (int k = 0; k < 3; ++k) {
    std::vector<double> v;
    for (const auto& a : split) v.push_back(a[size_t(k)] * 1e3);
    std::sort(v.begin(), v.end());
    std::printf("| in place: %s | %.2f | %.2f | %.2f |\n", part[k], v[v.size() / 2], v.front(), v.back());
  }
  return 0;
}

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 3.0;
  // M3_MEDIA_NO_AVX512=1: the AVX2 width pass where AVX-512 would run (A/B of the two kernels in one binary).
  if (const char* e = std::getenv("M3_MEDIA_NO_AVX512"); e && *e == '1') detail::disable_avx512(true);
  struct Case { const char* name; int h, w; } cases[] = {{"1080p", 1080, 1920}, {"4k", 2160, 3840}};
  if (argc == 5 && std::string(argv[1]) == "--write-jpegs") {
    // `bench_media --write-jpegs DIR N HxW`: N different q90 JPEGs (seeds 1…N) for tools/bench_media/media_ttft.py.
    const int n = std::atoi(argv[3]);
    int h = 0, w = 0;
    if (std::sscanf(argv[4], "%dx%d", &h, &w) != 2 || n <= 0 || h <= 0 || w <= 0) return 2;
    for (int k = 1; k <= n; ++k) {
      const auto j = jpeg(grad(h, w, k));
      const std::string path = std::string(argv[2]) + "/img" + std::to_string(k) + ".jpg";
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(j.data(), 1, j.size(), f) != j.size() || std::fclose(f) != 0) return 1;
    }
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "stages") return stages(secs, argc > 3 ? std::atoi(argv[3]) : 5);
  if (argc > 2) {  // `bench_media SECS decode|jpeg`: one 1080p loop alone, for a profiler
    RgbImage img = grad(1080, 1920, 99);
    auto jpg = jpeg(img);
    const bool only_decode = std::string(argv[2]) == "decode";
    const bool keep = std::string(argv[2]) == "jpeg-kept";
    std::vector<PixelTensor> kept;
    const double r = rate([&] {
      if (keep) {
        if (kept.size() == 32) kept.clear();
        kept.push_back(preprocess_encoded_image(jpg));
      } else if (only_decode) {
        volatile auto n = decode_image(jpg).data.size();
        (void)n;
      } else {
        volatile auto n = preprocess_encoded_image(jpg).values.size();
        (void)n;
      }
    }, secs);
    std::printf("1080p %s: %.1f img/s/core\n", argv[2], r);
    return 0;
  }
  std::printf("| input | decoded RGB → tensor (img/s/core) | JPEG q90 → tensor, gateway path (img/s/core) | "
              "JPEG q90 decode_image + preprocess_image (img/s/core) | JPEG bytes |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const auto& c : cases) {
    RgbImage img = grad(c.h, c.w, 99);
    auto jpg = jpeg(img);
    double a = rate([&] { volatile auto n = preprocess_image(img).values.size(); (void)n; }, secs);
    double b = rate([&] { volatile auto n = preprocess_encoded_image(jpg).values.size(); (void)n; }, secs);
    double b2 = rate([&] { volatile auto n = preprocess_image(decode_image(jpg)).values.size(); (void)n; }, secs);
    std::printf("| %s | %.1f | %.1f | %.1f | %zu |\n", c.name, a, b, b2, jpg.size());
  }
  // Where the time goes: each stage alone, ms of thread CPU time per call.
  std::printf("\n| input | JPEG decode (ms) | resize (ms) | normalise + patchify (ms) |\n|---|---|---|---|\n");
  for (const auto& c : cases) {
    RgbImage img = grad(c.h, c.w, 99);
    auto jpg = jpeg(img);
    auto [th, tw] = smart_resize(c.h, c.w, ResizeLimits{});
    RgbImage r = resize_bicubic_aa(img, th, tw);
    FloatBuffer fb;
    const double d = 1e3 / rate([&] { volatile auto n = decode_image(jpg).data.size(); (void)n; }, secs / 3);
    const double z = 1e3 / rate([&] { volatile auto n = resize_bicubic_aa(img, th, tw).data.size(); (void)n; }, secs / 3);
    const double p = 1e3 / rate([&] { fb.clear(); append_patch_rows(r, r, fb); }, secs / 3);
    std::printf("| %s | %.2f | %.2f | %.2f |\n", c.name, d, z, p);
  }
  return 0;
}
