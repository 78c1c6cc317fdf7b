// HTTP/1.1 server on Boost.Beast/Asio: a small pool of io threads, one strand per connection, keep-alive,
// request size limits, a connection cap, SSE streaming with chunked transfer encoding, and client-disconnect
// detection (write error or read EOF) that aborts the request's engine work.
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics,
// POST /tokenize, POST /detokenize. Every error is OpenAI's {"error": {...}} body with a 4xx/5xx status.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/backend.h"
#include "server/openai_service.h"

namespace m3::server {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                       // 0 = pick a free port (see HttpServer::port())
  int io_threads = 2;
  size_t max_body_bytes = size_t(32) << 20;   // larger bodies get 413
  int max_connections = 1024;                 // more concurrent connections get 429 + Retry-After
  std::chrono::seconds idle_timeout{120};     // keep-alive connections idle this long are closed
  // A stream with nothing to send for this long (a long prefill, a full batch) gets an SSE comment line, so
  // proxies and clients with read timeouts keep the connection. 0 = never.
  std::chrono::milliseconds sse_keepalive{10000};
};

struct HttpCounters {
  std::atomic<uint64_t> requests_2xx{0}, requests_4xx{0}, requests_5xx{0};
  std::atomic<uint64_t> connections_accepted{0}, connections_rejected{0};
  std::atomic<int64_t> connections_active{0};
  std::atomic<uint64_t> client_disconnects{0};  // generations aborted because the client went away
  std::atomic<uint64_t> streams_started{0};
};

class HttpServer {
 public:
  HttpServer(HttpServerConfig cfg, const OpenAIService& service, GenerationBackend& backend);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (throws m3::Error when the address is unusable) and starts the io threads.
  void start();
  // Stops accepting and joins the io threads. The backend must drop its sinks (they hold connections) before
  // this object is destroyed: stop the engine first.
  void stop();
  // Blocks until SIGINT or SIGTERM.
  void wait_for_signal();

  uint16_t port() const { return bound_port_; }
  const HttpServerConfig& config() const { return cfg_; }
  const OpenAIService& service() const { return service_; }
  GenerationBackend& backend() const { return backend_; }
  HttpCounters& counters() { return counters_; }
  // /metrics body: the engine's metrics plus the HTTP counters.
  std::string metrics_text() const;

  struct Impl;

 private:
  HttpServerConfig cfg_;
  const OpenAIService& service_;
  GenerationBackend& backend_;
  HttpCounters counters_;
  std::unique_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  uint16_t bound_port_ = 0;
};

}  // namespace m3::server
