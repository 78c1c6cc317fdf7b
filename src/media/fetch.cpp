#include "media/fetch.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "media/media_error.h"

namespace m3::media {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Runs one async operation on `ioc` until it completes or the deadline passes; on timeout `cancel` closes the
// stream (which completes the operation with an error) and the result is a timeout.
template <typename Start, typename Cancel>
beast::error_code run_until(asio::io_context& ioc, Clock::time_point deadline, Start start, Cancel cancel,
                            bool* timed_out) {
  bool done = false;
  beast::error_code ec;
  start([&](beast::error_code e, auto&&...) {
    ec = e;
    done = true;
  });
  ioc.restart();
  ioc.run_until(deadline);
  if (!done) {
    *timed_out = true;
    cancel();
    ioc.restart();
    ioc.run();
  }
  return ec;
}

struct Response {
  int status = 0;
  std::string location;
  std::vector<uint8_t> body;
};

template <typename Stream>
Response exchange(asio::io_context& ioc, Stream& stream, const ParsedUrl& u, const FetchPolicy& p,
                  Clock::time_point deadline, bool* timed_out, const std::string& what) {
  http::request<http::empty_body> req{http::verb::get, u.target, 11};
  req.set(http::field::host, u.host);
  req.set(http::field::user_agent, "m3serve-media");
  req.set(http::field::accept, "*/*");
  req.set(http::field::connection, "close");
  auto close = [&] { beast::get_lowest_layer(stream).socket().close(); };
  beast::error_code ec = run_until(
      ioc, deadline, [&](auto h) { http::async_write(stream, req, h); }, close, timed_out);
  if (*timed_out) media_fail("{}: timed out after {} s", what, p.timeout_s);
  if (ec) media_fail("{}: sending the request failed: {}", what, ec.message());
  beast::flat_buffer buf;
  http::response_parser<http::vector_body<uint8_t>> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(uint64_t(p.max_bytes));
  ec = run_until(
      ioc, deadline, [&](auto h) { http::async_read(stream, buf, parser, h); }, close, timed_out);
  if (*timed_out) media_fail("{}: timed out after {} s", what, p.timeout_s);
  if (ec == http::error::body_limit)
    media_fail("{}: the response exceeds the media size limit of {} bytes", what, p.max_bytes);
  if (ec == http::error::header_limit) media_fail("{}: the response headers are too large", what);
  if (ec) media_fail("{}: reading the response failed: {}", what, ec.message());
  Response r;
  auto& m = parser.get();
  r.status = int(m.result_int());
  if (auto it = m.find(http::field::location); it != m.end()) r.location = std::string(it->value());
  r.body = std::move(m.body());
  return r;
}

}  // namespace

ParsedUrl parse_http_url(const std::string& url) {
  ParsedUrl u;
  std::string rest;
  const std::string l = lower(url.substr(0, 8));
  if (l.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (l.rfind("https://", 0) == 0) {
    u.https = true;
    rest = url.substr(8);
  } else {
    media_fail("media URL must start with http:// or https://");
  }
  size_t end = rest.find_first_of("/?#");
  std::string authority = rest.substr(0, end);
  std::string target = end == std::string::npos ? "" : rest.substr(end);
  if (size_t h = target.find('#'); h != std::string::npos) target.resize(h);
  if (target.empty() || target[0] != '/') target = "/" + target;
  if (authority.find('@') != std::string::npos) media_fail("media URL must not carry user credentials");
  if (authority.empty()) media_fail("media URL has no host");
  std::string host = authority, port;
  if (host[0] == '[') {  // [v6]:port
    size_t close = host.find(']');
    if (close == std::string::npos) media_fail("media URL has a malformed IPv6 host");
    if (close + 1 < host.size()) {
      if (host[close + 1] != ':') media_fail("media URL has a malformed host");
      port = host.substr(close + 2);
    }
    host = host.substr(1, close - 1);
  } else if (size_t c = host.rfind(':'); c != std::string::npos) {
    port = host.substr(c + 1);
    host.resize(c);
  }
  if (host.empty()) media_fail("media URL has no host");
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) media_fail("media URL has a space or control character");
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(port) == 0 || std::stoi(port) > 65535)
      media_fail("media URL has an invalid port");
  }
  u.host = lower(host);
  u.port = port.empty() ? (u.https ? "443" : "80") : port;
  u.target = target;
  return u;
}

bool host_allowed(const std::string& host, const std::vector<std::string>& domains) {
  if (domains.empty()) return true;
  const std::string h = lower(host);
  for (std::string d : domains) {
    d = lower(d);
    if (d.rfind("*.", 0) == 0) d = d.substr(2);
    if (h == d) return true;
    if (h.size() > d.size() && h.compare(h.size() - d.size(), d.size(), d) == 0 && h[h.size() - d.size() - 1] == '.')
      return true;
  }
  return false;
}

std::vector<uint8_t> fetch_http(const std::string& url, const FetchPolicy& p) {
  const auto deadline = Clock::now() + std::chrono::microseconds(int64_t(p.timeout_s * 1e6));
  ParsedUrl u = parse_http_url(url);
  asio::io_context ioc;
  std::optional<asio::ssl::context> tls;
  for (int hop = 0;; ++hop) {
    const std::string what = fmt::format("fetching media from {}", u.host);
    if (!host_allowed(u.host, p.allowed_domains))
      media_fail("media host '{}' is not in the server's allowed media domains", u.host);
    bool timed_out = false;
    tcp::resolver resolver(ioc);
    tcp::resolver::results_type endpoints;
    beast::error_code ec = run_until(
        ioc, deadline,
        [&](auto h) {
          resolver.async_resolve(u.host, u.port, [&, h](beast::error_code e, tcp::resolver::results_type r) mutable {
            endpoints = std::move(r);
            h(e);
          });
        },
        [&] { resolver.cancel(); }, &timed_out);
    if (timed_out) media_fail("{}: timed out after {} s", what, p.timeout_s);
    if (ec) media_fail("{}: cannot resolve the host", what);

    Response r;
    if (!u.https) {
      beast::tcp_stream stream(ioc);
      ec = run_until(
          ioc, deadline, [&](auto h) { stream.async_connect(endpoints, h); }, [&] { stream.socket().close(); },
          &timed_out);
      if (timed_out) media_fail("{}: timed out after {} s", what, p.timeout_s);
      if (ec) media_fail("{}: cannot connect: {}", what, ec.message());
      r = exchange(ioc, stream, u, p, deadline, &timed_out, what);
    } else {
      if (!tls) {
        tls.emplace(asio::ssl::context::tls_client);
        tls->set_default_verify_paths();
        tls->set_verify_mode(asio::ssl::verify_peer);
      }
      beast::ssl_stream<beast::tcp_stream> stream(ioc, *tls);
      if (!SSL_set_tlsext_host_name(stream.native_handle(), u.host.c_str()))
        media_fail("{}: TLS setup failed", what);
      stream.set_verify_callback(asio::ssl::host_name_verification(u.host));
      auto close = [&] { beast::get_lowest_layer(stream).socket().close(); };
      ec = run_until(
          ioc, deadline, [&](auto h) { beast::get_lowest_layer(stream).async_connect(endpoints, h); }, close,
          &timed_out);
      if (timed_out) media_fail("{}: timed out after {} s", what, p.timeout_s);
      if (ec) media_fail("{}: cannot connect: {}", what, ec.message());
      ec = run_until(
          ioc, deadline, [&](auto h) { stream.async_handshake(asio::ssl::stream_base::client, h); }, close,
          &timed_out);
      if (timed_out) media_fail("{}: timed out after {} s", what, p.timeout_s);
      if (ec) media_fail("{}: TLS handshake failed: {}", what, ec.message());
      r = exchange(ioc, stream, u, p, deadline, &timed_out, what);
    }

    if (r.status == 301 || r.status == 302 || r.status == 303 || r.status == 307 || r.status == 308) {
      if (r.location.empty()) media_fail("{}: redirect without a Location header", what);
      if (hop >= p.max_redirects) media_fail("{}: more than {} redirects", what, p.max_redirects);
      ParsedUrl next;
      if (r.location[0] == '/' && (r.location.size() < 2 || r.location[1] != '/')) {
        next = u;
        next.target = r.location;
        if (size_t h = next.target.find('#'); h != std::string::npos) next.target.resize(h);
      } else {
        next = parse_http_url(r.location);
      }
      if (u.https && !next.https) media_fail("{}: redirect from https to plain http refused", what);
      u = std::move(next);
      continue;
    }
    if (r.status < 200 || r.status >= 300) media_fail("{}: the server answered HTTP {}", what, r.status);
    if (r.body.empty()) media_fail("{}: the response body is empty", what);
    return std::move(r.body);
  }
}

}  // namespace m3::media
