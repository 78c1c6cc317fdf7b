// HTTP/1.1 server on Boost.Beast/Asio: a small pool of io threads, one strand per connection, keep-alive,
// request size limits and deadlines, a connection cap with a reserve for health checks, a global budget for
// buffered request bodies, SSE streaming with chunked transfer encoding, client-disconnect detection (write error
// or read EOF, also with pipelined bytes pending) that aborts the request's engine work, optional API key and
// CORS, one access-log line per request, and a graceful shutdown (see shutdown()).
//
// Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/messages, POST /v1/messages/count_tokens,
// GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize. Every error is OpenAI's
// {"error": {...}} body with a 4xx/5xx status (Anthropic's {"type":"error",...} on the /v1/messages routes).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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
  // Threads that prepare requests which may block (chat requests with image / video parts: the media gateway may
  // fetch remote URLs), so they never hold an io thread (OpenAIService::prepare_may_block).
  int prepare_threads = 2;
  size_t max_body_bytes = size_t(32) << 20;   // larger bodies get 413
  // Request bodies being received or waiting to be parsed, all connections together; a request that would go
  // over gets 503 + Retry-After (before its body is read when it has a Content-Length).
  size_t max_buffered_body_bytes = size_t(512) << 20;
  int max_connections = 1024;                 // more concurrent connections get 429 + Retry-After
  // Beyond max_connections, this many more connections are still read (with a short deadline) so GET /health and
  // GET /metrics answer while slow clients hold every regular slot; anything else on them gets 429.
  int reserved_connections = 32;
  // A request's headers must arrive within header_timeout of its first byte (of the connection, for the first
  // request); its body within body_timeout of the headers. A keep-alive connection idle for idle_timeout is closed.
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds idle_timeout{60000};
  // A stream with nothing to send for this long (a long prefill, a full batch) gets an SSE comment line, so
  // proxies and clients with read timeouts keep the connection. 0 = never.
  std::chrono::milliseconds sse_keepalive{10000};
  std::string api_key;                        // non-empty: every /v1 route needs "Authorization: Bearer <key>"
  std::vector<std::string> allowed_origins;   // CORS: exact origins, or "*"; empty = no CORS headers at all
  bool log_requests = true;                   // one access-log line per request
  std::function<void(const std::string&)> log;  // where log lines go (default: stderr)
};

struct HttpCounters {
  std::atomic<uint64_t> requests_2xx{0}, requests_4xx{0}, requests_5xx{0};
  std::atomic<uint64_t> connections_accepted{0}, connections_rejected{0};
  std::atomic<int64_t> connections_active{0};    // open regular connections (≤ max_connections)
  std::atomic<int64_t> connections_reserve{0};   // open connections over the cap (health checks / 429s)
  std::atomic<int64_t> connections_closing{0};   // of those, answered and half-closed, waiting for the client
  std::atomic<uint64_t> client_disconnects{0};   // generations aborted because the client went away
  std::atomic<uint64_t> shutdown_aborts{0};      // generations ended by shutdown after the grace period
  std::atomic<uint64_t> streams_started{0};
  std::atomic<int64_t> jobs_active{0};           // generation requests not yet answered in full
  std::atomic<int64_t> body_bytes_buffered{0};   // reserved against max_buffered_body_bytes
  std::atomic<uint64_t> body_budget_refusals{0};
};

// What the server needs from a live connection at shutdown (implemented by the connection, on its strand).
class HttpConnection {
 public:
  virtual ~HttpConnection() = default;
  virtual void drain() = 0;    // shutdown began: close if idle; answer what is in flight, then close
  virtual void end_now() = 0;  // grace period over: end the in-flight generation as aborted, then close
};

class HttpServer {
 public:
  HttpServer(HttpServerConfig cfg, const OpenAIService& service, GenerationBackend& backend);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (throws m3::Error when the address is unusable) and starts the io threads.
  void start();
  // Graceful shutdown: stop accepting (the listening socket closes), close idle connections, answer any new
  // request on an open connection with 503, and let in-flight generations finish for up to `grace`. Then the
  // rest are ended as aborted — a stream gets its finish_reason "abort" chunks, "data: [DONE]" and the last
  // chunk, a non-streaming request a 503 JSON error — and their engine requests are aborted. Waits (≤ 3 s) for
  // those last bytes to be written, then stop(). Returns true when nothing had to be aborted.
  bool shutdown(std::chrono::milliseconds grace);
  // Stops the io threads at once. The backend must drop its sinks (they hold connections) before this object is
  // destroyed: stop the engine first.
  void stop();
  // Blocks until SIGINT or SIGTERM; returns the signal number.
  int wait_for_signal();

  uint16_t port() const { return bound_port_; }
  const HttpServerConfig& config() const { return cfg_; }
  const OpenAIService& service() const { return service_; }
  GenerationBackend& backend() const { return backend_; }
  HttpCounters& counters() { return counters_; }
  bool draining() const { return draining_.load(); }
  // /metrics body: the engine's metrics plus the HTTP counters.
  std::string metrics_text() const;
  // Writes one log line (config().log, else stderr).
  void log(const std::string& line) const;
  // Connections register themselves so shutdown() can reach them.
  void add_connection(const std::shared_ptr<HttpConnection>& c);
  // Runs `fn` on the prepare pool (started by start(), joined by stop()).
  void run_off_io(std::function<void()> fn);

  struct Impl;

 private:
  std::vector<std::shared_ptr<HttpConnection>> live_connections();

  HttpServerConfig cfg_;
  const OpenAIService& service_;
  GenerationBackend& backend_;
  HttpCounters counters_;
  std::unique_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  uint16_t bound_port_ = 0;
  std::atomic<bool> draining_{false};
  std::mutex conns_mu_;
  std::vector<std::weak_ptr<HttpConnection>> conns_;
};

}  // namespace m3::server
