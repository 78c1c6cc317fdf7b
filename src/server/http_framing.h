// HTTP/1.1 request framing rules that Beast's parser leaves to the application (RFC 9112 §6-7, §3.2), as pure
// functions so the connection code, the tests and the fuzzer (tests/fuzz/fuzz_request_parse.cpp) share them.
//
// - Transfer-Encoding: only a single, final "chunked" is accepted. A final coding other than chunked
//   ("identity", "xchunked", "chunked, identity") is 400 — the body length would be unknowable, which is how
//   requests get smuggled; chunked after another coding ("gzip, chunked") is 501 (no coding but chunked is
//   implemented). Transfer-Encoding with Content-Length, or on HTTP/1.0, is 400.
// - Host: HTTP/1.1 requests need exactly one (400 otherwise).
// The connection answers every such error with "Connection: close" and closes: after a framing error the rest of
// the bytes cannot be trusted to be a next request.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http.hpp>

#include "server/api_error.h"

namespace m3::server {

inline constexpr size_t kMaxHeaderBytes = 64 * 1024;  // larger headers get 431

// Checks a parsed request head (before any body byte is read). nullopt = acceptable.
std::optional<ApiError> check_request_head(const boost::beast::http::request_header<>& head);

// Header/body limits every request parser gets.
void configure_request_parser(boost::beast::http::request_parser<boost::beast::http::string_body>& p,
                              size_t max_body_bytes);

// One request framed from the start of `wire` exactly as a connection frames it (same limits, same head checks),
// without a socket. Pipelined requests: call again on wire.substr(consumed).
struct FramedRequest {
  enum class State { Incomplete, Complete, Error };
  State state = State::Incomplete;
  size_t consumed = 0;   // bytes of `wire` this request used (Complete)
  int error_status = 0;  // 4xx/5xx (Error)
  std::string error;
  std::string method, target, body;
  bool keep_alive = false;
};
FramedRequest frame_request(std::string_view wire, size_t max_body_bytes);

}  // namespace m3::server
