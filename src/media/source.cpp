#include "media/source.h"

#include <filesystem>
#include <fstream>

#include "media/media_error.h"

namespace m3::media {

std::vector<uint8_t> base64_decode(std::string_view s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0, pad = 0;
  for (char c : s) {
    if (c == '=') { ++pad; continue; }
    if (c == '\n' || c == '\r' || c == ' ') continue;
    int v = val(c);
    if (v < 0 || pad) media_fail("data URL has invalid base64");
    acc = acc << 6 | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  if (bits >= 6 || pad > 2) media_fail("data URL has truncated base64");
  return out;
}

std::vector<uint8_t> load_media_bytes(const std::string& url, const SourcePolicy& p) {
  if (url.rfind("data:", 0) == 0) {
    size_t comma = url.find(',');
    if (comma == std::string::npos) media_fail("data URL has no ',' separator");
    std::string_view meta(url.data() + 5, comma - 5);
    if (meta.size() < 7 || meta.substr(meta.size() - 7) != ";base64") media_fail("data URL must be base64-encoded");
    std::string_view payload(url.data() + comma + 1, url.size() - comma - 1);
    if (int64_t(payload.size()) / 4 * 3 > p.max_bytes)
      media_fail("media item exceeds the size limit of {} bytes", p.max_bytes);
    return base64_decode(payload);
  }
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    if (!p.allow_remote)
      media_fail("remote media URLs are disabled on this server (`serve --no-remote-media`); send a "
                 "data: URL");
    FetchPolicy f = p.fetch;
    f.max_bytes = p.max_bytes;
    return fetch_http(url, f);
  }
  if (url.rfind("file://", 0) != 0 && url.find("://") != std::string::npos && url.find("://") < 16)
    media_fail("unsupported media URL scheme (use data:, http(s):// or an allowed local file)");
  std::string path = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  if (p.allowed_local_path.empty())
    media_fail("local media files are disabled (start the server with --allowed-local-media-path)");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path root = fs::weakly_canonical(p.allowed_local_path, ec);
  fs::path file = fs::weakly_canonical(path, ec);
  if (ec || !fs::path(path).is_absolute()) media_fail("local media path must be absolute");
  auto rel = file.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..") media_fail("local media path is outside the allowed directory");
  if (!fs::is_regular_file(file, ec)) media_fail("local media file not found");
  auto sz = fs::file_size(file, ec);
  if (ec || int64_t(sz) > p.max_bytes) media_fail("media item exceeds the size limit of {} bytes", p.max_bytes);
  std::ifstream f(file, std::ios::binary);
  std::vector<uint8_t> out(sz);
  if (!f.read(reinterpret_cast<char*>(out.data()), std::streamsize(sz))) media_fail("local media file unreadable");
  return out;
}

}  // namespace m3::media
