// Client-facing errors of the OpenAI-compatible API. Everything the HTTP layer rejects is thrown as an ApiError
// and rendered as OpenAI's error body {"error": {"message", "type", "param", "code"}} with the given status.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace m3::server {

struct ApiError : std::runtime_error {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field ("" = none)
  std::string code;   // machine-readable code ("" = none)

  ApiError(int status_, std::string message, std::string param_ = {}, std::string code_ = {},
           std::string type_ = {})
      : std::runtime_error(std::move(message)), status(status_), param(std::move(param_)), code(std::move(code_)) {
    if (!type_.empty())
      type = std::move(type_);
    else if (status_ == 404)
      type = "not_found_error";
    else if (status_ == 429 || status_ == 503)
      type = "server_overloaded";
    else if (status_ >= 500)
      type = "internal_server_error";
  }
};

// 400 naming a request field.
template <typename... Args>
[[noreturn]] inline void bad_field(const std::string& field, fmt::format_string<Args...> f, Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), field);
}

// {"error": {...}} as text.
std::string error_body(const ApiError& e);
std::string error_body(int status, const std::string& message, const std::string& type = "",
                       const std::string& param = "", const std::string& code = "");

}  // namespace m3::server
