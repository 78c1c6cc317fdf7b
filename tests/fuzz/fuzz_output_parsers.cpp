// m3-fuzz-libs: m3_text
// libFuzzer target for the M3 output parsers (src/text/parsers/m3_output_parser.h, tool_parser.h).
// Input layout: byte 0 = flags (bit 0 starts_in_reasoning, bit 1 parse_tools off), byte 1 = chunking
// seed, rest = model output text. Besides "no crash / no sanitizer report / no exception", it checks
// the parser's contracts and aborts when one is broken:
//   - streaming the text in seed-dependent chunks gives exactly the one-shot result;
//   - every tool call has a call_ id, a known tool name and arguments that parse as a JSON object;
//   - with tools off and no think tags in the input, the content is the input verbatim.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/parsers/m3_output_parser.h"
#include "text/parsers/tool_parser.h"

namespace {

const nlohmann::json& fuzz_tools() {
  static const nlohmann::json tools = nlohmann::json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},"lat":{"type":"number"},
      "note":{"type":["string","null"]}}}}},
    {"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
      "o":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"type":"number"}}}},
      "l":{"type":"array","items":{"type":"object","additionalProperties":{"type":"boolean"}}},
      "p":{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}]},
      "u":{"anyOf":[{"type":"object"},{"type":"null"}]},"e":{"enum":[1,"x",true]}}}}},
    {"type":"function","function":{"name":"g"}},
    {"type":"function","function":{"name":"h","parameters":{"type":"object"}}}
  ])");
  return tools;
}

[[noreturn]] void contract_broken(const char* what) {
  std::fprintf(stderr, "contract broken: %s\n", what);
  std::abort();
}

void check_same(const m3::ParsedMessage& a, const m3::ParsedMessage& b) {
  if (a.reasoning != b.reasoning) contract_broken("streamed reasoning differs from one-shot");
  if (a.content != b.content) contract_broken("streamed content differs from one-shot");
  if (a.tool_calls.size() != b.tool_calls.size()) contract_broken("streamed tool-call count differs");
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments_json != b.tool_calls[i].arguments_json) {
      contract_broken("streamed tool call differs from one-shot");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool starts_in_reasoning = data[0] & 1;
  const bool parse_tools = !(data[0] & 2);
  const uint32_t chunk_seed = data[1];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const nlohmann::json& tools = fuzz_tools();

  m3::ParsedMessage full;
  try {
    full = m3::M3OutputParser::parse_full(text, starts_in_reasoning, tools, parse_tools, 42);
  } catch (...) {
    contract_broken("parse_full threw");
  }

  for (const auto& call : full.tool_calls) {
    if (call.id.rfind("call_", 0) != 0) contract_broken("tool call id without call_ prefix");
    if (m3::ToolSchemas(tools).find(call.name) == nullptr) contract_broken("tool call names an unknown tool");
    auto args = nlohmann::json::parse(call.arguments_json, nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) contract_broken("tool call arguments are not a JSON object");
  }
  if (!parse_tools && !starts_in_reasoning && text.find("mm:think>") == std::string_view::npos &&
      full.content != text) {
    contract_broken("plain text was altered");
  }

  // Same text, streamed in chunks of 0..16 bytes chosen by the seed byte.
  try {
    m3::M3OutputParser p(starts_in_reasoning, tools, parse_tools, 42);
    m3::ParsedMessage streamed;
    std::minstd_rand rng(chunk_seed + 1);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = rng() % 17;
      streamed.append(p.push(text.substr(pos, n)));
      pos += n;
    }
    streamed.append(p.finish());
    check_same(full, streamed);
  } catch (...) {
    contract_broken("streaming threw");
  }

  // The non-streaming helpers on raw input: must not throw or crash.
  try {
    (void)m3::parse_m3_invoke(text, m3::ToolSchemas(tools));
    static const nlohmann::json schemas = nlohmann::json::parse(
        R"([{"type":"integer"},{"type":"number"},{"type":"boolean"},{"type":"object"},
            {"type":"array","items":{"type":"integer"}},{"type":["string","null"]},{"enum":[1,2]}])");
    const auto& s = schemas[chunk_seed % schemas.size()];
    (void)m3::dump_json_lenient(m3::coerce_m3_value(text, &s));
  } catch (...) {
    contract_broken("invoke/coerce helper threw");
  }
  return 0;
}
