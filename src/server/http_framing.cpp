#include "server/http_framing.h"

#include <vector>

#include <boost/asio/buffer.hpp>

namespace m3::server {

namespace http = boost::beast::http;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequal(std::string_view a, std::string_view b) { return boost::beast::iequals(a, b); }

// Every coding of every Transfer-Encoding field line, in order (a list may be split over several lines; empty
// list elements are allowed by RFC 9110 §5.6.1 and skipped).
std::vector<std::string> transfer_codings(const http::request_header<>& head) {
  std::vector<std::string> out;
  auto [first, last] = head.equal_range(http::field::transfer_encoding);
  for (auto it = first; it != last; ++it) {
    std::string_view v(it->value().data(), it->value().size());
    size_t pos = 0;
    while (pos <= v.size()) {
      size_t comma = v.find(',', pos);
      if (comma == std::string_view::npos) comma = v.size();
      std::string_view c = trim(v.substr(pos, comma - pos));
      if (!c.empty()) out.emplace_back(c);
      pos = comma + 1;
    }
  }
  return out;
}

}  // namespace

std::optional<ApiError> check_request_head(const http::request_header<>& head) {
  const size_t hosts = head.count(http::field::host);
  if (head.version() >= 11 && hosts == 0) return ApiError(400, "HTTP/1.1 requests need a Host header", "", "bad_request");
  if (hosts > 1) return ApiError(400, "More than one Host header", "", "bad_request");
  if (head.count(http::field::transfer_encoding) == 0) return std::nullopt;
  const std::vector<std::string> codings = transfer_codings(head);
  if (head.version() < 11)
    return ApiError(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", "", "bad_request");
  if (head.count(http::field::content_length) > 0)
    return ApiError(400, "A request must not carry both Transfer-Encoding and Content-Length", "", "bad_request");
  if (codings.empty() || !iequal(codings.back(), "chunked"))
    return ApiError(400, "Transfer-Encoding must end with 'chunked' (the body length is otherwise unknown)", "",
                    "bad_request");
  for (size_t i = 0; i + 1 < codings.size(); ++i) {
    if (iequal(codings[i], "chunked"))
      return ApiError(400, "Transfer-Encoding applies 'chunked' more than once", "", "bad_request");
    return ApiError(501, "Transfer coding '" + codings[i] + "' is not supported (only 'chunked')", "",
                    "unsupported_transfer_coding");
  }
  return std::nullopt;
}

void configure_request_parser(http::request_parser<http::string_body>& p, size_t max_body_bytes) {
  p.header_limit(std::uint32_t(kMaxHeaderBytes));
  p.body_limit(max_body_bytes);
}

FramedRequest frame_request(std::string_view wire, size_t max_body_bytes) {
  FramedRequest r;
  http::request_parser<http::string_body> p;
  configure_request_parser(p, max_body_bytes);
  boost::beast::error_code ec;
  size_t used = 0;
  bool head_checked = false;
  auto fail = [&](int status, std::string msg) {
    r.state = FramedRequest::State::Error;
    r.error_status = status;
    r.error = std::move(msg);
    return r;
  };
  while (!p.is_done()) {
    const size_t n = p.put(boost::asio::buffer(wire.data() + used, wire.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) return r;
    if (ec == http::error::body_limit) return fail(413, ec.message());
    if (ec == http::error::header_limit) return fail(431, ec.message());
    if (ec) return fail(400, ec.message());
    if (p.is_header_done() && !head_checked) {
      head_checked = true;
      if (auto e = check_request_head(p.get().base())) return fail(e->status, e->what());
    }
    if (n == 0 && !p.is_done()) return r;
  }
  r.state = FramedRequest::State::Complete;
  r.consumed = used;
  r.method = std::string(p.get().method_string());
  r.target = std::string(p.get().target());
  r.keep_alive = p.get().keep_alive();
  r.body = p.get().body();
  return r;
}

}  // namespace m3::server
