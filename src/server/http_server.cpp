#include "server/http_server.h"

#include <csignal>
#include <deque>
#include <mutex>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "base/error.h"

namespace m3::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct HttpServer::Impl {
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
};

namespace {


std::string target_path(beast::string_view target) {
  std::string t(target);
  size_t q = t.find('?');
  if (q != std::string::npos) t.resize(q);
  while (t.size() > 1 && t.back() == '/') t.pop_back();
  return t;
}

// One in-flight generation of a connection.
struct JobCtx {
  std::unique_ptr<Job> job;
  bool cancelled = false;   // client went away or submission failed: ignore further outputs
  bool complete = false;    // every choice finished and the last bytes were queued
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer& srv, bool reject)
      : stream_(std::move(socket)), srv_(srv), reject_(reject), keepalive_(stream_.get_executor()) {}

  ~Session() {
    if (!reject_) srv_.counters().connections_active.fetch_sub(1);
  }

  void run() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::do_read, shared_from_this()));
  }

 private:
  // ---- reading requests -----------------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    if (monitoring_) {  // the disconnect monitor's read is still pending; it resumes reading when it completes
      want_read_ = true;
      stream_.expires_after(srv_.config().idle_timeout);
      return;
    }
    parser_.emplace();
    request_id_header_.clear();
    parser_->body_limit(srv_.config().max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(reject_ ? std::chrono::seconds(5) : srv_.config().idle_timeout);
    http::async_read_header(stream_, buf_, *parser_,
                            beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  // Headers are in: answer "Expect: 100-continue" (curl sends it for bodies over 1 KB and would otherwise wait a
  // second), then read the body. A Content-Length over the limit already failed here, before any body was sent.
  void on_header(beast::error_code ec, size_t n) {
    if (ec) return on_read(ec, n);
    auto read_body = [self = shared_from_this()] {
      http::async_read(self->stream_, self->buf_, *self->parser_,
                       beast::bind_front_handler(&Session::on_read, self));
    };
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue") && !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this(), read_body](beast::error_code e,
                                                                                                 size_t) {
        if (e) return self->close();
        read_body();
      });
      return;
    }
    if (parser_->is_done()) return on_read({}, 0);
    read_body();
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    if (ec == http::error::body_limit) {
      return send_error(ApiError(413,
                                 fmt::format("Request body is larger than the limit of {} bytes (--max-body-bytes)",
                                             srv_.config().max_body_bytes),
                                 "", "payload_too_large"),
                        false);
    }
    if (ec == http::error::header_limit) return send_error(ApiError(431, "Request headers are too large"), false);
    if (ec) return send_error(ApiError(400, "Malformed HTTP request: " + ec.message()), false);

    req_ = parser_->release();
    keep_alive_ = req_.keep_alive();
    request_id_header_ = std::string(req_["X-Request-Id"]);
    if (reject_) {
      srv_.counters().connections_rejected.fetch_add(1);
      ApiError e(429,
                 fmt::format("Too many concurrent connections (limit {}); retry shortly",
                             srv_.config().max_connections),
                 "", "too_many_connections");
      return send_error(e, false, true);
    }
    route();
  }

  void route() {
    const std::string path = target_path(req_.target());
    const auto method = req_.method();
    auto need = [&](http::verb v) {
      if (method == v) return true;
      send_error(ApiError(405, fmt::format("Method {} is not allowed on {}", std::string(req_.method_string()), path)),
                 keep_alive_);
      return false;
    };
    try {
      if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (!need(http::verb::post)) return;
        return start_job(path == "/v1/chat/completions" ? ApiKind::Chat : ApiKind::Completion);
      }
      if (path == "/health") {
        if (method != http::verb::get && method != http::verb::head && !need(http::verb::get)) return;
        return send(200, "", "application/json", keep_alive_);
      }
      if (path == "/v1/models") {
        if (!need(http::verb::get)) return;
        return send(200, srv_.service().models_body(), "application/json", keep_alive_);
      }
      if (path == "/metrics") {
        if (!need(http::verb::get)) return;
        return send(200, srv_.metrics_text(), "text/plain; version=0.0.4; charset=utf-8", keep_alive_);
      }
      if (path == "/tokenize") {
        if (!need(http::verb::post)) return;
        return send(200, srv_.service().tokenize_body(req_.body()), "application/json", keep_alive_);
      }
      if (path == "/detokenize") {
        if (!need(http::verb::post)) return;
        return send(200, srv_.service().detokenize_body(req_.body()), "application/json", keep_alive_);
      }
      send_error(ApiError(404, fmt::format("No route for {} {}", std::string(req_.method_string()), path), "",
                          "not_found"),
                 keep_alive_);
    } catch (const ApiError& e) {
      send_error(e, keep_alive_);
    } catch (const std::exception& e) {
      send_error(ApiError(500, std::string("Internal error: ") + e.what()), keep_alive_);
    }
  }

  // ---- plain responses ------------------------------------------------------------------------------------
  void count_status(int status) {
    auto& c = srv_.counters();
    (status < 400 ? c.requests_2xx : status < 500 ? c.requests_4xx : c.requests_5xx).fetch_add(1);
  }

  void send_error(const ApiError& e, bool keep_alive, bool retry_after = false) {
    send(e.status, error_body(e), "application/json", keep_alive, retry_after || e.status == 429 || e.status == 503);
  }

  void send(int status, std::string body, const char* content_type, bool keep_alive, bool retry_after = false) {
    count_status(status);
    auto res = std::make_shared<http::response<http::string_body>>(http::int_to_status(unsigned(status)),
                                                                   req_.version() ? req_.version() : 11);
    res->set(http::field::server, "m3serve");
    res->set(http::field::content_type, content_type);
    if (!request_id_header_.empty()) res->set("X-Request-Id", request_id_header_);
    if (retry_after) res->set(http::field::retry_after, "1");
    res->keep_alive(keep_alive);
    res->body() = std::move(body);
    res->prepare_payload();
    stream_.expires_after(std::chrono::seconds(30));
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
      if (ec) return self->close();
      if (!keep_alive) return self->graceful_close();
      self->do_read();
    });
  }

  // ---- generations ----------------------------------------------------------------------------------------
  void start_job(ApiKind kind) {
    PreparedJob prep = srv_.service().prepare(kind, req_.body());  // throws ApiError → 4xx
    auto ctx = std::make_shared<JobCtx>();
    ctx->job = std::make_unique<Job>(srv_.service(), std::move(prep));
    job_ = ctx;
    const auto& ereqs = ctx->job->prepared().engine_requests;
    size_t submitted = 0;
    try {
      for (; submitted < ereqs.size(); ++submitted) {
        auto self = shared_from_this();
        const int choice = int(submitted);
        srv_.backend().submit(ereqs[submitted], [self, ctx, choice](const EngineOutput& out) {
          // Engine thread: copy the event onto this connection's strand.
          net::post(self->stream_.get_executor(),
                    [self, ctx, choice, out]() { self->on_engine_output(ctx, choice, out); });
        });
      }
    } catch (const std::exception& e) {
      ctx->cancelled = true;
      job_.reset();
      for (size_t i = 0; i < submitted; ++i) srv_.backend().abort(ereqs[i].id);
      throw ApiError(400, e.what());
    }
    stream_.expires_never();
    if (ctx->job->streaming()) {
      srv_.counters().streams_started.fetch_add(1);
      count_status(200);
      std::string head = "HTTP/1.1 200 OK\r\nServer: m3serve\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
      if (!request_id_header_.empty()) head += "X-Request-Id: " + request_id_header_ + "\r\n";
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      out_ += head;
      queue_chunk(ctx->job->stream_prologue());
      flush();
      arm_keepalive(ctx);
    }
    start_monitor();
  }

  // SSE comment when the stream has been silent for sse_keepalive (clients ignore lines starting with ':').
  void arm_keepalive(const std::shared_ptr<JobCtx>& ctx) {
    const auto period = srv_.config().sse_keepalive;
    if (period.count() <= 0) return;
    keepalive_.expires_after(period);
    keepalive_.async_wait([self = shared_from_this(), ctx](beast::error_code ec) {
      if (ec || ctx->cancelled || ctx->complete || self->closed_ || self->job_ != ctx) return;
      if (std::chrono::steady_clock::now() - self->last_data_ >= self->srv_.config().sse_keepalive) {
        self->queue_chunk(": keep-alive\n\n");
        self->flush();
      }
      self->arm_keepalive(ctx);
    });
  }

  void on_engine_output(const std::shared_ptr<JobCtx>& ctx, int choice, const EngineOutput& out) {
    if (ctx->cancelled || ctx->complete) return;
    Job::Update up = ctx->job->on_output(choice, out);
    for (const auto& id : up.abort_ids) srv_.backend().abort(id);
    if (ctx->job->streaming()) {
      queue_chunk(up.bytes);
      if (ctx->job->done()) {
        ctx->complete = true;
        out_ += "0\r\n\r\n";  // last chunk
      }
      flush();
    } else if (ctx->job->done()) {
      ctx->complete = true;
      auto [status, body] = ctx->job->final_response();
      job_.reset();
      send(status, std::move(body), "application/json", keep_alive_);
    }
  }

  void queue_chunk(const std::string& data) {
    if (data.empty()) return;
    last_data_ = std::chrono::steady_clock::now();
    out_ += fmt::format("{:x}\r\n", data.size());
    out_ += data;
    out_ += "\r\n";
  }

  void flush() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    inflight_.swap(out_);
    out_.clear();
    net::async_write(stream_, net::buffer(inflight_),
                     beast::bind_front_handler(&Session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, size_t) {
    writing_ = false;
    inflight_.clear();
    if (ec) return client_gone();
    if (!out_.empty()) return flush();
    if (job_ && job_->complete) {
      job_.reset();
      keepalive_.cancel();
      if (!keep_alive_) return graceful_close();
      do_read();
    }
  }

  // While a generation runs, a pending read notices the client closing the connection (EOF / reset).
  void start_monitor() {
    // Bytes of a pipelined request are already buffered: that client waits for our answer, not closing.
    if (monitoring_ || closed_ || buf_.size() > 0) return;
    monitoring_ = true;
    stream_.async_read_some(buf_.prepare(4096), beast::bind_front_handler(&Session::on_monitor, shared_from_this()));
  }

  void on_monitor(beast::error_code ec, size_t n) {
    monitoring_ = false;
    if (closing_) return close();
    if (ec) {
      if (job_) return client_gone();
      return close();
    }
    buf_.commit(n);  // a pipelined next request: keep its bytes for the next http::async_read
    if (want_read_) {
      want_read_ = false;
      do_read();
    }
  }

  void client_gone() {
    if (job_ && !job_->complete) {
      job_->cancelled = true;
      srv_.counters().client_disconnects.fetch_add(1);
      for (const auto& id : job_->job->unfinished_ids()) srv_.backend().abort(id);
    }
    job_.reset();
    close();
  }

  // ---- closing --------------------------------------------------------------------------------------------
  void close() {
    if (closed_) return;
    closed_ = true;
    keepalive_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  // Half-close and drain what the client still sends (e.g. the rest of an oversized body) so the kernel does not
  // answer it with a reset before the client read our response.
  void graceful_close() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    closing_ = true;
    if (!monitoring_) drain();  // else the pending monitor read completes and closes
  }

  void drain() {
    stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  beast::tcp_stream stream_;
  HttpServer& srv_;
  bool reject_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  bool keep_alive_ = true;
  std::string request_id_header_;
  std::shared_ptr<JobCtx> job_;
  std::string out_, inflight_;
  bool writing_ = false;
  bool monitoring_ = false;
  bool want_read_ = false;
  bool closed_ = false;
  bool closing_ = false;
  net::steady_timer keepalive_;
  std::chrono::steady_clock::time_point last_data_{};
  char drain_buf_[4096];
};

void do_accept(HttpServer& srv, HttpServer::Impl& impl) {
  impl.acceptor->async_accept(net::make_strand(impl.ioc), [&srv, &impl](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !impl.acceptor->is_open()) return;
    if (!ec) {
      auto& c = srv.counters();
      c.connections_accepted.fetch_add(1);
      bool reject = c.connections_active.load() >= srv.config().max_connections;
      if (!reject) c.connections_active.fetch_add(1);
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(socket), srv, reject)->run();
    }
    do_accept(srv, impl);
  });
}

}  // namespace

HttpServer::HttpServer(HttpServerConfig cfg, const OpenAIService& service, GenerationBackend& backend)
    : cfg_(std::move(cfg)), service_(service), backend_(backend), impl_(std::make_unique<Impl>()) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  beast::error_code ec;
  auto addr = net::ip::make_address(cfg_.host, ec);
  if (ec) {
    // Resolve names like "localhost".
    tcp::resolver resolver(impl_->ioc);
    auto results = resolver.resolve(cfg_.host, std::to_string(cfg_.port), ec);
    if (ec || results.empty()) m3::fail("cannot resolve --host '{}': {}", cfg_.host, ec.message());
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, cfg_.port);
  impl_->acceptor.emplace(impl_->ioc);
  impl_->acceptor->open(ep.protocol(), ec);
  if (!ec) impl_->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor->bind(ep, ec);
  if (!ec) impl_->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) m3::fail("cannot listen on {}:{}: {}", cfg_.host, cfg_.port, ec.message());
  bound_port_ = impl_->acceptor->local_endpoint().port();
  impl_->work.emplace(impl_->ioc.get_executor());
  do_accept(*this, *impl_);
  for (int i = 0; i < std::max(1, cfg_.io_threads); ++i) threads_.emplace_back([this] { impl_->ioc.run(); });
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    if (impl_->acceptor) impl_->acceptor->close(ec);
  });
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void HttpServer::wait_for_signal() {
  net::io_context sig_ioc;
  net::signal_set signals(sig_ioc, SIGINT, SIGTERM);
  signals.async_wait([](beast::error_code, int) {});
  sig_ioc.run();
}

std::string HttpServer::metrics_text() const {
  std::string out = backend_.metrics().to_prometheus(service_.config().limits.model_name);
  const std::string lbl = fmt::format("model_name=\"{}\"", service_.config().limits.model_name);
  auto& c = counters_;
  out += "# HELP m3serve:http_requests_total HTTP responses by status class.\n"
         "# TYPE m3serve:http_requests_total counter\n";
  out += fmt::format("m3serve:http_requests_total{{{},code=\"2xx\"}} {}\n", lbl, c.requests_2xx.load());
  out += fmt::format("m3serve:http_requests_total{{{},code=\"4xx\"}} {}\n", lbl, c.requests_4xx.load());
  out += fmt::format("m3serve:http_requests_total{{{},code=\"5xx\"}} {}\n", lbl, c.requests_5xx.load());
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} {}\nm3serve:{}{{{}}} {}\n", name, help, name, type,
                       name, lbl, v);
  };
  one("http_connections_active", "gauge", "Open HTTP connections.", double(c.connections_active.load()));
  one("http_connections_accepted_total", "counter", "Accepted TCP connections.",
      double(c.connections_accepted.load()));
  one("http_connections_rejected_total", "counter", "Connections refused with 429 (over --max-connections).",
      double(c.connections_rejected.load()));
  one("http_client_disconnects_total", "counter", "Generations aborted because the client went away.",
      double(c.client_disconnects.load()));
  one("http_streams_total", "counter", "Streaming (SSE) responses started.", double(c.streams_started.load()));
  return out;
}

}  // namespace m3::server
