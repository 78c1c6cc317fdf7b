// The chain `m3serve serve` builds (media::make_prepare_hook → server::ServiceConfig::prepare_media): chat requests
// with bad, truncated, oversized or forbidden media get a 400 invalid_media naming the item, valid ones reach the
// (not yet served) 400 unsupported_parameter, and with serve_media the expanded prompt is what gets tokenised.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "../chat_template/reference.h"
#include "../server/server_test_util.h"
#include "media/gateway.h"
#include "media_fixture_util.h"

namespace m3::media {
namespace {

namespace fs = std::filesystem;
using server::ApiError;
using server::ApiKind;

std::string body(const std::string& url) {
  return R"({"messages":[{"role":"user","content":[{"type":"text","text":"what is this"},)"
         R"({"type":"image_url","image_url":{"url":")" + url + R"("}}]}]})";
}

struct Svc {
  explicit Svc(GatewayOptions o, bool serve = false) {
    server::ServiceConfig c = server::test::service_config();
    c.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::parse(
        testref::slurp(testref::synthetic_m3_template_path()), "m3_format_synthetic.jinja"));
    c.prepare_media = make_prepare_hook(std::make_shared<MediaGateway>(o));
    c.serve_media = serve;
    svc = std::make_unique<server::OpenAIService>(c);
  }
  // {status, code, message} of preparing `url`.
  std::tuple<int, std::string, std::string> prepare(const std::string& url) {
    try {
      svc->prepare(ApiKind::Chat, body(url));
      return {200, "", ""};
    } catch (const ApiError& e) {
      return {e.status, e.code, e.what()};
    }
  }
  std::unique_ptr<server::OpenAIService> svc;
};

TEST(MediaService, EveryBadInputIsA400InvalidMediaNamingTheItem) {
  M3_REQUIRE_TOKENIZER();
  const auto png = testing::read_file("tests/media/photos/palette_color.png");
  GatewayOptions o;
  o.source.max_bytes = 4096;
  auto root = fs::temp_directory_path() / "m3_media_service_test";
  fs::create_directories(root);
  { std::ofstream(root / "ok.png", std::ios::binary).write(reinterpret_cast<const char*>(png.data()), png.size()); }
  o.source.allowed_local_path = root.string();
  Svc s(o);
  auto truncated = png;
  truncated.resize(png.size() / 2);
  std::vector<uint8_t> big(5000, 0x89);
  std::vector<uint8_t> bomb = png;  // IHDR claims 100000 × 100000
  bomb[16] = 0; bomb[17] = 1; bomb[18] = 0x86; bomb[19] = 0xA0;
  bomb[20] = 0; bomb[21] = 1; bomb[22] = 0x86; bomb[23] = 0xA0;
  const std::pair<std::string, std::string> cases[] = {
      {"data:image/png;base64," + testing::base64_encode(truncated), "image 0"},
      {"data:image/png;base64," + testing::base64_encode(big), "size limit"},
      {"data:image/png;base64," + testing::base64_encode(bomb), "image 0"},
      {"data:image/png;base64,@@@@", "base64"},
      {"data:image/png,rawbytes", "base64"},
      {"data:text/plain;base64," + testing::base64_encode({'h', 'i', '!'}), "image 0"},
      {"https://example.com/cat.png", "image 0"},  // remote disabled in GatewayOptions by default
      {"/etc/passwd", "outside the allowed directory"},
      {(root / ".." / "x.png").string(), "outside the allowed directory"},
      {"ftp://example.com/x.png", "unsupported media URL scheme"},
  };
  for (const auto& [url, want] : cases) {
    auto [status, code, msg] = s.prepare(url);
    EXPECT_EQ(status, 400) << url.substr(0, 60) << ": " << msg;
    EXPECT_EQ(code, "invalid_media") << url.substr(0, 60) << ": " << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << url.substr(0, 60) << ": " << msg;
  }
  // Valid media (a data: URL, an allowed local file) pass the gateway and reach the not-served 400.
  for (const std::string& url :
       {"data:image/png;base64," + testing::base64_encode(png), (root / "ok.png").string()}) {
    auto [status, code, msg] = s.prepare(url);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(code, "unsupported_parameter") << msg;
  }
  fs::remove_all(root);
}

TEST(MediaService, ServedMediaExpandTheAnchorBeforeTokenisation) {
  M3_REQUIRE_TOKENIZER();
  Svc s({}, /*serve=*/true);
  const auto png = testing::read_file("tests/media/photos/palette_color.png");  // 10×10 → 4 slot tokens
  auto job = s.svc->prepare(ApiKind::Chat, body("data:image/png;base64," + testing::base64_encode(png)));
  const std::string text = s.svc->config().tokenizer->decode(job.engine_requests[0].prompt, false);
  EXPECT_NE(text.find("]<]start of image[>[]<]image[>[]<]image[>[]<]image[>[]<]image[>[]<]end of image[>["),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace m3::media
