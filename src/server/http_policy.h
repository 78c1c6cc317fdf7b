// Who may call the server and what it writes down: the API key check, the CORS origin list and the access-log
// line. Pure functions; the connection code (http_server.cpp) applies them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace m3::server {

// "Authorization: Bearer <key>" against the configured key, in time independent of where they differ.
bool api_key_matches(std::string_view authorization_header, std::string_view key);

// The key as OpenAI clients send it (Authorization: Bearer) or as Anthropic clients do (x-api-key); either may
// carry it. Same timing properties as api_key_matches.
bool api_key_accepted(std::string_view authorization_header, std::string_view x_api_key, std::string_view key);

// OpenAI's answer to a missing or wrong key: 401, type invalid_request_error, code invalid_api_key.
ApiError invalid_api_key_error();

// Exact match against --allowed-origins ("*" allows any origin). An empty list allows none.
bool origin_allowed(const std::vector<std::string>& allowed, std::string_view origin);

struct AccessRecord {
  std::string peer;        // "127.0.0.1:53124"
  std::string method, target;
  unsigned version = 11;   // 10 / 11
  int status = 0;
  double latency_ms = 0;   // headers received → last byte queued
  std::string request_id;  // X-Request-Id, else the completion id, else "-"
  int prompt_tokens = -1, completion_tokens = -1;  // -1: not a generation
  std::string outcome;     // "" (finished), "client_disconnect", "shutdown_abort"
};

// One line, no newline: `127.0.0.1:53124 "POST /v1/completions HTTP/1.1" 200 12.3ms id=cmpl-… in=5 out=16`.
std::string access_log_line(const AccessRecord& r);

}  // namespace m3::server
