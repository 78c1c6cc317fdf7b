// A loopback HttpServer over the scripted FakeBackend with a chosen config, and a raw TCP client that sends exact
// bytes and reads with deadlines — for tests of framing, deadlines, disconnects and shutdown, where a real HTTP
// client library would hide or fix up the bytes.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "server/http_server.h"
#include "server_test_util.h"

namespace m3::server::test {

class Harness {
 public:
  // `tweak` edits the config before the server starts; tokens come every `delay`.
  // `service_tweak` edits the service config (e.g. a media hook) before the service is built.
  explicit Harness(const std::function<void(HttpServerConfig&)>& tweak = {},
                   std::chrono::microseconds delay = std::chrono::microseconds(2000),
                   const std::function<void(ServiceConfig&)>& service_tweak = {}) {
    ServiceConfig sc = service_config();
    if (service_tweak) service_tweak(sc);
    service_ = std::make_unique<OpenAIService>(sc);
    backend_ = std::make_unique<FakeBackend>(qwen_tokenizer()->encode(" one two three four", false), delay);
    HttpServerConfig hc;
    hc.port = 0;
    hc.max_body_bytes = 4096;
    hc.max_connections = 8;
    hc.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> l(log_mu_);
      log_.push_back(line);
    };
    if (tweak) tweak(hc);
    server_ = std::make_unique<HttpServer>(hc, *service_, *backend_);
    server_->start();
  }
  ~Harness() {
    // io threads first, then the engine (its sinks hold sessions), then the server.
    server_->stop();
    backend_.reset();
    server_.reset();
  }
  HttpServer& server() { return *server_; }
  FakeBackend& backend() { return *backend_; }
  uint16_t port() const { return server_->port(); }
  std::vector<std::string> log_lines() {
    std::lock_guard<std::mutex> l(log_mu_);
    return log_;
  }

 private:
  std::unique_ptr<OpenAIService> service_;
  std::unique_ptr<FakeBackend> backend_;
  std::unique_ptr<HttpServer> server_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

// Blocking loopback socket with deadline-bounded reads.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : s_(ioc_) {
    s_.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
  }
  void send(const std::string& bytes) { boost::asio::write(s_, boost::asio::buffer(bytes)); }
  // Ends the sending side only (the peer reads EOF; answers can still be read).
  void shutdown_send() {
    boost::system::error_code ec;
    s_.shutdown(boost::asio::ip::tcp::socket::shutdown_send, ec);
  }
  void close() {
    boost::system::error_code ec;
    s_.close(ec);
  }
  // Reads until `needle` has arrived, the peer closed, or `limit` passed; returns everything read so far.
  std::string read_until(const std::string& needle, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (needle.empty() || got_.find(needle) == std::string::npos) {
      if (!read_some(deadline)) break;
    }
    return got_;
  }
  // Reads until the peer closes (true) or `limit` passes (false).
  bool read_to_close(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (read_some(deadline)) {
    }
    return closed_;
  }
  const std::string& received() const { return got_; }
  bool peer_closed() const { return closed_; }

 private:
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    if (closed_) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{s_.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, int(left.count())) <= 0) return false;
    char buf[65536];
    boost::system::error_code ec;
    size_t n = s_.read_some(boost::asio::buffer(buf), ec);
    if (ec) {
      closed_ = true;
      return false;
    }
    got_.append(buf, n);
    return true;
  }

  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::socket s_;
  std::string got_;
  bool closed_ = false;
};

inline std::string post(const std::string& target, const std::string& body, const std::string& extra_headers = "",
                        const std::string& version = "1.1") {
  return "POST " + target + " HTTP/" + version + "\r\nHost: x\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Polls `p` until it holds or `limit` passes.
template <typename Pred>
bool eventually(Pred p, std::chrono::milliseconds limit = std::chrono::seconds(3)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!p()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline int count_of(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace m3::server::test
