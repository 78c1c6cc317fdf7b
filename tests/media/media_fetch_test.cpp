// Remote media fetching (src/media/fetch.h) against a local HTTP server run by the test (CI has no internet):
// success, redirects (relative, absolute, loops), size limit, timeout, HTTP errors, the host allow-list, and the
// gateway path (http URL → same tensor and content hash as the same bytes sent as a data: URL).
#include <atomic>
#include <chrono>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>

#include "media/fetch.h"
#include "media/gateway.h"
#include "media/media_error.h"
#include "media/source.h"
#include "media_fixture_util.h"

namespace m3::media {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// One thread per connection; each answers a single request by its target.
class LocalServer {
 public:
  LocalServer() : acceptor_(ioc_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    png_ = testing::read_file("tests/media/photos/palette_color.png");
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~LocalServer() {
    stop_ = true;
    {  // wake the blocking accept (closing the acceptor from another thread does not)
      asio::io_context io;
      tcp::socket s(io);
      boost::system::error_code ec;
      s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), uint16_t(port_)), ec);
    }
    thread_.join();
    for (auto& t : conns_) t.join();
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  const std::vector<uint8_t>& png() const { return png_; }
  int port() const { return port_; }
  std::atomic<int> requests{0};

 private:
  void accept_loop() {
    while (!stop_) {
      tcp::socket s(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(s, ec);
      if (ec || stop_) return;
      conns_.emplace_back([this, s = std::move(s)]() mutable { serve(std::move(s)); });
    }
  }
  void serve(tcp::socket s) {
    boost::beast::flat_buffer buf;
    http::request<http::string_body> req;
    boost::system::error_code ec;
    http::read(s, buf, req, ec);
    if (ec) return;
    ++requests;
    const std::string t(req.target());
    http::response<http::vector_body<uint8_t>> res{http::status::ok, 11};
    auto redirect = [&](const std::string& loc) {
      res.result(http::status::found);
      res.set(http::field::location, loc);
    };
    if (t == "/img.png") {
      res.body() = png_;
    } else if (t == "/r1") {
      redirect("/r2");
    } else if (t == "/r2") {
      redirect(url("/img.png"));
    } else if (t == "/loop") {
      redirect("/loop");
    } else if (t == "/to-localhost") {
      redirect("http://localhost:" + std::to_string(port_) + "/img.png");
    } else if (t == "/big") {
      res.body().assign(100000, 7);
    } else if (t == "/slow") {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      res.body() = png_;
    } else if (t == "/empty") {
    } else if (t == "/junk") {
      res.body().assign(64, 'x');
    } else {
      res.result(http::status::not_found);
    }
    res.prepare_payload();
    http::write(s, res, ec);
    s.shutdown(tcp::socket::shutdown_both, ec);
  }

  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  std::vector<uint8_t> png_;
  std::thread thread_;
  std::vector<std::thread> conns_;
  std::atomic<bool> stop_{false};
};

std::string fetch_error(const std::string& url, const FetchPolicy& p) {
  try {
    fetch_http(url, p);
  } catch (const MediaError& e) {
    return e.what();
  }
  return "";
}

TEST(MediaFetch, ParsesUrlsAndRefusesOddOnes) {
  auto u = parse_http_url("HTTPS://Img.Example.com:8443/a/b.png?x=1#frag");
  EXPECT_TRUE(u.https);
  EXPECT_EQ(u.host, "img.example.com");
  EXPECT_EQ(u.port, "8443");
  EXPECT_EQ(u.target, "/a/b.png?x=1");
  EXPECT_EQ(parse_http_url("http://[::1]/x").host, "::1");
  EXPECT_EQ(parse_http_url("http://h").target, "/");
  EXPECT_EQ(parse_http_url("http://h").port, "80");
  EXPECT_THROW(parse_http_url("http://user:pw@h/x"), MediaError);
  EXPECT_THROW(parse_http_url("http://h:99999/x"), MediaError);
  EXPECT_THROW(parse_http_url("http:///x"), MediaError);
  EXPECT_THROW(parse_http_url("http://h/a b"), MediaError);
  EXPECT_THROW(parse_http_url("ftp://h/x"), MediaError);
}

TEST(MediaFetch, AllowListMatchesHostAndSubdomainsOnly) {
  EXPECT_TRUE(host_allowed("anything", {}));
  EXPECT_TRUE(host_allowed("example.com", {"example.com"}));
  EXPECT_TRUE(host_allowed("img.Example.com", {"*.example.com"}));
  EXPECT_FALSE(host_allowed("badexample.com", {"example.com"}));
  EXPECT_FALSE(host_allowed("example.com.evil.net", {"example.com"}));
}

TEST(MediaFetch, FetchesFollowsRedirectsAndEnforcesEveryLimit) {
  LocalServer srv;
  FetchPolicy p;
  p.timeout_s = 5;
  EXPECT_EQ(fetch_http(srv.url("/img.png"), p), srv.png());
  EXPECT_EQ(fetch_http(srv.url("/r1"), p), srv.png()) << "relative then absolute redirect";
  EXPECT_NE(fetch_error(srv.url("/loop"), p).find("more than 3 redirects"), std::string::npos);
  p.max_redirects = 1;
  EXPECT_NE(fetch_error(srv.url("/r1"), p).find("redirects"), std::string::npos);
  p.max_redirects = 3;
  EXPECT_NE(fetch_error(srv.url("/nope"), p).find("HTTP 404"), std::string::npos);
  EXPECT_NE(fetch_error(srv.url("/empty"), p).find("empty"), std::string::npos);
  p.max_bytes = 1000;
  EXPECT_NE(fetch_error(srv.url("/big"), p).find("size limit of 1000 bytes"), std::string::npos);
  p.max_bytes = 32 << 20;
  // Allow-list: checked before connecting and again at every redirect hop.
  p.allowed_domains = {"example.com"};
  const int before = srv.requests.load();
  EXPECT_NE(fetch_error(srv.url("/img.png"), p).find("not in the server's allowed media domains"),
            std::string::npos);
  EXPECT_EQ(srv.requests.load(), before) << "a refused host is never contacted";
  p.allowed_domains = {"127.0.0.1"};
  EXPECT_EQ(fetch_http(srv.url("/img.png"), p), srv.png());
  EXPECT_NE(fetch_error(srv.url("/to-localhost"), p).find("'localhost'"), std::string::npos);
  p.allowed_domains.clear();
  // Nothing listens on a port we just closed: a clear connect error, no hang.
  int dead_port;
  {
    asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    dead_port = a.local_endpoint().port();
  }
  EXPECT_NE(fetch_error("http://127.0.0.1:" + std::to_string(dead_port) + "/x", p).find("cannot connect"),
            std::string::npos);
  p.timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(fetch_error(srv.url("/slow"), p).find("timed out after 0.3 s"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(MediaFetch, GatewayServesHttpUrlsLikeDataUrlsAndRefusesJunkWith400Text) {
  LocalServer srv;
  GatewayOptions o;
  o.source.allow_remote = true;
  o.source.fetch.timeout_s = 5;
  MediaGateway gw(o);
  auto r = gw.prepare_sync("]<]image[>[", {{false, srv.url("/img.png")}});
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_EQ(r.media_tokens, 4);
  try {
    gw.prepare_sync("]<]image[>[", {{false, srv.url("/junk")}});
    FAIL();
  } catch (const MediaError& e) {
    EXPECT_NE(std::string(e.what()).find("image 0"), std::string::npos) << e.what();
  }
  GatewayOptions off;  // remote not enabled
  MediaGateway gw2(off);
  try {
    gw2.prepare_sync("]<]image[>[", {{false, srv.url("/img.png")}});
    FAIL();
  } catch (const MediaError& e) {
    EXPECT_NE(std::string(e.what()).find("remote media URLs are disabled"), std::string::npos) << e.what();
  }
  // Per-request pixel limit (after resizing): 10×10 → 56×56 = 3136 pixels.
  GatewayOptions px;
  px.source.allow_remote = true;
  px.max_pixels = 3000;
  MediaGateway gw3(px);
  EXPECT_THROW(gw3.prepare_sync("]<]image[>[", {{false, srv.url("/img.png")}}), MediaError);
  px.max_pixels = 3136;
  MediaGateway gw4(px);
  EXPECT_EQ(gw4.prepare_sync("]<]image[>[", {{false, srv.url("/img.png")}}).media_tokens, 4);
}

}  // namespace
}  // namespace m3::media
