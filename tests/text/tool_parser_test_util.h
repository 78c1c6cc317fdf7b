// Shared harness for the M3 output-parser tests: table cases are checked against their expected
// message, and every chunking of the input (all 2-way splits, byte-by-byte, random multi-chunk
// splits) must stream to exactly the same message as the one-shot parse.
#pragma once

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/parsers/m3_output_parser.h"

namespace m3::test {

inline constexpr uint64_t kSeed = 1234;

// Test inputs write the namespace marker as '§' so tables stay readable.
inline std::string X(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "\xC2\xA7") == 0) {
      out += kM3Namespace;
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct ExpectedCall {
  std::string name;
  std::string arguments;  // exact JSON text (key order = the model's order)
};

struct Case {
  Case(std::string name_, std::string input_, bool starts_in_reasoning_, std::string reasoning_, std::string content_,
       std::vector<ExpectedCall> calls_ = {}, bool parse_tools_ = true)
      : name(std::move(name_)), input(std::move(input_)), starts_in_reasoning(starts_in_reasoning_),
        reasoning(std::move(reasoning_)), content(std::move(content_)), calls(std::move(calls_)),
        parse_tools(parse_tools_) {}
  std::string name;
  std::string input;  // with '§' for NS
  bool starts_in_reasoning = false;
  std::string reasoning;  // with '§' for NS
  std::string content;    // with '§' for NS
  std::vector<ExpectedCall> calls;
  bool parse_tools = true;
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

inline nlohmann::json test_tools() {
  return nlohmann::json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
      "lat":{"type":"number"},"note":{"type":["string","null"]},"limit":{"type":["integer","null"]}}}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{
      "tz":{"type":"string"}}}}},
    {"type":"function","function":{"name":"create_order","parameters":{"type":"object","properties":{
      "user_id":{"type":"integer"},
      "shipping":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"integer"}}},
      "items":{"type":"array","items":{"type":"object","properties":{
        "sku":{"type":"string"},"qty":{"type":"integer"}}}},
      "tags":{"type":"array","items":{"type":"string"}},
      "metadata":{"type":"object","additionalProperties":{"type":"string"}},
      "point":{"type":"array","prefixItems":[{"type":"number"},{"type":"string"}]},
      "opt":{"anyOf":[{"type":"object","properties":{"n":{"type":"integer"}}},{"type":"null"}]}}}}},
    {"type":"function","function":{"name":"no_params"}},
    {"type":"function","function":{"name":"free_form","parameters":{"type":"object"}}},
    {"name":"flat_tool","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}
  ])");
}

inline ParsedMessage stream(const Case& c, const nlohmann::json& tools, const std::vector<std::string>& chunks,
                            std::vector<ParsedDelta>* deltas = nullptr) {
  M3OutputParser p(c.starts_in_reasoning, tools, c.parse_tools, kSeed);
  ParsedMessage msg;
  for (const auto& ch : chunks) {
    ParsedDelta d = p.push(ch);
    msg.append(d);
    if (deltas) deltas->push_back(std::move(d));
  }
  ParsedDelta d = p.finish();
  msg.append(d);
  if (deltas) deltas->push_back(std::move(d));
  return msg;
}

inline void expect_same(const ParsedMessage& want, const ParsedMessage& got, const std::string& how) {
  EXPECT_EQ(want.reasoning, got.reasoning) << how;
  EXPECT_EQ(want.content, got.content) << how;
  ASSERT_EQ(want.tool_calls.size(), got.tool_calls.size()) << how;
  for (size_t i = 0; i < want.tool_calls.size(); ++i) {
    EXPECT_EQ(want.tool_calls[i].id, got.tool_calls[i].id) << how;
    EXPECT_EQ(want.tool_calls[i].name, got.tool_calls[i].name) << how;
    EXPECT_EQ(want.tool_calls[i].arguments_json, got.tool_calls[i].arguments_json) << how;
  }
}

// Streaming shape (docs/SERVING_FORMAT.md §2.3): each call's first delta has id + name + empty arguments, later
// ones only argument fragments; indices appear in order 0, 1, 2, ...
inline void expect_delta_shapes(const std::vector<ParsedDelta>& deltas) {
  int next_index = 0;
  std::vector<bool> seen;
  for (const auto& d : deltas) {
    for (const auto& tc : d.tool_calls) {
      ASSERT_GE(tc.index, 0);
      if (static_cast<size_t>(tc.index) >= seen.size()) seen.resize(tc.index + 1, false);
      if (!seen[tc.index]) {
        EXPECT_EQ(tc.index, next_index);
        ++next_index;
        seen[tc.index] = true;
        EXPECT_EQ(tc.id.rfind("call_", 0), 0u) << tc.id;
        EXPECT_FALSE(tc.name.empty());
        EXPECT_EQ(tc.arguments, "");
      } else {
        EXPECT_TRUE(tc.id.empty());
        EXPECT_TRUE(tc.name.empty());
      }
    }
  }
}

inline void check_case(const Case& c, const nlohmann::json& tools = test_tools()) {
  const std::string input = X(c.input);
  ParsedMessage full = M3OutputParser::parse_full(input, c.starts_in_reasoning, tools, c.parse_tools, kSeed);
  EXPECT_EQ(full.reasoning, X(c.reasoning));
  EXPECT_EQ(full.content, X(c.content));
  ASSERT_EQ(full.tool_calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(full.tool_calls[i].name, c.calls[i].name);
    EXPECT_EQ(full.tool_calls[i].arguments_json, c.calls[i].arguments);
    EXPECT_EQ(full.tool_calls[i].id.rfind("call_", 0), 0u);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(full.tool_calls[i].id, full.tool_calls[j].id);
  }
  if (::testing::Test::HasFailure()) return;  // one report per case, not one per split

  for (size_t k = 0; k <= input.size(); ++k) {
    std::vector<ParsedDelta> deltas;
    expect_same(full, stream(c, tools, {input.substr(0, k), input.substr(k)}, &deltas), "split at " + std::to_string(k));
    expect_delta_shapes(deltas);
    if (::testing::Test::HasFailure()) return;
  }
  std::vector<std::string> bytes;
  for (char ch : input) bytes.emplace_back(1, ch);
  std::vector<ParsedDelta> deltas;
  expect_same(full, stream(c, tools, bytes, &deltas), "byte by byte");
  expect_delta_shapes(deltas);

  std::mt19937 rng(static_cast<uint32_t>(input.size() * 7919 + 17));
  for (int trial = 0; trial < 40 && !::testing::Test::HasFailure(); ++trial) {
    std::vector<std::string> chunks;
    size_t pos = 0;
    while (pos < input.size()) {
      size_t n = std::uniform_int_distribution<size_t>(0, 9)(rng);  // 0: empty pushes must be harmless
      chunks.push_back(input.substr(pos, n));
      pos += n;
    }
    expect_same(full, stream(c, tools, chunks), "random split trial " + std::to_string(trial));
  }
}

}  // namespace m3::test
