// Reasoning split of the M3 output parser (<mm:think>…</mm:think>, docs/SERVING_FORMAT.md §3.2), streaming and
// one-shot. Every case is also streamed at every split point (see tool_parser_test_util.h).
#include "tool_parser_test_util.h"

namespace m3::test {
namespace {

class ReasoningCases : public ::testing::TestWithParam<Case> {};

TEST_P(ReasoningCases, StreamedAtEverySplitEqualsOneShotAndExpected) { check_case(GetParam()); }

const std::vector<Case> kReasoningCases = {
    // name, input, starts_in_reasoning, reasoning, content
    {"EmptyOutput", "", false, "", ""},
    {"EmptyOutputInsideReasoning", "", true, "", ""},
    {"PlainContent", "Hello, world!", false, "", "Hello, world!"},
    {"StartedInsideClosesThenAnswers", "Let me think.\nOK.</mm:think>\n\nThe answer is 4.", true,
     "Let me think.\nOK.", "\n\nThe answer is 4."},
    {"StartedInsideNeverCloses", "still thinking about <this> and ]that[", true,
     "still thinking about <this> and ]that[", ""},
    {"AdaptiveModelOpensTag", "<mm:think>hmm</mm:think>Answer", false, "hmm", "Answer"},
    {"AdaptiveOpenNeverClosed", "<mm:think>abc", false, "abc", ""},
    {"AdaptiveNoThinking", "Direct answer.", false, "", "Direct answer."},
    {"ContentBeforeOpenTagStaysContent", "Sure.<mm:think>hmm</mm:think> ok", false, "hmm", "Sure. ok"},
    {"StrayLeadingCloserDropped", "</mm:think>Hello", false, "", "Hello"},
    {"StrayLeadingCloserAfterWhitespace", "\n</mm:think>\nHello", false, "", "\n\nHello"},
    {"TagsAfterThinkBlockAreText", "<mm:think>a</mm:think>b<mm:think>c</mm:think>d", false, "a",
     "b<mm:think>c</mm:think>d"},
    {"SecondCloserIsText", "r</mm:think>x</mm:think>y", true, "r", "x</mm:think>y"},
    {"RepeatedOpenerAtStartDropped", "<mm:think>abc</mm:think>x", true, "abc", "x"},
    {"RepeatedOpenerAfterWhitespaceDropped", "\n<mm:think>abc</mm:think>x", true, "\nabc", "x"},
    {"OpenerAfterReasoningTextIsText", "use <mm:think> tags</mm:think>ok", true, "use <mm:think> tags", "ok"},
    {"PartialCloserAtEndFlushesAsReasoning", "abc</mm:th", true, "abc</mm:th", ""},
    {"PartialOpenerAtEndFlushesAsContent", "hello <mm:thi", false, "", "hello <mm:thi"},
    {"LoneLessThanAtEnd", "a <", false, "", "a <"},
    {"LoneLessThanAtEndInsideReasoning", "a <", true, "a <", ""},
    {"StrayAnglesAndBrackets", "a<b</c <mm:x </mm:thinkx> ]< ]]<<", false, "", "a<b</c <mm:x </mm:thinkx> ]< ]]<<"},
    {"NearMissTagsInsideReasoning", "<mm:thin </mm:thinK> </mm think>]<]minimax[>[x</mm:think>done", true,
     "<mm:thin </mm:thinK> </mm think>]<]minimax[>[x", "done"},
    {"UnicodeReasoningAndContent", "思考中… 🤔 café</mm:think>答案: 42 ✅", true, "思考中… 🤔 café",
     "答案: 42 ✅"},
    {"CloserAtVeryEnd", "thinking</mm:think>", true, "thinking", ""},
    {"OnlyCloser", "</mm:think>", true, "", ""},
    {"OpenAndCloseOnly", "<mm:think></mm:think>", false, "", ""},
    {"MultilineReasoning", "line1\nline2\n\n</mm:think>\nfinal", true, "line1\nline2\n\n", "\nfinal"},
    {"ToolMarkupIgnoredWhenToolsOff", "x</mm:think>§<tool_call>§<invoke name=\"get_time\">§</invoke>§</tool_call>",
     true, "x", "§<tool_call>§<invoke name=\"get_time\">§</invoke>§</tool_call>", {}, /*parse_tools=*/false},
};

INSTANTIATE_TEST_SUITE_P(Table, ReasoningCases, ::testing::ValuesIn(kReasoningCases),
                         [](const auto& info) { return info.param.name; });

TEST(ReasoningStreaming, HoldsBackPossibleCloserUntilDisambiguated) {
  M3OutputParser p(/*starts_in_reasoning=*/true, nullptr, true, kSeed);
  ParsedDelta d = p.push("abc</mm:th");
  EXPECT_EQ(d.reasoning, "abc");
  d = p.push("ink>x");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "x");
  EXPECT_FALSE(p.in_reasoning());
}

TEST(ReasoningStreaming, ReleasesHeldTextWhenItIsNotAMarker) {
  M3OutputParser p(true, nullptr, true, kSeed);
  EXPECT_EQ(p.push("a </mm").reasoning, "a ");
  EXPECT_EQ(p.push("x").reasoning, "</mmx");
  EXPECT_TRUE(p.in_reasoning());
}

TEST(ReasoningStreaming, PlainTextIsNotHeldBack) {
  M3OutputParser p(false, nullptr, true, kSeed);
  EXPECT_EQ(p.push("Hello world").content, "Hello world");
  EXPECT_EQ(p.held_bytes(), 0u);
}

TEST(ReasoningStreaming, StreamEndingInsideReasoningFlushesAsReasoning) {
  M3OutputParser p(true, nullptr, true, kSeed);
  ParsedDelta d = p.push("deep thought </mm:thin");
  EXPECT_EQ(d.reasoning, "deep thought ");
  d = p.finish();
  EXPECT_EQ(d.reasoning, "</mm:thin");
  EXPECT_EQ(d.content, "");
}

TEST(ReasoningStreaming, MarkerEmittedAsManySmallPiecesIsStillAMarker) {
  // The model may spell <mm:think> with ordinary tokens (vLLM issues 45687/46042).
  M3OutputParser p(false, nullptr, true, kSeed);
  ParsedMessage m;
  for (const char* piece : {"<", "mm", ":", "th", "ink", ">", "r", "</", "mm:", "think", ">", "c"}) m.append(p.push(piece));
  m.append(p.finish());
  EXPECT_EQ(m.reasoning, "r");
  EXPECT_EQ(m.content, "c");
}

}  // namespace
}  // namespace m3::test
