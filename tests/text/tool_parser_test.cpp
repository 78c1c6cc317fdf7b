// Non-streaming pieces of the M3 tool-call parser: schema-driven value coercion and parsing of one
// complete invoke element (src/text/parsers/tool_parser.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/parsers/tool_parser.h"
#include "tool_parser_test_util.h"

namespace m3::test {
namespace {

using nlohmann::json;

struct CoerceCase {
  std::string name;
  std::string text;
  std::string schema;    // JSON, or "" for no schema
  std::string expected;  // JSON text of the result
};

class Coercion : public ::testing::TestWithParam<CoerceCase> {};

TEST_P(Coercion, ValueMatchesSchema) {
  const auto& c = GetParam();
  json schema = c.schema.empty() ? json() : json::parse(c.schema);
  auto got = coerce_m3_value(c.text, c.schema.empty() ? nullptr : &schema);
  EXPECT_EQ(dump_json_lenient(got), c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Table, Coercion,
    ::testing::ValuesIn(std::vector<CoerceCase>{
        {"UnknownSchemaKeepsString", " 42 ", "", R"(" 42 ")"},
        {"EmptySchemaObjectKeepsString", "true", "{}", R"("true")"},
        {"StringVerbatim", "  a\tb ", R"({"type":"string"})", R"("  a\tb ")"},
        {"StringLooksLikeNumber", "007", R"({"type":"string"})", R"("007")"},
        {"IntegerTrimmed", " 42\n", R"({"type":"integer"})", "42"},
        {"IntegerLeadingZeros", "018956", R"({"type":"integer"})", "18956"},
        {"IntegerNegativeAndPlus", "+5", R"({"type":"integer"})", "5"},
        {"IntegerFromIntegralFloat", "3.0", R"({"type":"integer"})", "3"},
        {"IntegerNotParsable", "3.5", R"({"type":"integer"})", R"("3.5")"},
        {"IntegerHugeStaysString", "123456789012345678901234567890", R"({"type":"integer"})",
         R"("123456789012345678901234567890")"},
        {"NumberFloat", "2.5", R"({"type":"number"})", "2.5"},
        {"NumberInteger", "10", R"({"type":"number"})", "10"},
        {"NumberRejectsInfNan", "inf", R"({"type":"number"})", R"("inf")"},
        {"NumberRejectsOverflow", "1e999", R"({"type":"number"})", R"("1e999")"},
        {"BooleanTrue", "true", R"({"type":"boolean"})", "true"},
        {"BooleanCaseInsensitive", " FALSE ", R"({"type":"boolean"})", "false"},
        {"BooleanNotParsable", "yes please", R"({"type":"boolean"})", R"("yes please")"},
        {"NullExactCase", "null", R"({"type":["integer","null"]})", "null"},
        {"NullWrongCase", "Null", R"({"type":["integer","null"]})", R"("Null")"},
        {"NullForNonStringType", "null", R"({"type":"integer"})", "null"},
        {"NullStringStaysString", "null", R"({"type":"string"})", R"("null")"},
        {"NullableStringNull", "null", R"({"type":["string","null"]})", "null"},
        {"ObjectFromJson", R"({"a": [1, 2]})", R"({"type":"object"})", R"({"a":[1,2]})"},
        {"ObjectKeyOrderKept", R"({"z":1,"a":2})", R"({"type":"object"})", R"({"z":1,"a":2})"},
        {"ObjectBadJsonStaysString", "{oops", R"({"type":"object"})", R"("{oops")"},
        {"ArrayFromJson", "[1, \"x\"]", R"({"type":"array"})", R"([1,"x"])"},
        {"ArrayWrapsBareValue", "7", R"({"type":"array","items":{"type":"integer"}})", "[7]"},
        {"ArrayEmptyText", "", R"({"type":"array"})", "[]"},
        {"ObjectEmptyText", " ", R"({"type":"object"})", "{}"},
        {"TooDeepJsonStaysString", std::string(300, '[') + std::string(300, ']'), R"({"type":"array"})",
         "\"" + std::string(300, '[') + std::string(300, ']') + "\""},
        {"AnyOfIntegerOrNull", "5", R"({"anyOf":[{"type":"integer"},{"type":"null"}]})", "5"},
        {"EnumInfersType", "3", R"({"enum":[1,2,3]})", "3"},
        {"EnumOfStrings", "3", R"({"enum":["3","4"]})", R"("3")"},
        {"TypeListPrefersString", "12", R"({"type":["integer","string"]})", R"("12")"},
        {"PythonStyleTypeNames", "4", R"({"type":"int"})", "4"},
        {"UnicodeString", "日本語 ✓", R"({"type":"string"})", R"("日本語 ✓")"},
    }),
    [](const auto& info) { return info.param.name; });

TEST(ParseInvoke, ParsesNestedInvoke) {
  ToolSchemas tools(test_tools());
  auto r = parse_m3_invoke(X("§<invoke name=\"get_weather\">§<city>Paris§</city>§<days>3§</days>§</invoke>"), tools);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->name, "get_weather");
  EXPECT_EQ(r->arguments_json, R"({"city":"Paris","days":3})");
}

TEST(ParseInvoke, RejectsUnknownToolAndMalformedMarkup) {
  ToolSchemas tools(test_tools());
  for (const char* bad : {
           "§<invoke name=\"nope\">§</invoke>",                           // unknown tool
           "§<invoke name=\"get_time\">§<tz>x§</invoke>",                 // unclosed parameter
           "§<invoke name=\"get_time\">§<tz>x§</tz>§</tz>§</invoke>",     // extra closer
           "§<invoke name=\"get_time\">junk§<tz>x§</tz>§</invoke>",       // text before a parameter
           "§<invoke name=\"get_time\">§<tz>x§</tz>junk§</invoke>",       // text after a parameter
           "§<invoke name=\"get_time\">§tz>x§</tz>§</invoke>",            // tag without '<'
           "§<invoke name=\"get_time\">§<tz x§</tz>§</invoke>",           // tag without '>'
           "§<invoke name=\"get_time\">§<a b>x§</a b>§</invoke>",         // whitespace in a name
           "§<invoke name=\"get_time\">§<>x§</>§</invoke>",               // empty name
           "§<invoke name=\"get_time\">§</invoke>§<tz>x§</tz>",           // markup after the end
           "§<invoke name=\"get_time\"§</invoke>",                        // header without '>'
           "§<invoke nam=\"get_time\">§</invoke>",                        // bad attribute
           "§<invoke name=\"get_time>§</invoke>",                         // unterminated quote
           "§<invoke name=\"\">§</invoke>",                               // empty tool name
           "<invoke name=\"get_time\">§</invoke>",                        // missing namespace
           "§<invoke name=\"get_time\">",                                 // no end
       }) {
    EXPECT_FALSE(parse_m3_invoke(X(bad), tools).has_value()) << bad;
  }
}

TEST(ParseInvoke, NestingDepthIsBounded) {
  ToolSchemas tools(test_tools());
  std::string open, close;
  for (int i = 0; i < 100; ++i) {
    open += "§<a>";
    close = "§</a>" + close;
  }
  EXPECT_FALSE(parse_m3_invoke(X("§<invoke name=\"free_form\">" + open + "x" + close + "§</invoke>"), tools));
  std::string open2, close2;
  for (int i = 0; i < 10; ++i) {
    open2 += "§<a>";
    close2 = "§</a>" + close2;
  }
  auto ok = parse_m3_invoke(X("§<invoke name=\"free_form\">" + open2 + "x" + close2 + "§</invoke>"), tools);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->arguments_json, R"({"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":"x"}}}}}}}}}})");
}

TEST(ToolSchemas, AcceptsOpenAiAndFlatShapesAndSkipsJunk) {
  ToolSchemas t(json::parse(R"([1, "x", {"type":"function","function":{"name":"a","parameters":{"type":"object"}}},
                                {"name":"b"}, {"function":{"name":5}}, {"function":{}}])"));
  ASSERT_NE(t.find("a"), nullptr);
  EXPECT_TRUE(t.find("a")->is_object());
  ASSERT_NE(t.find("b"), nullptr);
  EXPECT_TRUE(t.find("b")->is_null());
  EXPECT_EQ(t.find("c"), nullptr);
  EXPECT_TRUE(ToolSchemas(json()).empty());
  EXPECT_TRUE(ToolSchemas(json::object()).empty());
}

}  // namespace
}  // namespace m3::test
