// Where media bytes come from: data: URLs (base64), local files only under an explicit allowed root (like vLLM's
// --allowed-local-media-path), remote http(s) only when allowed, through fetch_http (media/fetch.h) with its
// timeout, size, redirect and host allow-list limits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "media/fetch.h"

namespace m3::media {

struct SourcePolicy {
  std::string allowed_local_path;   // "" = local files refused
  bool allow_remote = false;        // http(s) URLs
  int64_t max_bytes = 32LL << 20;   // per item, encoded
  FetchPolicy fetch;                // remote: timeout, redirects, allowed domains (its max_bytes = max_bytes)
};

std::vector<uint8_t> load_media_bytes(const std::string& url, const SourcePolicy& policy);
std::vector<uint8_t> base64_decode(std::string_view s);  // throws MediaError on bad input

}  // namespace m3::media
