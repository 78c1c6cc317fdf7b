// JSON schema → Grammar (grammar/grammar.h), for response_format json_schema / json_object, and M3's XML tool-call
// block for tool_choice required / named (docs/SERVER.md "Constrained decoding" lists the supported keywords).
//
// The generated JSON: one value (objects print their declared properties in schema order; required ones always,
// optional ones may be left out; no undeclared keys unless the object has no `properties`), bounded whitespace
// between tokens (at most 32 bytes of [ \t\n\r] per gap, so a model cannot stall in whitespace), numbers with at
// most 17 integer / 16 fraction / 2 exponent digits, strings as valid JSON strings of UTF-8 text.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "grammar/grammar.h"

namespace m3::grammar {

// A keyword or construct the compiler refuses; what() names it and the JSON pointer of the subschema.
class SchemaError : public m3::Error {
 public:
  using m3::Error::Error;
};

// One JSON value valid under `schema` (draft 2020-12 subset), with optional leading / trailing whitespace.
// Throws SchemaError.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

// tool_choice required / named for M3 (its format: docs/SERVING_FORMAT.md §3.3): one tool-call block of
// invokes of the given tools (several when `parallel`), each parameter written as M3 does — a tag per parameter,
// objects as nested tags, arrays as repeated <item> tags, scalars as text — with the values constrained by the
// parameter schemas. Required parameters always appear, in schema order. Throws SchemaError.
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;  // an object schema (or null: no parameters)
};
Grammar m3_tool_call_grammar(const std::vector<ToolSchema>& tools, bool parallel);

}  // namespace m3::grammar
