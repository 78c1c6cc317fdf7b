// MediaError: bad media input (undecodable, truncated, too large, forbidden source). The HTTP layer maps it to a 400
// whose message is what() — it names the item and the reason, never a path outside the allowed roots.
#pragma once

#include "base/error.h"

namespace m3::media {

class MediaError : public m3::Error {
 public:
  explicit MediaError(const std::string& msg) : m3::Error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void media_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw MediaError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace m3::media
