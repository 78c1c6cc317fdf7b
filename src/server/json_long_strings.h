// Parsing request bodies that carry megabytes of base64 (image / video data: URLs) without pushing those bytes
// through nlohmann's lexer, which builds every string one character at a time (≈ 100–200 MB/s): a chat request
// with 8 × 1080p JPEGs is 16 MB of JSON, and parsing it took ≈ 140 ms before (bench/results/2026-12-02e-media-h200.md).
// Long strings that need no decoding — printable ASCII, no escapes — are cut out of the text before parsing, a
// short placeholder (a control character, a random per-call key and an index) parsed in their place, and the
// original bytes put back into the tree afterwards: the result is the same tree nlohmann would build from `body`.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

namespace m3::server {

// Strings at least this long are lifted out (shorter ones are cheaper to parse than to restore).
inline constexpr size_t kLiftMinBytes = 64 * 1024;

// nlohmann::ordered_json::parse(body) with long plain strings lifted out and restored. Throws what parse throws
// (nlohmann::json::parse_error etc.); error positions then count the placeholders, not the lifted bytes.
// lifted (optional): the number of strings lifted.
nlohmann::ordered_json parse_json_lifting_long_strings(std::string_view body, size_t* lifted = nullptr);

}  // namespace m3::server
