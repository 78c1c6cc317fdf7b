// Tool-call extraction of the M3 output parser (docs/SERVING_FORMAT.md §3.3–3.4): table cases, each also
// streamed at every split point, byte by byte and in random chunks (tool_parser_test_util.h).
#include "tool_parser_test_util.h"

namespace m3::test {
namespace {

class ToolCallCases : public ::testing::TestWithParam<Case> {};

TEST_P(ToolCallCases, StreamedAtEverySplitEqualsOneShotAndExpected) { check_case(GetParam()); }

const std::string kWeather = "§<invoke name=\"get_weather\">§<city>Paris§</city>§<days>3§</days>§</invoke>";
const std::string kTime = "§<invoke name=\"get_time\">§<tz>CET§</tz>§</invoke>";
const std::string kOrder =
    "§<invoke name=\"create_order\">"
    "§<user_id>42§</user_id>"
    "§<shipping>§<city>Singapore§</city>§<zip>018956§</zip>§</shipping>"
    "§<items>"
    "§<item>§<sku>book-001§</sku>§<qty>2§</qty>§</item>"
    "§<item>§<sku>pen-007§</sku>§<qty>5§</qty>§</item>"
    "§</items>"
    "§<tags>§<item>a§</item>§<item>b§</item>§</tags>"
    "§<metadata>§<source>mobile§</source>§<campaign>may§</campaign>§</metadata>"
    "§</invoke>";
const std::string kOrderArgs =
    R"({"user_id":42,"shipping":{"city":"Singapore","zip":18956},"items":[{"sku":"book-001","qty":2},)"
    R"({"sku":"pen-007","qty":5}],"tags":["a","b"],"metadata":{"source":"mobile","campaign":"may"}})";

const std::vector<Case> kToolCases = {
    {"NoMarkup", "Just text with a < and a ] in it.", false, "", "Just text with a < and a ] in it."},
    {"SingleCallAfterContent", "Let me check.\n§<tool_call>\n" + kWeather + "\n§</tool_call>", false, "",
     "Let me check.\n", {{"get_weather", R"({"city":"Paris","days":3})"}}},
    {"ParallelCalls", "§<tool_call>\n" + kWeather + "\n" + kTime + "\n§</tool_call>", false, "", "",
     {{"get_weather", R"({"city":"Paris","days":3})"}, {"get_time", R"({"tz":"CET"})"}}},
    {"TwoBlocks", "§<tool_call>" + kTime + "§</tool_call>mid§<tool_call>" + kWeather + "§</tool_call>", false, "",
     "mid", {{"get_time", R"({"tz":"CET"})"}, {"get_weather", R"({"city":"Paris","days":3})"}}},
    {"NestedObjectsAndArrays", "§<tool_call>\n" + kOrder + "\n§</tool_call>", false, "", "",
     {{"create_order", kOrderArgs}}},
    {"ReasoningThenCall", "I need the weather.</mm:think>\n§<tool_call>\n" + kWeather + "\n§</tool_call>", true,
     "I need the weather.", "\n", {{"get_weather", R"({"city":"Paris","days":3})"}}},
    {"AdaptiveThinkThenCall", "<mm:think>plan</mm:think>§<tool_call>" + kTime + "§</tool_call>", false, "plan", "",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"TextAfterBlockIsContent", "§<tool_call>" + kTime + "§</tool_call>\nDone.", false, "", "\nDone.",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"UnicodeValues",
     "§<tool_call>§<invoke name=\"get_weather\">§<city>Zürich 東京 🚀§</city>§<note>naïve — “quoted” \\ \"x\"§</note>"
     "§</invoke>§</tool_call>",
     false, "", "", {{"get_weather", R"({"city":"Zürich 東京 🚀","note":"naïve — “quoted” \\ \"x\""})"}}},
    {"StringValueKeptVerbatim",
     "§<tool_call>§<invoke name=\"get_weather\">§<city>  New\nYork <b> ]x[ </b>  §</city>§</invoke>§</tool_call>",
     false, "", "", {{"get_weather", R"({"city":"  New\nYork <b> ]x[ </b>  "})"}}},
    {"ValueWithNamespacePrefixFragment",
     "§<tool_call>§<invoke name=\"get_weather\">§<city>]<]minimax[ and <tool_call>§</city>§</invoke>§</tool_call>",
     false, "", "", {{"get_weather", R"({"city":"]<]minimax[ and <tool_call>"})"}}},
    {"Coercion",
     "§<tool_call>§<invoke name=\"get_weather\">§<days> 7 §</days>§<metric>True§</metric>§<lat>-12.5e1§</lat>"
     "§<note>null§</note>§<limit>null§</limit>§</invoke>§</tool_call>",
     false, "", "", {{"get_weather", R"({"days":7,"metric":true,"lat":-125.0,"note":null,"limit":null})"}}},
    {"UncoercibleValueStaysString",
     "§<tool_call>§<invoke name=\"get_weather\">§<days>three§</days>§<metric>maybe§</metric>§</invoke>§</tool_call>",
     false, "", "", {{"get_weather", R"({"days":"three","metric":"maybe"})"}}},
    {"NullIsExactCaseOnly",
     "§<tool_call>§<invoke name=\"get_weather\">§<limit>NULL§</limit>§<note>None§</note>§</invoke>§</tool_call>",
     false, "", "", {{"get_weather", R"({"limit":"NULL","note":"None"})"}}},
    {"StringParamNamedNullStaysString",
     "§<tool_call>§<invoke name=\"get_weather\">§<city>null§</city>§</invoke>§</tool_call>", false, "", "",
     {{"get_weather", R"({"city":"null"})"}}},
    {"UnknownSchemaKeepsStringsAndInfersContainers",
     "§<tool_call>§<invoke name=\"free_form\">§<a>1§</a>§<b>§<item>x§</item>§<item>2§</item>§</b>"
     "§<c>§<k>v§</k>§<k>w§</k>§</c>§</invoke>§</tool_call>",
     false, "", "", {{"free_form", R"({"a":"1","b":["x","2"],"c":{"k":["v","w"]}})"}}},
    {"JsonTextForContainerParams",
     "§<tool_call>§<invoke name=\"create_order\">§<shipping>{\"city\": \"X\", \"zip\": 1}§</shipping>"
     "§<tags>[\"p\", \"q\"]§</tags>§</invoke>§</tool_call>",
     false, "", "", {{"create_order", R"({"shipping":{"city":"X","zip":1},"tags":["p","q"]})"}}},
    {"PrefixItemsAnyOfAndEmptyContainers",
     "§<tool_call>§<invoke name=\"create_order\">§<point>§<item>1.5§</item>§<item>2§</item>§</point>"
     "§<opt>§<n>4§</n>§</opt>§<items>§</items>§<metadata>§</metadata>§</invoke>§</tool_call>",
     false, "", "", {{"create_order", R"({"point":[1.5,"2"],"opt":{"n":4},"items":[],"metadata":{}})"}}},
    {"RepeatedArrayParamMerges",
     "§<tool_call>§<invoke name=\"create_order\">§<tags>a§</tags>§<tags>b§</tags>§</invoke>§</tool_call>", false,
     "", "", {{"create_order", R"({"tags":["a","b"]})"}}},
    {"ToolWithoutParameters", "§<tool_call>\n§<invoke name=\"no_params\">\n§</invoke>\n§</tool_call>", false, "", "",
     {{"no_params", "{}"}}},
    {"FlatToolShape", "§<tool_call>§<invoke name=\"flat_tool\">§<x>5§</x>§</invoke>§</tool_call>", false, "", "",
     {{"flat_tool", R"({"x":5})"}}},
    {"WhitespaceBetweenNamespaceAndTag",
     "§ <tool_call>\n§\n<invoke name=\"get_time\">§ <tz>UTC§ </tz>§\t</invoke>\n§ </tool_call>", false, "", "",
     {{"get_time", R"({"tz":"UTC"})"}}},
    // At most 64 whitespace characters are tolerated inside a marker.
    {"LongGapAfterNamespaceLeavesTheBareOpener", "§" + std::string(65, ' ') + "<tool_call>" + kTime + "§</tool_call>",
     false, "", "§" + std::string(65, ' '), {{"get_time", R"({"tz":"CET"})"}}},
    {"LongGapAfterBareOpenerIsText", "<tool_call>" + std::string(65, '\n') + kTime + "§</tool_call>", false, "",
     "<tool_call>" + std::string(65, '\n') + kTime + "§</tool_call>"},
    {"GapOf64IsTolerated", "<tool_call>" + std::string(64, '\n') + kTime + "§</tool_call>", false, "", "",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"UnprefixedFirstToolCallTolerated", "<tool_call>\n" + kTime + "\n§</tool_call>", false, "", "",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"UnprefixedCloserTolerated", "§<tool_call>" + kTime + "</tool_call>after", false, "", "after",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"BareToolCallWithoutInvokeIsText", "Use <tool_call> tags like <tool_call>x</tool_call>.", false, "",
     "Use <tool_call> tags like <tool_call>x</tool_call>."},
    {"StrayMarkersInContent", "a ]<]minimax[>[ b ]<]minimax[>[<invoke c ]<]mini <tool_ca ]]<]<", false, "",
     "a ]<]minimax[>[ b ]<]minimax[>[<invoke c ]<]mini <tool_ca ]]<]<"},
    // Malformed markup: the raw text comes back as text. A call whose opening tag named a known tool was already
    // streaming: it is closed with the parameters that parsed, and the rest of its invoke comes back as content.
    {"UnknownToolIsContent", "§<tool_call>§<invoke name=\"nope\">§<a>1§</a>§</invoke>§</tool_call>", false, "",
     "§<tool_call>§<invoke name=\"nope\">§<a>1§</a>§</invoke>§</tool_call>"},
    {"MismatchedCloseTagEndsTheCallAndIsContent",
     "§<tool_call>§<invoke name=\"get_time\">§<tz>CET§</city>§</invoke>§</tool_call>", false, "",
     "§<tz>CET§</city>§</invoke>", {{"get_time", "{}"}}},
    {"MixedTextAndChildrenIsContent",
     "§<tool_call>§<invoke name=\"free_form\">§<a>text§<b>1§</b>§</a>§</invoke>§</tool_call>", false, "",
     "§<a>text§<b>1§</b>§</a>§</invoke>", {{"free_form", "{}"}}},
    {"M2StyleParameterIsContent",
     "§<tool_call>§<invoke name=\"get_time\">§<parameter name=\"tz\">CET§</parameter>§</invoke>§</tool_call>",
     false, "", "§<parameter name=\"tz\">CET§</parameter>§</invoke>", {{"get_time", "{}"}}},
    {"GoodParameterKeptBeforeBadOne",
     "§<tool_call>§<invoke name=\"get_weather\">§<city>Paris§</city>§<days>3§</oops>§</invoke>§</tool_call>", false,
     "", "§<days>3§</oops>§</invoke>", {{"get_weather", R"({"city":"Paris"})"}}},
    {"TextBetweenParametersEndsTheCall",
     "§<tool_call>§<invoke name=\"get_weather\">§<city>Paris§</city> oops §<days>3§</days>§</invoke>§</tool_call>",
     false, "", " oops §<days>3§</days>§</invoke>", {{"get_weather", R"({"city":"Paris"})"}}},
    // Never latch: after a bad invoke, the next well-formed one of the same block is still a call.
    {"BadInvokeThenGoodInvokeInOneBlock",
     "§<tool_call>§<invoke name=\"nope\">§<a>1§</a>§</invoke>\n" + kTime + "§</tool_call>after", false, "",
     "§<tool_call>§<invoke name=\"nope\">§<a>1§</a>§</invoke>after", {{"get_time", R"({"tz":"CET"})"}}},
    {"MalformedParameterThenGoodInvoke",
     "§<tool_call>§<invoke name=\"get_time\">§<tz>CET§</city>§</invoke>" + kWeather + "§</tool_call>", false, "",
     "§<tz>CET§</city>§</invoke>", {{"get_time", "{}"}, {"get_weather", R"({"city":"Paris","days":3})"}}},
    {"NonAdjacentRepeatedParameterIsADuplicateKey",
     "§<tool_call>§<invoke name=\"create_order\">§<tags>a§</tags>§<user_id>1§</user_id>§<tags>b§</tags>§</invoke>"
     "§</tool_call>",
     false, "", "", {{"create_order", R"({"tags":["a"],"user_id":1,"tags":["b"]})"}}},
    {"EmptyBlockIsContent", "§<tool_call>\n§</tool_call>", false, "", "§<tool_call>\n§</tool_call>"},
    {"UnclosedInvokeAtEndKeepsTheCall", "ok §<tool_call>\n§<invoke name=\"get_time\">§<tz>CE", false, "",
     "ok §<tz>CE", {{"get_time", "{}"}}},
    {"UnclosedHeaderAtEndIsContent", "ok §<tool_call>\n§<invoke name=\"get_ti", false, "",
     "ok §<tool_call>\n§<invoke name=\"get_ti"},
    {"PartialOpenerAtEndIsContent", "plain §<tool_ca", false, "", "plain §<tool_ca"},
    {"NamespaceOnlyAtEndIsContent", "plain §", false, "", "plain §"},
    {"CommittedCallKeptWhenStreamCutsNext", "plain §<tool_call>\n" + kTime + "\n§<invoke name=\"get_weather\">§<city>Pa",
     false, "", "plain §<city>Pa", {{"get_time", R"({"tz":"CET"})"}, {"get_weather", "{}"}}},
    // A forgotten NS</invoke> between parameters: the call is complete.
    {"MissingInvokeCloseBeforeBlockClose",
     "§<tool_call>§<invoke name=\"get_time\">§<tz>CET§</tz>§</tool_call>tail", false, "", "tail",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"MissingInvokeCloseBeforeNextInvoke", "§<tool_call>§<invoke name=\"get_time\">§<tz>CET§</tz>" + kWeather + "§</tool_call>",
     false, "", "", {{"get_time", R"({"tz":"CET"})"}, {"get_weather", R"({"city":"Paris","days":3})"}}},
    {"GarbageBetweenInvokesAfterCommit", "§<tool_call>" + kTime + "\noops " + kWeather + "§</tool_call>", false, "",
     "\noops " + kWeather + "§</tool_call>", {{"get_time", R"({"tz":"CET"})"}}},
    {"BadInvokeAfterGoodOneKeepsGoodOne", "§<tool_call>" + kTime + "§<invoke name=\"nope\">§</invoke>§</tool_call>",
     false, "", "§<invoke name=\"nope\">§</invoke>", {{"get_time", R"({"tz":"CET"})"}}},
    {"InvokeNameUnquotedAndSingleQuoted",
     "§<tool_call>§<invoke name=get_time>§<tz>A§</tz>§</invoke>§<invoke name='get_time'>§<tz>B§</tz>§</invoke>"
     "§</tool_call>",
     false, "", "", {{"get_time", R"({"tz":"A"})"}, {"get_time", R"({"tz":"B"})"}}},
    {"ToolsOffMeansContent", "§<tool_call>" + kTime + "§</tool_call>", false, "", "§<tool_call>" + kTime + "§</tool_call>",
     {}, /*parse_tools=*/false},
    // Tool markup inside reasoning (docs/SERVING_FORMAT.md §3.4): a valid block ends the reasoning implicitly.
    {"CallInsideReasoningEndsIt", "need time §<tool_call>" + kTime + "§</tool_call>", true, "need time ", "",
     {{"get_time", R"({"tz":"CET"})"}}},
    {"CallInsideReasoningThenStrayCloser", "need time\n§<tool_call>" + kTime + "§</tool_call></mm:think>\n", true,
     "need time\n", "\n", {{"get_time", R"({"tz":"CET"})"}}},
    {"MalformedBlockInsideReasoningStaysReasoning",
     "maybe §<tool_call>§<invoke name=\"nope\">§</invoke>§</tool_call> no</mm:think>answer", true,
     "maybe §<tool_call>§<invoke name=\"nope\">§</invoke>§</tool_call> no", "answer"},
    {"UnfinishedHeaderInsideReasoningStaysReasoning", "maybe §<tool_call>§<invoke name=\"get_ti", true,
     "maybe §<tool_call>§<invoke name=\"get_ti", ""},
    {"InvokeOpenedInsideReasoningIsACall", "maybe §<tool_call>§<invoke name=\"get_time\">", true, "maybe ", "",
     {{"get_time", "{}"}}},
};

INSTANTIATE_TEST_SUITE_P(Table, ToolCallCases, ::testing::ValuesIn(kToolCases),
                         [](const auto& info) { return info.param.name; });

TEST(ToolCallStreaming, HeaderAtTheOpeningTagThenArgumentsAsParametersClose) {
  M3OutputParser p(false, test_tools(), true, kSeed);
  auto args = [](const ParsedDelta& d) {
    std::string a;
    for (const auto& t : d.tool_calls) a += t.arguments;
    return a;
  };
  ParsedDelta d = p.push(X("Hi §<tool_call>\n§<invoke name=\"get_weather\">§<city>Pa"));
  EXPECT_EQ(d.content, "Hi ");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  EXPECT_EQ(p.num_tool_calls(), 1);
  // A closed parameter waits until the next one opens with another tag (a repeat would merge into an array).
  EXPECT_EQ(args(p.push(X("ris§</city>§<da"))), "");
  d = p.push(X("ys>3§</days>"));
  EXPECT_EQ(args(d), R"({"city":"Paris")");
  EXPECT_TRUE(d.tool_calls[0].id.empty());
  EXPECT_EQ(args(p.push(X("§</invoke>"))), R"(,"days":3})");
  d = p.push(X("\n§</tool_call>"));
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(p.finish().empty());
}

TEST(ToolCallStreaming, HoldsBackNamespacePrefixOnly) {
  M3OutputParser p(false, test_tools(), true, kSeed);
  EXPECT_EQ(p.push("Hello ]<]mini").content, "Hello ");
  EXPECT_EQ(p.push("max[>[x").content, "]<]minimax[>[x");
  EXPECT_EQ(p.held_bytes(), 0u);
}

TEST(ToolCallStreaming, CallIdsAreDeterministicPerSeedAndDistinct) {
  std::string text = X("§<tool_call>" + kTime + kTime + "§</tool_call>");
  auto a = M3OutputParser::parse_full(text, false, test_tools(), true, 7);
  auto b = M3OutputParser::parse_full(text, false, test_tools(), true, 7);
  auto c = M3OutputParser::parse_full(text, false, test_tools(), true, 8);
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, b.tool_calls[0].id);
  EXPECT_NE(a.tool_calls[0].id, a.tool_calls[1].id);
  EXPECT_NE(a.tool_calls[0].id, c.tool_calls[0].id);
  auto r1 = M3OutputParser::parse_full(text, false, test_tools());
  auto r2 = M3OutputParser::parse_full(text, false, test_tools());
  EXPECT_NE(r1.tool_calls[0].id, r2.tool_calls[0].id);  // random seed by default
}

TEST(ToolCallStreaming, NullToolsTurnsMarkupIntoContent) {
  std::string text = X("§<tool_call>" + kTime + "§</tool_call>");
  auto m = M3OutputParser::parse_full(text, false, nullptr);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, text);
}

TEST(ToolCallStreaming, InvalidUtf8InValueDoesNotThrow) {
  std::string text = X("§<tool_call>§<invoke name=\"get_time\">§<tz>\xff\xfe ok§</tz>§</invoke>§</tool_call>");
  ParsedMessage m;
  EXPECT_NO_THROW(m = M3OutputParser::parse_full(text, false, test_tools(), true, kSeed));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments_json, "{\"tz\":\"\xEF\xBF\xBD\xEF\xBF\xBD ok\"}");
}

TEST(ToolCallStreaming, LongWhitespaceRunAfterOpenerIsNotHeldBack) {
  // Tolerated whitespace inside a marker is bounded, so a degenerate run is released, not rescanned.
  M3OutputParser p(false, test_tools(), true, kSeed);
  ParsedMessage m;
  m.append(p.push("<tool_call>"));
  for (int i = 0; i < 100000; ++i) m.append(p.push(" "));
  EXPECT_LT(p.held_bytes(), 100u);
  m.append(p.finish());
  EXPECT_EQ(m.content, "<tool_call>" + std::string(100000, ' '));
}

TEST(ToolCallStreaming, LongArgumentStreamedInTinyChunksStaysLinear) {
  // A 200 KB string argument pushed 3 bytes at a time must not rescan the whole invoke each push.
  std::string big(200000, 'x');
  std::string text = X("§<tool_call>§<invoke name=\"get_time\">§<tz>") + big + X("§</tz>§</invoke>§</tool_call>");
  M3OutputParser p(false, test_tools(), true, kSeed);
  ParsedMessage m;
  for (size_t i = 0; i < text.size(); i += 3) m.append(p.push(std::string_view(text).substr(i, 3)));
  m.append(p.finish());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments_json.size(), big.size() + 9);
  // Each push may re-examine only the few bytes a marker could straddle (kM3Namespace is < 16 bytes); a rescan
  // of the whole invoke per push would examine ~200 KB × 67 000 pushes.
  EXPECT_GT(p.invoke_bytes_scanned(), big.size());
  EXPECT_LT(p.invoke_bytes_scanned(), 8 * text.size());
}

TEST(ToolCallStreaming, RandomMarkupSoupStreamsLikeOneShot) {
  // Property check over generated outputs mixing markers, marker fragments, tags and text: for each,
  // random chunkings must reproduce the one-shot result, and every call's arguments must be an object.
  const std::vector<std::string> pieces = {
      X("§"), "<tool_call>", "</tool_call>", X("§<tool_call>"), X("§</tool_call>"), "<invoke name=\"get_time\">",
      X("§<invoke name=\"get_weather\">"), X("§<invoke name=\"free_form\">"), X("§</invoke>"), X("§<tz>"),
      X("§</tz>"), X("§<city>"), X("§</city>"), X("§<days>"), X("§</days>"), X("§<item>"), X("§</item>"),
      "<mm:think>", "</mm:think>", "<mm:th", "]<]mini", "<", "]", " ", "\n", "CET", "42", "null", "é東", "x"};
  const nlohmann::json tools = test_tools();
  std::mt19937 rng(2026);
  int with_calls = 0;
  for (int doc = 0; doc < 3000; ++doc) {
    std::string text;
    int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int k = 0; k < n; ++k) text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    bool sir = rng() & 1;
    ParsedMessage full = M3OutputParser::parse_full(text, sir, tools, true, kSeed);
    with_calls += !full.tool_calls.empty();
    for (const auto& tc : full.tool_calls) {
      ASSERT_TRUE(nlohmann::json::parse(tc.arguments_json, nullptr, false).is_object()) << tc.arguments_json;
    }
    for (int trial = 0; trial < 3; ++trial) {
      M3OutputParser p(sir, tools, true, kSeed);
      ParsedMessage got;
      size_t pos = 0;
      while (pos < text.size()) {
        size_t len = std::uniform_int_distribution<size_t>(1, 12)(rng);
        got.append(p.push(std::string_view(text).substr(pos, len)));
        pos += len;
      }
      got.append(p.finish());
      expect_same(full, got, "doc " + std::to_string(doc) + ": " + text);
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(with_calls, 0);  // the generator does reach valid tool calls
}

}  // namespace
}  // namespace m3::test
