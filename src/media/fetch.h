// Remote media: an http(s) GET with an overall deadline, a body size limit, a redirect limit and a host
// allow-list (issue 12 item 5, like vLLM's --media-fetch-timeout / --allowed-media-domains). Every failure is a
// MediaError (→ HTTP 400) whose message names the host and the reason, never a crash or a hang.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m3::media {

struct FetchPolicy {
  double timeout_s = 10;                     // whole fetch (resolve, connect, TLS, request, redirects, body)
  int max_redirects = 3;
  int64_t max_bytes = 32LL << 20;            // body
  std::vector<std::string> allowed_domains;  // empty: any host; else the host or a subdomain of one entry
};

struct ParsedUrl {
  bool https = false;
  std::string host, port, target;  // target = path + query ("/" at least)
};
// http(s)://host[:port][/path][?query]; user info and fragments-only oddities are refused (MediaError).
ParsedUrl parse_http_url(const std::string& url);

// True when `host` is allowed by `domains` (empty = all; "example.com" allows it and "*.example.com" hosts).
bool host_allowed(const std::string& host, const std::vector<std::string>& domains);

std::vector<uint8_t> fetch_http(const std::string& url, const FetchPolicy& policy);

}  // namespace m3::media
