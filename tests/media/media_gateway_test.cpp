#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include <gtest/gtest.h>

#include "media/gateway.h"
#include "media/media_error.h"
#include "media/prompt.h"
#include "media/source.h"
#include "media_fixture_util.h"

namespace m3::media {
namespace {

std::string data_url(const std::string& path) {
  return "data:image/png;base64," + testing::base64_encode(testing::read_file(path));
}

TEST(MediaSource, Base64RoundTripsAndRejectsJunk) {
  std::vector<uint8_t> v = {0, 1, 2, 250, 251, 252, 7};
  EXPECT_EQ(base64_decode(testing::base64_encode(v)), v);
  EXPECT_THROW(base64_decode("ab$d"), MediaError);
  EXPECT_THROW(load_media_bytes("data:image/png,rawtext", {}), MediaError);
}

// The per-character decoder base64_decode had before its four-at-a-time path: the behaviour to keep.
std::optional<std::vector<uint8_t>> base64_decode_reference(std::string_view s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0, pad = 0;
  for (char c : s) {
    if (c == '=') { ++pad; continue; }
    if (c == '\n' || c == '\r' || c == ' ') continue;
    const int v = val(c);
    if (v < 0 || pad) return std::nullopt;
    acc = acc << 6 | uint32_t(v);
    bits += 6;
    if (bits >= 8) bits -= 8, out.push_back(uint8_t(acc >> bits));
  }
  if (bits >= 6 || pad > 2) return std::nullopt;
  return out;
}

TEST(MediaSource, Base64DecodesWrappedUrlSafeAndPaddedInputLikeTheCharacterLoop) {
  std::mt19937 g(7);
  const std::string alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_";
  const std::string extra = "= \n\r$\t.";  // padding, the skipped whitespace, and junk
  for (int round = 0; round < 4000; ++round) {
    const size_t n = g() % 64;
    std::string s;
    for (size_t i = 0; i < n; ++i) s += (g() % 8 == 0) ? extra[g() % extra.size()] : alpha[g() % alpha.size()];
    const auto ref = base64_decode_reference(s);
    if (ref) {
      EXPECT_EQ(base64_decode(s), *ref) << "'" << s << "'";
    } else {
      EXPECT_THROW(base64_decode(s), MediaError) << "'" << s << "'";
    }
  }
  // Long input wrapped at 76 characters (MIME), and the same without breaks.
  std::vector<uint8_t> bytes(100000);
  for (auto& b : bytes) b = uint8_t(g());
  const std::string enc = testing::base64_encode(bytes);
  std::string wrapped;
  for (size_t i = 0; i < enc.size(); i += 76) wrapped += enc.substr(i, 76) + "\r\n";
  EXPECT_EQ(base64_decode(enc), bytes);
  EXPECT_EQ(base64_decode(wrapped), bytes);
}

TEST(MediaSource, RemoteAndLocalNeedExplicitPermission) {
  SourcePolicy p;
  EXPECT_THROW(load_media_bytes("https://example.com/a.png", p), MediaError);
  EXPECT_THROW(load_media_bytes("/etc/passwd", p), MediaError);
  auto root = std::filesystem::temp_directory_path() / "m3_media_src_test";
  std::filesystem::create_directories(root);
  { std::ofstream(root / "x.bin") << "hello"; }
  p.allowed_local_path = root.string();
  EXPECT_EQ(load_media_bytes((root / "x.bin").string(), p).size(), 5u);
  EXPECT_EQ(load_media_bytes("file://" + (root / "x.bin").string(), p).size(), 5u);
  EXPECT_THROW(load_media_bytes((root / ".." / "etc" / "passwd").string(), p), MediaError);
  EXPECT_THROW(load_media_bytes("/etc/passwd", p), MediaError);
  p.max_bytes = 3;
  EXPECT_THROW(load_media_bytes((root / "x.bin").string(), p), MediaError);
}

TEST(MediaGatewayParts, CollectsOpenAiAndTemplatePartsInOrder) {
  auto msgs = nlohmann::ordered_json::parse(R"([
    {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:a"}},
                               {"type":"video_url","video_url":{"url":"data:b","fps":2}}]},
    {"role":"user","content":[{"type":"image","image":"data:c"}]},
    {"role":"assistant","content":"plain"}])");
  auto items = collect_media_items(msgs);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_FALSE(items[0].video);
  EXPECT_EQ(items[0].source(), "data:a");
  EXPECT_TRUE(items[1].video);
  EXPECT_EQ(items[1].fps, 2.0);
  EXPECT_EQ(items[2].source(), "data:c");
  // Borrowed, not copied: each item points at its part's string in the messages.
  EXPECT_EQ(items[0].url_ref, &msgs[0]["content"][1]["image_url"]["url"].get_ref<const std::string&>());
  EXPECT_EQ(items[2].url_ref, &msgs[1]["content"][0]["image"].get_ref<const std::string&>());
  EXPECT_TRUE(items[0].url.empty());
  auto bad = nlohmann::ordered_json::parse(R"([{"role":"user","content":[{"type":"image_url"}]}])");
  EXPECT_THROW(collect_media_items(bad), MediaError);
}

TEST(MediaGateway, ExpandsPromptReturnsTensorsAndCachesByContent) {
  MediaGateway gw({});
  const std::string url = data_url("tests/media/photos/chelsea.png");
  auto r = gw.prepare_sync("<u>]<]image[>[ and ]<]image[>[</u>", {{false, url}, {false, url}});
  ASSERT_EQ(r.items.size(), 2u);
  EXPECT_EQ(r.items[0]->pixels.gh, 22);
  EXPECT_EQ(r.items[0]->pixels.gw, 32);
  EXPECT_EQ(r.media_tokens, 2 * 176);
  size_t n_slots = 0;
  for (size_t p = r.prompt.find(kImageToken); p != std::string::npos; p = r.prompt.find(kImageToken, p + 1)) ++n_slots;
  EXPECT_EQ(n_slots, 352u);
  EXPECT_EQ(r.prompt.rfind("<u>]<]start of image[>[", 0), 0u);
  auto s = gw.stats();
  EXPECT_EQ(s.hits + s.misses, 2);
  auto r2 = gw.prepare_sync("]<]image[>[", {{false, url}});
  // The two identical items of the first request ran in parallel; whichever finished first was cached.
  EXPECT_TRUE(r2.items[0].get() == r.items[0].get() || r2.items[0].get() == r.items[1].get())
      << "same bytes → the cached tensor";
  EXPECT_GE(gw.stats().hits, 1);
  EXPECT_EQ(r2.items[0]->content_hash, r.items[0]->content_hash);
}

TEST(MediaGateway, BadItemsAndLimitsComeBackAsMediaErrorsNamingTheItem) {
  GatewayOptions o;
  o.max_images = 1;
  MediaGateway gw(o);
  const std::string url = data_url("tests/media/photos/chelsea.png");
  EXPECT_THROW(gw.prepare_sync("]<]image[>[]<]image[>[", {{false, url}, {false, url}}), MediaError);
  try {
    gw.prepare_sync("]<]image[>[", {{false, "data:image/png;base64,AAAA"}});
    FAIL();
  } catch (const MediaError& e) {
    EXPECT_NE(std::string(e.what()).find("image 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gw.prepare_sync("no anchor", {{false, url}}), MediaError);
  GatewayOptions t;
  t.max_media_tokens = 100;
  MediaGateway gw2(t);
  EXPECT_THROW(gw2.prepare_sync("]<]image[>[", {{false, url}}), MediaError);
}

TEST(MediaGateway, ChatMessagesToExpandedPromptInOneCall) {
  MediaGateway gw({});
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  msgs.push_back({{"role", "user"},
                  {"content", {{{"type", "text"}, {"text", "what is this"}},
                               {{"type", "image_url"},
                                {"image_url", {{"url", data_url("tests/media/photos/palette_color.png")}}}}}}});
  auto r = prepare_chat_media(gw, msgs, "<user>what is this ]<]image[>[</user>").get();
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_EQ(r.media_tokens, 4);  // 10x10 → 56x56 → 4x4 patches → 4 tokens
  EXPECT_EQ(r.prompt, "<user>what is this ]<]start of image[>[]<]image[>[]<]image[>[]<]image[>[]<]image[>[]<]end of image[>[</user>");
  auto bad = nlohmann::ordered_json::parse(R"([{"role":"user","content":[{"type":"video_url","video_url":{"url":"x","fps":9}}]}])");
  EXPECT_THROW(prepare_chat_media(gw, bad, "]<]video[>[").get(), MediaError);
}

TEST(MediaGateway, ManyConcurrentRequestsAllComplete) {
  GatewayOptions o;
  o.threads = 3;
  MediaGateway gw(o);
  const std::string a = data_url("tests/media/photos/palette_color.png");
  const std::string b = data_url("tests/media/fixtures/files/rgb.bmp");
  std::vector<std::future<PreparedMedia>> fs;
  for (int i = 0; i < 40; ++i) fs.push_back(gw.prepare("x]<]image[>[y", {{false, i % 2 ? a : b}}));
  for (auto& f : fs) EXPECT_EQ(f.get().items.size(), 1u);
  EXPECT_EQ(gw.stats().cached_items, 2);
}

}  // namespace
}  // namespace m3::media
