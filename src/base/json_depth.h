// Bracket depth of JSON text, counted before parsing. nlohmann's parser is iterative, but copying, comparing,
// dumping and destroying a parsed value recurse once per level: a 120 KB body nested 60k levels deep overflows an
// io thread's stack. Every parse of bytes that come from outside (request bodies, tool-call argument strings, model
// output) checks this first and refuses anything deeper than kMaxJsonDepth.
#pragma once

#include <string_view>

namespace m3 {

// Far above any real request (OpenAI's own schemas stop at a few dozen levels), far below a stack overflow.
inline constexpr int kMaxJsonDepth = 256;

// The deepest nesting of [ / { in `s`, ignoring brackets inside strings. Linear, allocation-free; malformed text
// gives some number (the parser reports the real error afterwards).
inline int json_nesting_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) max_depth = depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

inline bool json_too_deep(std::string_view s) { return json_nesting_depth(s) > kMaxJsonDepth; }

}  // namespace m3
