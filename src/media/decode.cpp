// Decoders: libturbojpeg (JPEG), libpng (PNG), libwebp (WebP), giflib (GIF, first frame), our own BMP reader.
#include "media/decode.h"

#include <csetjmp>
#include <cstring>
#include <memory>
#include <vector>

#include <cstdio>  // jpeglib.h needs FILE

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <turbojpeg.h>
#include <webp/decode.h>

#include "media/media_error.h"

namespace m3::media {

const char* format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::Jpeg: return "JPEG";
    case ImageFormat::Png: return "PNG";
    case ImageFormat::Webp: return "WebP";
    case ImageFormat::Gif: return "GIF";
    case ImageFormat::Bmp: return "BMP";
    default: return "unknown";
  }
}

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  auto starts = [&](const char* s, size_t off = 0) {
    size_t n = std::strlen(s);
    return b.size() >= off + n && std::memcmp(b.data() + off, s, n) == 0;
  };
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::Jpeg;
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::Png;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::Webp;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::Gif;
  if (starts("BM")) return ImageFormat::Bmp;
  return ImageFormat::Unknown;
}

namespace {

void check_size(int64_t w, int64_t h, const DecodeLimits& lim, const char* fmt) {
  if (w <= 0 || h <= 0) media_fail("{} image has an invalid size {}x{}", fmt, w, h);
  if (w > lim.max_side || h > lim.max_side || w * h > lim.max_pixels)
    media_fail("{} image {}x{} exceeds the decode limit ({} pixels, {} per side)", fmt, w, h, lim.max_pixels,
               lim.max_side);
}

// ---- JPEG ---------------------------------------------------------------------------------------------------
// Adobe APP14 marks inverted CMYK (Pillow's "CMYK;I" rawmode); scan the markers before the first SOS.
bool jpeg_has_adobe_marker(std::span<const uint8_t> b) {
  size_t i = 2;
  while (i + 4 <= b.size()) {
    if (b[i] != 0xFF) return false;
    uint8_t m = b[i + 1];
    if (m == 0xFF) { ++i; continue; }
    if (m == 0xDA || m == 0xD9) return false;
    size_t len = size_t(b[i + 2]) << 8 | b[i + 3];
    if (m == 0xEE && len >= 7 && i + 9 <= b.size() && std::memcmp(&b[i + 4], "Adobe", 5) == 0) return true;
    i += 2 + len;
  }
  return false;
}

inline uint8_t muldiv255(int a, int b) {
  int tmp = a * b + 128;
  return uint8_t(((tmp >> 8) + tmp) >> 8);
}

RgbImage decode_jpeg(std::span<const uint8_t> b, const DecodeLimits& lim) {
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
  if (!tj) media_fail("JPEG decoder could not start");
  int w = 0, h = 0, sub = 0, cs = 0;
  if (tjDecompressHeader3(tj.get(), b.data(), (unsigned long)b.size(), &w, &h, &sub, &cs) != 0)
    media_fail("JPEG header is invalid: {}", tjGetErrorStr2(tj.get()));
  check_size(w, h, lim, "JPEG");
  RgbImage img(w, h);
  // Flags 0: accurate integer IDCT and fancy upsampling, libjpeg's defaults, which Pillow uses too.
  if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
    std::vector<uint8_t> cmyk(size_t(w) * h * 4);
    if (tjDecompress2(tj.get(), b.data(), (unsigned long)b.size(), cmyk.data(), w, 0, h, TJPF_CMYK, 0) != 0)
      media_fail("JPEG data is invalid: {}", tjGetErrorStr2(tj.get()));
    const bool inv = jpeg_has_adobe_marker(b);
    for (size_t i = 0; i < size_t(w) * h; ++i) {
      int c[4];
      for (int k = 0; k < 4; ++k) c[k] = inv ? 255 - cmyk[4 * i + k] : cmyk[4 * i + k];
      int nk = 255 - c[3];
      for (int k = 0; k < 3; ++k) {
        int v = nk - muldiv255(c[k], nk);
        img.data[3 * i + k] = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
    return img;
  }
  if (tjDecompress2(tj.get(), b.data(), (unsigned long)b.size(), img.data.data(), w, 0, h, TJPF_RGB, 0) != 0) {
    // Truncated or corrupt data: libjpeg warns and pads with grey; Pillow refuses, so do we.
    media_fail("JPEG data is invalid or truncated: {}", tjGetErrorStr2(tj.get()));
  }
  return img;
}

// ---- PNG ----------------------------------------------------------------------------------------------------
struct PngReader {
  std::span<const uint8_t> b;
  size_t pos = 0;
};

void png_read_mem(png_structp p, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(p));
  if (r->pos + n > r->b.size()) png_error(p, "unexpected end of PNG data (truncated file)");
  std::memcpy(out, r->b.data() + r->pos, n);
  r->pos += n;
}

[[noreturn]] void png_err(png_structp p, png_const_charp msg) {
  auto* m = static_cast<std::string*>(png_get_error_ptr(p));
  *m = msg;
  png_longjmp(p, 1);
}
void png_warn(png_structp, png_const_charp) {}

RgbImage decode_png(std::span<const uint8_t> b, const DecodeLimits& lim) {
  std::string err;
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_err, png_warn);
  if (!p) media_fail("PNG decoder could not start");
  png_infop info = png_create_info_struct(p);
  PngReader rd{b, 0};
  // Everything below the setjmp lives in heap objects owned outside it, so a longjmp leaks nothing.
  auto raw = std::make_unique<std::vector<uint8_t>>();
  auto rows = std::make_unique<std::vector<png_bytep>>();
  auto img = std::make_unique<RgbImage>();
  volatile bool ok = false;
  int w = 0, h = 0, gray16 = 0;
  if (setjmp(png_jmpbuf(p)) == 0) {
    png_set_read_fn(p, &rd, png_read_mem);
    png_set_user_limits(p, lim.max_side, lim.max_side);
    png_set_chunk_malloc_max(p, 64u << 20);
    png_read_info(p, info);
    w = int(png_get_image_width(p, info));
    h = int(png_get_image_height(p, info));
    check_size(w, h, lim, "PNG");
    int ct = png_get_color_type(p, info), bd = png_get_bit_depth(p, info);
    gray16 = (ct == PNG_COLOR_TYPE_GRAY && bd == 16);  // Pillow "I;16": v < 256 ? v : 255
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p);
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(p);
    if (!gray16) png_set_strip_16(p);  // high byte, like Pillow's ";16B" raw modes
    png_set_strip_alpha(p);             // alpha dropped, never composited
    if (gray16) png_set_swap(p);        // little-endian 16-bit samples
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) {
      if (!gray16) png_set_gray_to_rgb(p);
    }
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    size_t rb = png_get_rowbytes(p, info);
    raw->resize(rb * size_t(h));
    rows->resize(h);
    for (int y = 0; y < h; ++y) (*rows)[y] = raw->data() + rb * size_t(y);
    png_read_image(p, rows->data());
    png_read_end(p, nullptr);
    *img = RgbImage(w, h);
    if (gray16) {
      for (size_t i = 0; i < size_t(w) * h; ++i) {
        const uint8_t* s = raw->data() + 2 * i;  // tRNS on 16-bit gray adds no channel after strip_alpha
        uint8_t v = s[1] == 0 ? s[0] : 255;
        img->data[3 * i] = img->data[3 * i + 1] = img->data[3 * i + 2] = v;
      }
    } else {
      if (rb != size_t(w) * 3) png_error(p, "unexpected PNG row layout");
      std::memcpy(img->data.data(), raw->data(), raw->size());
    }
    ok = true;
  }
  png_destroy_read_struct(&p, &info, nullptr);
  if (!ok) media_fail("PNG data is invalid: {}", err.empty() ? "decode error" : err);
  return std::move(*img);
}

// ---- WebP ---------------------------------------------------------------------------------------------------
RgbImage decode_webp(std::span<const uint8_t> b, const DecodeLimits& lim) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(b.data(), b.size(), &f) != VP8_STATUS_OK) media_fail("WebP header is invalid");
  if (f.has_animation) media_fail("animated WebP is not supported");
  check_size(f.width, f.height, lim, "WebP");
  RgbImage img(f.width, f.height);
  // RGB output drops alpha without premultiplying, like Pillow's RGBA → RGB.
  if (!WebPDecodeRGBInto(b.data(), b.size(), img.data.data(), img.data.size(), f.width * 3))
    media_fail("WebP data is invalid or truncated");
  return img;
}

// ---- GIF (first frame) --------------------------------------------------------------------------------------
struct GifReader {
  std::span<const uint8_t> b;
  size_t pos = 0;
};
int gif_read_mem(GifFileType* g, GifByteType* out, int n) {
  auto* r = static_cast<GifReader*>(g->UserData);
  size_t k = std::min(size_t(n), r->b.size() - r->pos);
  std::memcpy(out, r->b.data() + r->pos, k);
  r->pos += k;
  return int(k);
}

RgbImage decode_gif(std::span<const uint8_t> b, const DecodeLimits& lim) {
  GifReader rd{b, 0};
  int e = 0;
  GifFileType* g = DGifOpen(&rd, gif_read_mem, &e);
  if (!g) media_fail("GIF header is invalid: {}", GifErrorString(e) ? GifErrorString(e) : "error");
  std::unique_ptr<GifFileType, void (*)(GifFileType*)> guard(g, [](GifFileType* x) {
    int e2 = 0;
    DGifCloseFile(x, &e2);
  });
  check_size(g->SWidth, g->SHeight, lim, "GIF");
  const int W = g->SWidth, H = g->SHeight;
  GifRecordType rt;
  do {
    if (DGifGetRecordType(g, &rt) == GIF_ERROR) media_fail("GIF data is invalid or truncated");
    if (rt == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) media_fail("GIF extension is invalid");
      while (ext) {
        if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) media_fail("GIF extension is invalid");
      }
    } else if (rt == IMAGE_DESC_RECORD_TYPE) {
      if (DGifGetImageDesc(g) == GIF_ERROR) media_fail("GIF image descriptor is invalid");
      const GifImageDesc& d = g->Image;
      if (d.Width <= 0 || d.Height <= 0 || d.Left < 0 || d.Top < 0 || d.Left + d.Width > W ||
          d.Top + d.Height > H)
        media_fail("GIF frame {}x{}+{}+{} lies outside the {}x{} screen", d.Width, d.Height, d.Left, d.Top, W, H);
      const ColorMapObject* cm = d.ColorMap ? d.ColorMap : g->SColorMap;
      if (!cm) media_fail("GIF has no colour map");
      std::vector<GifPixelType> idx(size_t(d.Width) * d.Height);
      if (d.Interlace) {
        static const int off[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
        for (int pass = 0; pass < 4; ++pass)
          for (int y = off[pass]; y < d.Height; y += step[pass])
            if (DGifGetLine(g, &idx[size_t(y) * d.Width], d.Width) == GIF_ERROR)
              media_fail("GIF data is invalid or truncated");
      } else {
        for (int y = 0; y < d.Height; ++y)
          if (DGifGetLine(g, &idx[size_t(y) * d.Width], d.Width) == GIF_ERROR)
            media_fail("GIF data is invalid or truncated");
      }
      // Outside the first frame: the background colour (Pillow fills the screen with it for frame 0).
      RgbImage img(W, H);
      auto put = [&](size_t i, int ci) {
        GifColorType c = ci < cm->ColorCount ? cm->Colors[ci] : GifColorType{0, 0, 0};
        img.data[3 * i] = c.Red;
        img.data[3 * i + 1] = c.Green;
        img.data[3 * i + 2] = c.Blue;
      };
      for (size_t i = 0; i < size_t(W) * H; ++i) put(i, g->SBackGroundColor);
      for (int y = 0; y < d.Height; ++y)
        for (int x = 0; x < d.Width; ++x)
          put(size_t(d.Top + y) * W + d.Left + x, idx[size_t(y) * d.Width + x]);
      return img;
    }
  } while (rt != TERMINATE_RECORD_TYPE);
  media_fail("GIF has no image");
}

// ---- BMP ----------------------------------------------------------------------------------------------------
uint32_t rd32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24; }
uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

RgbImage decode_bmp(std::span<const uint8_t> b, const DecodeLimits& lim) {
  if (b.size() < 26) media_fail("BMP header is truncated");
  const uint32_t data_off = rd32(&b[10]);
  const uint32_t hsize = rd32(&b[14]);
  if (hsize < 40 || 14 + size_t(hsize) > b.size()) media_fail("BMP header (size {}) is unsupported or truncated", hsize);
  const int32_t w = int32_t(rd32(&b[18])), hraw = int32_t(rd32(&b[22]));
  const int bpp = rd16(&b[28]);
  const uint32_t comp = rd32(&b[30]);
  uint32_t ncol = rd32(&b[46]);
  if (hraw == INT32_MIN) media_fail("BMP height is invalid");
  const bool top_down = hraw < 0;
  const int h = top_down ? -hraw : hraw;
  check_size(w, h, lim, "BMP");
  if (comp != 0 && !(comp == 3 && (bpp == 32 || bpp == 16)))
    media_fail("BMP compression {} is not supported", comp);
  if (bpp != 1 && bpp != 4 && bpp != 8 && bpp != 16 && bpp != 24 && bpp != 32)
    media_fail("BMP bit depth {} is not supported", bpp);
  std::vector<uint8_t> pal;
  if (bpp <= 8) {
    if (ncol == 0 || ncol > (1u << bpp)) ncol = 1u << bpp;
    size_t po = 14 + hsize;
    if (po + size_t(ncol) * 4 > b.size()) media_fail("BMP palette is truncated");
    pal.assign(b.begin() + po, b.begin() + po + size_t(ncol) * 4);
  }
  uint32_t masks[3] = {0x00FF0000, 0x0000FF00, 0x000000FF};
  if (bpp == 16 && comp == 0) { masks[0] = 0x7C00; masks[1] = 0x03E0; masks[2] = 0x001F; }
  if (comp == 3) {
    if (b.size() < 66) media_fail("BMP bit masks are truncated");
    for (int k = 0; k < 3; ++k) masks[k] = rd32(&b[54 + 4 * k]);
  }
  const size_t stride = ((size_t(w) * bpp + 31) / 32) * 4;
  if (data_off > b.size() || stride * size_t(h) > b.size() - data_off) media_fail("BMP pixel data is truncated");
  auto extract = [](uint32_t v, uint32_t m) -> uint8_t {
    if (!m) return 0;
    int sh = __builtin_ctz(m);
    uint32_t mx = m >> sh;
    return uint8_t(((v & m) >> sh) * 255u / mx);
  };
  RgbImage img(w, h);
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = &b[data_off + stride * size_t(top_down ? y : h - 1 - y)];
    uint8_t* o = &img.data[size_t(y) * w * 3];
    for (int x = 0; x < w; ++x) {
      uint8_t r, g, bl;
      if (bpp == 24) { bl = row[3 * x]; g = row[3 * x + 1]; r = row[3 * x + 2]; }
      else if (bpp == 32 && comp == 0) { bl = row[4 * x]; g = row[4 * x + 1]; r = row[4 * x + 2]; }
      else if (bpp == 32 || bpp == 16) {
        uint32_t v = bpp == 32 ? rd32(&row[4 * x]) : rd16(&row[2 * x]);
        r = extract(v, masks[0]); g = extract(v, masks[1]); bl = extract(v, masks[2]);
      } else {
        int bitpos = x * bpp;
        int ci = (row[bitpos / 8] >> (8 - bpp - bitpos % 8)) & ((1 << bpp) - 1);
        if (size_t(ci) >= ncol) ci = 0;
        bl = pal[4 * ci]; g = pal[4 * ci + 1]; r = pal[4 * ci + 2];
      }
      o[3 * x] = r; o[3 * x + 1] = g; o[3 * x + 2] = bl;
    }
  }
  return img;
}

// JPEG through libjpeg's scanline API straight into a RowStreamPreprocessor. The same library and settings as
// tjDecompress2 with TJPF_RGB and flags 0 (out_color_space JCS_EXT_RGB, accurate integer IDCT, fancy upsampling), so
// the same pixels; like TurboJPEG, any libjpeg warning (a truncated or corrupt stream) fails the image. Everything
// libjpeg can longjmp over lives in the heap State, so the jump skips no C++ destructor.
struct JpegState {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr jerr{};
  std::jmp_buf jb{};
  char msg[JMSG_LENGTH_MAX] = {};
  bool warned = false, created = false;
  std::unique_ptr<RowStreamPreprocessor> sp;
  std::vector<JSAMPROW> rows;
  ~JpegState() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

void jpeg_error_exit(j_common_ptr c) {
  auto* st = reinterpret_cast<JpegState*>(c->client_data);
  (*c->err->format_message)(c, st->msg);
  std::longjmp(st->jb, 1);
}

void jpeg_emit_message(j_common_ptr c, int level) {
  auto* st = reinterpret_cast<JpegState*>(c->client_data);
  if (level < 0 && !st->warned) {  // a warning; trace messages (level >= 0) are ignored
    st->warned = true;
    (*c->err->format_message)(c, st->msg);
  }
}

PixelTensor preprocess_jpeg_streamed(std::span<const uint8_t> b, int w, int h, const ResizeLimits& rl) {
  auto st = std::make_unique<JpegState>();
  st->cinfo.err = jpeg_std_error(&st->jerr);
  st->jerr.error_exit = jpeg_error_exit;
  st->jerr.emit_message = jpeg_emit_message;
  st->cinfo.client_data = st.get();
  if (setjmp(st->jb)) media_fail("JPEG data is invalid or truncated: {}", st->msg);
  jpeg_create_decompress(&st->cinfo);
  st->created = true;
  jpeg_mem_src(&st->cinfo, b.data(), static_cast<unsigned long>(b.size()));
  jpeg_read_header(&st->cinfo, TRUE);
  if (int(st->cinfo.image_width) != w || int(st->cinfo.image_height) != h)
    media_fail("JPEG header is invalid: size {}x{} then {}x{}", w, h, st->cinfo.image_width, st->cinfo.image_height);
  st->cinfo.out_color_space = JCS_EXT_RGB;
  jpeg_start_decompress(&st->cinfo);
  if (st->cinfo.output_components != 3) media_fail("JPEG decoder gave {} components", st->cinfo.output_components);
  st->sp = std::make_unique<RowStreamPreprocessor>(h, w, rl);
  while (const int n = st->sp->batch()) {
    st->rows.resize(size_t(n));
    for (int i = 0; i < n; ++i) st->rows[size_t(i)] = st->sp->row(i);
    for (int got = 0; got < n;) {
      const JDIMENSION k = jpeg_read_scanlines(&st->cinfo, st->rows.data() + got, JDIMENSION(n - got));
      if (k == 0) media_fail("JPEG data is invalid or truncated: the decoder stopped at row {}", st->cinfo.output_scanline);
      got += int(k);
    }
    if (st->warned) media_fail("JPEG data is invalid or truncated: {}", st->msg);
    st->sp->consume();
  }
  jpeg_finish_decompress(&st->cinfo);
  if (st->warned) media_fail("JPEG data is invalid or truncated: {}", st->msg);
  return st->sp->finish();
}

}  // namespace

PixelTensor preprocess_encoded_image(std::span<const uint8_t> bytes, const DecodeLimits& lim,
                                     const ResizeLimits& rl) {
  if (bytes.empty()) media_fail("image data is empty");
  if (sniff_image_format(bytes) == ImageFormat::Jpeg) {
    // TurboJPEG's header check first: what it refuses (and CMYK) takes decode_jpeg's path and its errors.
    std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
    int w = 0, h = 0, sub = 0, cs = 0;
    if (tj && tjDecompressHeader3(tj.get(), bytes.data(), (unsigned long)bytes.size(), &w, &h, &sub, &cs) == 0 &&
        cs != TJCS_CMYK && cs != TJCS_YCCK) {
      check_size(w, h, lim, "JPEG");
      return preprocess_jpeg_streamed(bytes, w, h, rl);
    }
  }
  return preprocess_image(decode_image(bytes, lim), rl);
}

RgbImage decode_image(std::span<const uint8_t> bytes, const DecodeLimits& lim) {
  if (bytes.empty()) media_fail("image data is empty");
  switch (sniff_image_format(bytes)) {
    case ImageFormat::Jpeg: return decode_jpeg(bytes, lim);
    case ImageFormat::Png: return decode_png(bytes, lim);
    case ImageFormat::Webp: return decode_webp(bytes, lim);
    case ImageFormat::Gif: return decode_gif(bytes, lim);
    case ImageFormat::Bmp: return decode_bmp(bytes, lim);
    default: media_fail("image format not recognised (supported: JPEG, PNG, WebP, GIF, BMP)");
  }
}

}  // namespace m3::media
