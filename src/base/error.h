// Error handling: m3serve throws m3::Error for every user-facing failure (bad file, bad config, bad
// request). Boundaries (CLI main, HTTP handlers, engine loop) catch it and turn it into a message or a
// 4xx body; nothing in the library calls abort() on bad input.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace m3 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace m3

// Checks a condition that depends on input data; throws m3::Error with a formatted message.
#define M3_CHECK(cond, ...)          \
  do {                               \
    if (!(cond)) ::m3::fail(__VA_ARGS__); \
  } while (0)
