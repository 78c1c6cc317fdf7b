#include "media/prompt.h"

#include <cstdio>

#include "media/media_error.h"

namespace m3::media {

std::string format_timestamp(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f", seconds);
  return buf;
}

std::string expansion_text(const ItemExpansion& e) {
  std::string out;
  const std::string_view slot = e.video ? kVideoToken : kImageToken;
  const int groups = e.video ? e.groups : 1;
  out.reserve(size_t(groups) * (40 + size_t(e.slots_per_group) * slot.size()));
  for (int g = 0; g < groups; ++g) {
    if (e.video && size_t(g) < e.timestamps.size()) out += "]<]" + e.timestamps[g] + " seconds[>[";
    out += kStartImage;  // video groups use the image start/end tokens too (the reference processor does)
    for (int64_t k = 0; k < e.slots_per_group; ++k) out += slot;
    out += kEndImage;
  }
  return out;
}

std::string expand_placeholders(std::string_view prompt, const std::vector<ItemExpansion>& items) {
  std::vector<const ItemExpansion*> images, videos;
  for (const auto& it : items) (it.video ? videos : images).push_back(&it);
  size_t ni = 0, nv = 0;
  std::string out;
  size_t pos = 0;
  while (pos < prompt.size()) {
    size_t a = prompt.find(kImageToken, pos), b = prompt.find(kVideoToken, pos);
    size_t next = std::min(a, b);
    if (next == std::string_view::npos) break;
    out.append(prompt.substr(pos, next - pos));
    if (next == a) {
      if (ni >= images.size()) media_fail("the prompt has more image placeholders than the {} images given", images.size());
      out += expansion_text(*images[ni++]);
      pos = next + kImageToken.size();
    } else {
      if (nv >= videos.size()) media_fail("the prompt has more video placeholders than the {} videos given", videos.size());
      out += expansion_text(*videos[nv++]);
      pos = next + kVideoToken.size();
    }
  }
  out.append(prompt.substr(std::min(pos, prompt.size())));
  if (ni != images.size() || nv != videos.size())
    media_fail("the prompt has {} image and {} video placeholders for {} images and {} videos", ni, nv,
               images.size(), videos.size());
  return out;
}

}  // namespace m3::media
