// Fuzzes the media decoders (JPEG, PNG, WebP, GIF, BMP by content sniffing) and the preprocessing that follows:
// any input must decode or throw MediaError — no crash, leak, sanitizer report or unbounded allocation. The same
// bytes also go through the media URL parsing (data: URLs, http(s) URL parsing and the host allow-list, the source
// policy; never a network or file access: remote and local sources stay disabled).
// m3-fuzz-libs: m3_media
#include <cstddef>
#include <cstdint>
#include <span>

#include "media/decode.h"
#include "media/fetch.h"
#include "media/image.h"
#include "media/media_error.h"
#include "media/source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace m3::media;
  DecodeLimits lim;
  lim.max_pixels = 1 << 20;  // keep each run cheap; the limit path itself is exercised too
  lim.max_side = 4096;
  try {
    RgbImage img = decode_image(std::span<const uint8_t>(data, size), lim);
    if (img.data.size() != size_t(img.w) * size_t(img.h) * 3) __builtin_trap();
    PixelTensor pt = preprocess_image(img);
    if (pt.values.size() != size_t(pt.rows()) * kRowWidth) __builtin_trap();
  } catch (const MediaError&) {
  }
  try {
    std::string_view s(reinterpret_cast<const char*>(data), size);
    (void)base64_decode(s);
  } catch (const MediaError&) {
  }
  const std::string url(reinterpret_cast<const char*>(data), size);
  try {
    ParsedUrl u = parse_http_url(url);
    if (u.host.empty() || u.target.empty() || u.target[0] != '/') __builtin_trap();
    (void)host_allowed(u.host, {"example.com", "*.example.org"});
  } catch (const MediaError&) {
  }
  try {
    (void)load_media_bytes(url, SourcePolicy{});  // remote and local refused: data: URLs only
  } catch (const MediaError&) {
  }
  return 0;
}
