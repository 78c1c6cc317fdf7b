// MiniMax-M3 tool-call markup: parsing one complete `invoke` element into an OpenAI tool call, with
// argument values coerced by the tool's JSON schema. The streaming state machine that finds invoke
// elements in model output lives in m3_output_parser.h; this file is the pure, non-streaming part.
//
// Format (docs/SERVING_FORMAT.md §3.3), NS = "]<]minimax[>[":
//   NS<invoke name="get_weather">NS<city>ParisNS</city>NS<days>3NS</days>NS</invoke>
// One element per parameter, named after it; objects nest as child elements; arrays are repeated
// NS<item>…NS</item> children. Whitespace between NS and the following '<' is tolerated.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace m3 {

inline constexpr std::string_view kM3Namespace = "]<]minimax[>[";

// Tool name → JSON schema of its parameters, built from an OpenAI `tools` array. Accepts both
// {"type":"function","function":{"name","parameters"}} and the flat {"name","parameters"} shape;
// entries without a string name are skipped (never throws on odd input).
class ToolSchemas {
 public:
  ToolSchemas() = default;
  explicit ToolSchemas(const nlohmann::json& tools);

  // Parameters schema of a known tool (a null json when the tool declares none); nullptr if unknown.
  const nlohmann::json* find(std::string_view name) const;
  bool empty() const { return by_name_.empty(); }

 private:
  std::map<std::string, nlohmann::json, std::less<>> by_name_;
};

struct ParsedInvoke {
  std::string name;
  std::string arguments_json;  // a JSON object, keys in the order the model wrote them
};

// Parses one complete invoke element: `invoke_text` runs from its leading NS through the closing
// `NS</invoke>`. Returns nullopt for malformed markup or a tool name not in `tools`; the caller then
// returns the raw text as content. Never throws.
std::optional<ParsedInvoke> parse_m3_invoke(std::string_view invoke_text, const ToolSchemas& tools);

// Converts the text of one leaf element to JSON using its schema (nullptr = unknown schema):
// string types stay verbatim; integer / number / boolean / object / array are parsed from the trimmed
// text and fall back to the verbatim string when they do not parse; "null" (exact case) becomes null
// unless the schema is string-only; an unknown schema keeps the string. Exposed for tests.
nlohmann::ordered_json coerce_m3_value(std::string_view text, const nlohmann::json* schema);

// Serialises arguments without throwing on invalid UTF-8 (bytes are replaced by U+FFFD).
std::string dump_json_lenient(const nlohmann::ordered_json& j);

}  // namespace m3
