#include "server/http_policy.h"

#include <fmt/format.h>

namespace m3::server {

bool api_key_matches(std::string_view header, std::string_view key) {
  constexpr std::string_view kBearer = "Bearer ";
  if (key.empty()) return true;
  if (header.size() < kBearer.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < kBearer.size(); ++i) diff |= (header[i] ^ kBearer[i]);
  std::string_view given = header.substr(kBearer.size());
  diff |= (given.size() != key.size());
  // Compare over the key's length whatever the given length, so timing does not reveal a matching prefix.
  for (size_t i = 0; i < key.size(); ++i) diff |= ((i < given.size() ? given[i] : 0) ^ key[i]);
  return diff == 0;
}

bool api_key_accepted(std::string_view authorization_header, std::string_view x_api_key, std::string_view key) {
  if (api_key_matches(authorization_header, key)) return true;
  if (x_api_key.empty()) return false;
  return api_key_matches("Bearer " + std::string(x_api_key), key);
}

ApiError invalid_api_key_error() {
  return ApiError(401,
                  "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>' "
                  "(the server was started with --api-key or M3SERVE_API_KEY).",
                  "", "invalid_api_key", "invalid_request_error");
}

bool origin_allowed(const std::vector<std::string>& allowed, std::string_view origin) {
  if (origin.empty()) return false;
  for (const auto& a : allowed)
    if (a == "*" || a == origin) return true;
  return false;
}

std::string access_log_line(const AccessRecord& r) {
  // Control characters in the client-chosen target or id would forge log lines: escape them.
  auto clean = [](std::string_view s) {
    std::string out;
    for (unsigned char c : s) {
      if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
        out += fmt::format("\\x{:02x}", c);
      else
        out += char(c);
    }
    return out;
  };
  std::string line = fmt::format("{} \"{} {} HTTP/{}.{}\" {} {:.1f}ms id={}", r.peer, clean(r.method),
                                 clean(r.target), r.version / 10, r.version % 10, r.status, r.latency_ms,
                                 r.request_id.empty() ? "-" : clean(r.request_id));
  if (r.prompt_tokens >= 0) line += fmt::format(" in={} out={}", r.prompt_tokens, r.completion_tokens);
  if (!r.outcome.empty()) line += " " + r.outcome;
  return line;
}

}  // namespace m3::server
