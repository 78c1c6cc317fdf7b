// Image decoding to RGB8 the way HF's processor sees a PIL image: Pillow's Image.open(...).convert("RGB").
// Alpha is dropped (not composited), palettes are looked up, 16-bit samples keep their high byte (16-bit grey
// follows Pillow's I;16 → RGB rule), CMYK follows Pillow's cmyk2rgb, and no EXIF rotation is applied
// (docs/M3_MODEL.md §5.1.1, docs/MEDIA.md). Every malformed input throws MediaError; nothing aborts.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "media/image.h"

namespace m3::media {

enum class ImageFormat { Unknown, Jpeg, Png, Webp, Gif, Bmp };
const char* format_name(ImageFormat f);
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

struct DecodeLimits {
  int64_t max_pixels = 8192LL * 8192;  // decoded w*h; checked from the header, before any pixel is allocated
  int max_side = 16384;
};

RgbImage decode_image(std::span<const uint8_t> bytes, const DecodeLimits& lim = {});

// preprocess_image(decode_image(bytes, lim), rl), with the same result and errors; a JPEG is decoded scanline by
// scanline into the width pass (RowStreamPreprocessor), so its full-size pixels never go to memory.
PixelTensor preprocess_encoded_image(std::span<const uint8_t> bytes, const DecodeLimits& lim = {},
                                     const ResizeLimits& rl = {});

}  // namespace m3::media
