// Placeholder expansion (docs/M3_MODEL.md §5.6): the chat template emits one bare anchor per media item
// (`]<]image[>[` / `]<]video[>[`); the processor replaces it with the wrapped slot tokens.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace m3::media {

inline constexpr std::string_view kImageToken = "]<]image[>[";             // id 200025
inline constexpr std::string_view kVideoToken = "]<]video[>[";             // id 200026
inline constexpr std::string_view kStartImage = "]<]start of image[>[";    // id 200029
inline constexpr std::string_view kEndImage = "]<]end of image[>[";        // id 200030

// Python f"{ts:.1f}" for a double (correct rounding, exact ties to even; glibc printf agrees).
std::string format_timestamp(double seconds);

// What one item contributes to the prompt.
struct ItemExpansion {
  bool video = false;
  int64_t slots_per_group = 0;           // image: t·gh·gw/4 (one group); video: gh·gw/4 per temporal group
  int groups = 1;                        // video: grid_t
  std::vector<std::string> timestamps;   // video: one per group, or empty when the metadata has no fps/indices
};

std::string expansion_text(const ItemExpansion& e);

// Replaces the anchors of `prompt` in order, one item each; images and videos are counted separately
// (the k-th image anchor takes the k-th image). Throws MediaError when the counts differ.
std::string expand_placeholders(std::string_view prompt, const std::vector<ItemExpansion>& items);

}  // namespace m3::media
