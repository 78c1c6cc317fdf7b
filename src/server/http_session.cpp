#include "server/http_session.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "server/anthropic_job.h"
#include "server/anthropic_request.h"
#include "server/http_framing.h"
#include "server/http_policy.h"

namespace m3::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using std::chrono::milliseconds;

namespace {

// While a generation runs, bytes the client pipelines after its request are kept for the next request up to this
// much; past it the connection stops reading and watches the TCP state instead (see probe_tcp_state).
constexpr size_t kMaxPipelinedBytes = kMaxHeaderBytes;
constexpr milliseconds kReserveHeaderTimeout{2000};
constexpr milliseconds kTcpProbePeriod{200};
// Bodies of known length from this size on are read in socket reads of up to kLargeBodyReadBytes (read_large_body).
constexpr uint64_t kLargeBodyBytes = 256 * 1024;
constexpr size_t kLargeBodyReadBytes = 1024 * 1024;

std::string target_path(beast::string_view target) {
  std::string t(target);
  size_t q = t.find('?');
  if (q != std::string::npos) t.resize(q);
  while (t.size() > 1 && t.back() == '/') t.pop_back();
  return t;
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool is_v1_route(const std::string& path) { return path == "/v1" || path.rfind("/v1/", 0) == 0; }

// Routes of the Anthropic Messages API: their errors use Anthropic's body shape.
bool is_anthropic_route(const std::string& path) { return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0; }

// One in-flight generation of a connection.
struct JobCtx {
  std::unique_ptr<GenerationJob> job;
  bool cancelled = false;  // client went away, shutdown or submission failed: ignore further outputs
  bool complete = false;   // every choice finished and the last bytes were queued
  bool counted = true;     // still counted in HttpCounters::jobs_active
};

class Session : public HttpConnection, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer& srv, bool reserve)
      : stream_(std::move(socket)), srv_(srv), cfg_(srv.config()), reserve_(reserve),
        keepalive_(stream_.get_executor()), probe_(stream_.get_executor()) {
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    peer_ = ec ? "-" : fmt::format("{}:{}", ep.address().to_string(), ep.port());
    chunk_cb_ = [this](uint64_t size, beast::string_view, beast::error_code& e) {
      if (!reserve_body(size)) {
        budget_refused_ = true;
        e = net::error::no_buffer_space;
      }
    };
  }

  ~Session() override {
    release_body();
    if (!closed_) {
      uncount();
      if (closing_) srv_.counters().connections_closing.fetch_sub(1);
    }
  }

  void run() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::do_read, shared_from_this()));
  }

  void drain() override { net::post(stream_.get_executor(), [self = shared_from_this()] { self->on_drain(); }); }
  void end_now() override { net::post(stream_.get_executor(), [self = shared_from_this()] { self->on_end_now(); }); }

 private:
  // ---- reading requests -----------------------------------------------------------------------------------
  void do_read() {
    if (closed_ || closing_) return;
    release_body();
    if (srv_.draining() && buf_.size() == 0 && !bytes_waiting()) return close();
    if (monitoring_) {  // the disconnect monitor's read is still pending: cancel it; its handler resumes here
      want_read_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    parser_.emplace();
    configure_request_parser(*parser_, cfg_.max_body_bytes);
    parser_->on_chunk_header(chunk_cb_);
    budget_refused_ = false;
    rec_ = AccessRecord{};
    rec_.peer = peer_;
    logged_ = false;
    anthropic_ = false;
    if (buf_.size() == 0) {
      // Nothing of the next request yet: wait for its first byte (a fresh connection gets the header deadline, a
      // kept-alive one the idle deadline), then give the whole header the header deadline.
      waiting_idle_ = true;
      stream_.expires_after(first_request_ ? header_timeout() : cfg_.idle_timeout);
      stream_.async_read_some(buf_.prepare(4096), beast::bind_front_handler(&Session::on_first_bytes,
                                                                          shared_from_this()));
      return;
    }
    read_header();
  }

  milliseconds header_timeout() const { return reserve_ ? std::min(cfg_.header_timeout, kReserveHeaderTimeout)
                                                        : cfg_.header_timeout; }

  void on_first_bytes(beast::error_code ec, size_t n) {
    waiting_idle_ = false;
    // Cancelled by on_drain: close, unless a request started arriving meanwhile (it is read and answered 503).
    // A read that completed before the cancel goes on the same way.
    if (ec == net::error::operation_aborted && !closed_ && bytes_waiting()) return do_read();
    if (ec || closed_) return close();
    buf_.commit(n);
    read_header();
  }

  void read_header() {
    stream_.expires_after(header_timeout());
    http::async_read_header(stream_, buf_, *parser_, beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  // Headers are in: check the framing, the connection's role and the body budget before any body byte is read;
  // answer "Expect: 100-continue" (curl sends it for bodies over 1 KB and would otherwise wait a second), then
  // read the body. A Content-Length over the limit already failed in the header read.
  void on_header(beast::error_code ec, size_t n) {
    if (closed_) return;
    // Errors on the Anthropic routes use Anthropic's body, also those of the header read (e.g. 413).
    anthropic_ = is_anthropic_route(target_path(parser_->get().target()));
    if (ec) return on_read(ec, n);
    first_request_ = false;
    t0_ = std::chrono::steady_clock::now();
    const auto& h = parser_->get();
    rec_.method = std::string(h.method_string());
    rec_.target = std::string(h.target());
    rec_.version = h.version();
    rec_.request_id = std::string(h["X-Request-Id"]);
    request_id_header_ = rec_.request_id;
    if (auto e = check_request_head(h.base())) return send_error(*e, false);
    if (reserve_) {
      const std::string path = target_path(h.target());
      const bool probe = (path == "/health" || path == "/metrics") &&
                         (h.method() == http::verb::get || h.method() == http::verb::head);
      if (!probe) {
        srv_.counters().connections_rejected.fetch_add(1);
        return send_error(ApiError(429,
                                   fmt::format("Too many concurrent connections (limit {}); retry shortly",
                                               cfg_.max_connections),
                                   "", "too_many_connections"),
                          false, true);
      }
    }
    if (auto len = parser_->content_length(); len && *len > 0 && !reserve_body(*len)) return refuse_budget();
    auto read_body = [self = shared_from_this()] {
      self->stream_.expires_after(self->cfg_.body_timeout);
      if (self->parser_->content_length_remaining().value_or(0) >= kLargeBodyBytes) return self->read_large_body();
      http::async_read(self->stream_, self->buf_, *self->parser_, beast::bind_front_handler(&Session::on_read, self));
    };
    if (beast::iequals(h[http::field::expect], "100-continue") && !parser_->is_done()) {
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

  // A body of known length >= kLargeBodyBytes: socket reads of up to kLargeBodyReadBytes (never past the body, so a
  // pipelined request stays in the socket), each fed to the same parser. Beast's own read op caps every socket read
  // at 64 KiB: a 16 MB chat body of image data: URLs took ~256 reads, each a round through epoll, the timer and the
  // strand (~60 ms on the dev VM against ~6 ms for the bytes themselves). Ends in on_read like http::async_read.
  void read_large_body() {
    if (buf_.size() > 0) {  // what the header read already holds
      beast::error_code ec;
      const size_t used = parser_->put(buf_.data(), ec);
      buf_.consume(used);
      if (ec == http::error::need_more) ec = {};
      if (ec || parser_->is_done()) return finish_large_body(ec);
    }
    const uint64_t left = parser_->content_length_remaining().value_or(0);
    if (left == 0) return finish_large_body({});  // unreachable: a parser with no body left is done
    const size_t n = size_t(std::min<uint64_t>(left, kLargeBodyReadBytes));
    stream_.async_read_some(buf_.prepare(n), [self = shared_from_this()](beast::error_code ec, size_t got) {
      if (self->closed_) return;
      self->buf_.commit(got);
      if (ec == net::error::eof) {
        // As Beast's read: the body ended early (put_eof reports partial_message), or nothing came at all.
        if (!self->parser_->got_some()) return self->finish_large_body(http::error::end_of_stream);
        ec = {};
        self->parser_->put_eof(ec);
        return self->finish_large_body(ec);
      }
      if (ec) return self->finish_large_body(ec);
      self->read_large_body();
    });
  }

  void finish_large_body(beast::error_code ec) {
    if (buf_.capacity() > kLargeBodyBytes) buf_.shrink_to_fit();  // a kept-alive connection keeps little
    on_read(ec, 0);
  }

  void on_read(beast::error_code ec, size_t) {
    if (closed_) return;
    if (budget_refused_) return refuse_budget();
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    if (ec == http::error::body_limit)
      return send_error(ApiError(413,
                                 fmt::format("Request body is larger than the limit of {} bytes (--max-body-bytes)",
                                             cfg_.max_body_bytes),
                                 "", "payload_too_large"),
                        false);
    if (ec == http::error::header_limit) return send_error(ApiError(431, "Request headers are too large"), false);
    if (ec) return send_error(ApiError(400, "Malformed HTTP request: " + ec.message()), false);

    t_body_ = std::chrono::steady_clock::now();
    req_ = parser_->release();
    keep_alive_ = req_.keep_alive();
    route();
    // The body was parsed (a generation keeps only its token ids): free it and its budget share now.
    req_.body().clear();
    req_.body().shrink_to_fit();
    release_body();
  }

  void refuse_budget() {
    srv_.counters().body_budget_refusals.fetch_add(1);
    send_error(ApiError(503,
                        "The server is receiving too many request bodies at once (--max-buffered-body-bytes); "
                        "retry shortly",
                        "", "server_busy"),
               false, true);
  }

  bool reserve_body(uint64_t n) {
    auto& b = srv_.counters().body_bytes_buffered;
    const int64_t after = b.fetch_add(int64_t(n)) + int64_t(n);
    if (after > int64_t(cfg_.max_buffered_body_bytes)) {
      b.fetch_sub(int64_t(n));
      return false;
    }
    reserved_ += n;
    return true;
  }

  void release_body() {
    if (reserved_ == 0) return;
    srv_.counters().body_bytes_buffered.fetch_sub(int64_t(reserved_));
    reserved_ = 0;
  }

  void route() {
    const std::string path = target_path(req_.target());
    const auto method = req_.method();
    cors_origin_.clear();
    if (auto o = req_[http::field::origin]; origin_allowed(cfg_.allowed_origins, o)) cors_origin_ = std::string(o);
    auto need = [&](http::verb v) {
      if (method == v) return true;
      send_error(ApiError(405, fmt::format("Method {} is not allowed on {}", std::string(req_.method_string()), path)),
                 keep_alive_);
      return false;
    };
    try {
      if (method == http::verb::options && !cors_origin_.empty()) return send(204, "", "text/plain", keep_alive_);
      if (srv_.draining())
        return send_error(ApiError(503, "The server is shutting down", "", "shutting_down"), false, true);
      if (is_v1_route(path) && !api_key_accepted(req_[http::field::authorization], req_["x-api-key"], cfg_.api_key))
        return send_error(invalid_api_key_error(), keep_alive_);
      if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (!need(http::verb::post)) return;
        const ApiKind kind = path == "/v1/chat/completions" ? ApiKind::Chat : ApiKind::Completion;
        auto& timings = srv_.service().timings();
        timings.observe_stage(RequestStage::kBodyReceive, seconds_between(t0_, t_body_));
        if (srv_.service().prepare_may_block(kind, req_.body())) return prepare_off_io(kind);
        timings.observe_stage(RequestStage::kDispatch, seconds_between(t_body_, std::chrono::steady_clock::now()));
        auto job = std::make_unique<Job>(srv_.service(), srv_.service().prepare(kind, req_.body()));
        t_prepared_ = std::chrono::steady_clock::now();
        return start_job(std::move(job));
      }
      if (path == "/v1/messages") {
        if (!need(http::verb::post)) return;
        return start_job(make_anthropic_job(srv_.service(), req_.body()));
      }
      if (path == "/v1/messages/count_tokens") {
        if (!need(http::verb::post)) return;
        return send(200, anthropic_count_tokens_body(srv_.service(), req_.body()), "application/json", keep_alive_);
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

  unsigned reply_version() const { return rec_.version == 10 ? 10 : 11; }

  // Headers every response carries (also the hand-written streaming head).
  std::string common_headers() const {
    std::string h = "Server: m3serve\r\n";
    if (!request_id_header_.empty() && request_id_header_.find_first_of("\r\n") == std::string::npos)
      h += "X-Request-Id: " + request_id_header_ + "\r\n";
    if (!cors_origin_.empty()) {
      h += "Access-Control-Allow-Origin: " + cors_origin_ + "\r\nVary: Origin\r\n";
      if (rec_.method == "OPTIONS")
        h += "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
             "Access-Control-Allow-Headers: Authorization, Content-Type, X-Request-Id, X-Api-Key, "
             "Anthropic-Version, Anthropic-Beta\r\n"
             "Access-Control-Max-Age: 600\r\n";
    }
    return h;
  }

  void send_error(const ApiError& e, bool keep_alive, bool retry_after = false) {
    send(e.status, anthropic_ ? anthropic_error_body(e) : error_body(e), "application/json", keep_alive,
         retry_after || e.status == 429 || e.status == 503);
  }

  void send(int status, std::string body, const char* content_type, bool keep_alive, bool retry_after = false) {
    keep_alive = keep_alive && !srv_.draining();
    count_status(status);
    log_done(status);
    std::string head = fmt::format("HTTP/{}.{} {} {}\r\n", reply_version() / 10, reply_version() % 10, status,
                                   std::string(http::obsolete_reason(http::int_to_status(unsigned(status)))));
    head += common_headers();
    if (status != 204) head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", content_type, body.size());
    if (retry_after) head += "Retry-After: 1\r\n";
    head += keep_alive ? (reply_version() == 10 ? "Connection: keep-alive\r\n\r\n" : "\r\n") : "Connection: close\r\n\r\n";
    auto bytes = std::make_shared<std::string>(std::move(head));
    if (rec_.method != "HEAD") *bytes += body;
    sending_ = true;
    stream_.expires_after(std::chrono::seconds(30));
    net::async_write(stream_, net::buffer(*bytes), [self = shared_from_this(), bytes, keep_alive](beast::error_code ec,
                                                                                                  size_t) {
      self->sending_ = false;
      if (ec) return self->close();
      if (!keep_alive) return self->graceful_close();
      self->do_read();
    });
  }

  void log_done(int status) {
    if (logged_) return;
    logged_ = true;
    if (!cfg_.log_requests) return;
    rec_.status = status;
    rec_.latency_ms = t0_ == std::chrono::steady_clock::time_point{}
                          ? 0.0
                          : std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    srv_.log(access_log_line(rec_));
  }

  // ---- preparation off the io thread ------------------------------------------------------------------------
  // A request whose preparation may block (media fetch / decode, OpenAIService::prepare_may_block) is prepared on
  // the server's prepare pool; the job (or the error) comes back to this connection's strand. Meanwhile nothing is
  // read from the connection; shutdown answers it 503 and the late result is dropped.
  void prepare_off_io(ApiKind kind) {
    preparing_ = true;
    // The body moves (a data: URL request is megabytes; on_read frees what is left of req_ after route()).
    auto body = std::make_shared<std::string>(std::move(req_.body()));
    srv_.run_off_io([self = shared_from_this(), kind, body, t_body = t_body_] {
      auto job = std::make_shared<std::unique_ptr<GenerationJob>>();
      auto err = std::make_shared<std::optional<ApiError>>();
      const auto& svc = self->srv_.service();
      svc.timings().observe_stage(RequestStage::kDispatch, seconds_between(t_body, std::chrono::steady_clock::now()));
      try {
        *job = std::make_unique<Job>(svc, svc.prepare(kind, *body));
      } catch (const ApiError& e) {
        *err = e;
      } catch (const std::exception& e) {
        *err = ApiError(500, std::string("Internal error: ") + e.what());
      }
      net::post(self->stream_.get_executor(), [self, job, err, t_prepared = std::chrono::steady_clock::now()] {
        if (!self->preparing_ || self->closed_) return;
        self->preparing_ = false;
        if (*err) return self->send_error(**err, self->keep_alive_);
        self->t_prepared_ = t_prepared;
        self->start_job(std::move(*job));
      });
    });
  }

  // ---- generations ----------------------------------------------------------------------------------------
  // `job` was prepared from the request body (preparing throws ApiError → 4xx before anything is submitted).
  void start_job(std::unique_ptr<GenerationJob> job) {
    auto ctx = std::make_shared<JobCtx>();
    ctx->job = std::move(job);
    srv_.counters().jobs_active.fetch_add(1);
    job_ = ctx;
    if (rec_.request_id.empty()) rec_.request_id = ctx->job->id();
    const auto& ereqs = ctx->job->engine_requests();
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
      end_job(ctx, "");
      job_.reset();
      for (size_t i = 0; i < submitted; ++i) srv_.backend().abort(ereqs[i].id);
      throw ApiError(400, e.what());
    }
    if (t_prepared_ != std::chrono::steady_clock::time_point{}) {  // chat / completions (prepared by the service)
      srv_.service().timings().observe_stage(RequestStage::kSubmit,
                                             seconds_between(t_prepared_, std::chrono::steady_clock::now()));
      t_prepared_ = {};
    }
    stream_.expires_never();
    if (ctx->job->streaming()) {
      srv_.counters().streams_started.fetch_add(1);
      count_status(200);
      // HTTP/1.0 has no chunked encoding: the stream's end is the connection's end.
      chunked_ = reply_version() == 11;
      if (!chunked_) keep_alive_ = false;
      std::string head = fmt::format("HTTP/{}.{} 200 OK\r\n", reply_version() / 10, reply_version() % 10);
      head += common_headers();
      head += "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
      if (chunked_) head += "Transfer-Encoding: chunked\r\n";
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      out_ += head;
      queue_chunk(ctx->job->stream_prologue());
      flush();
      arm_keepalive(ctx);
    }
    start_monitor();
  }

  // The job is answered (or given up): it no longer counts as in flight; streams log here, since their status
  // line went out long ago.
  void end_job(const std::shared_ptr<JobCtx>& ctx, const std::string& outcome) {
    if (!ctx->counted) return;
    ctx->counted = false;
    srv_.counters().jobs_active.fetch_sub(1);
    auto [in, out] = ctx->job->token_usage();
    rec_.prompt_tokens = in;
    rec_.completion_tokens = out;
    rec_.outcome = outcome;
    if (ctx->job->streaming())
      log_done(200);
    else if (outcome == "client_disconnect")
      log_done(499);  // nginx's "client closed request"
  }

  // SSE comment when the stream has been silent for sse_keepalive (clients ignore lines starting with ':').
  void arm_keepalive(const std::shared_ptr<JobCtx>& ctx) {
    const auto period = cfg_.sse_keepalive;
    if (period.count() <= 0) return;
    keepalive_.expires_after(period);
    keepalive_.async_wait([self = shared_from_this(), ctx](beast::error_code ec) {
      if (ec || ctx->cancelled || ctx->complete || self->closed_ || self->job_ != ctx) return;
      if (std::chrono::steady_clock::now() - self->last_data_ >= self->cfg_.sse_keepalive) {
        self->queue_chunk(": keep-alive\n\n");
        self->flush();
      }
      self->arm_keepalive(ctx);
    });
  }

  void on_engine_output(const std::shared_ptr<JobCtx>& ctx, int choice, const EngineOutput& out) {
    if (ctx->cancelled || ctx->complete) return;
    GenerationJob::Update up = ctx->job->on_output(choice, out);
    for (const auto& id : up.abort_ids) srv_.backend().abort(id);
    if (ctx->job->streaming()) {
      queue_chunk(up.bytes);
      if (ctx->job->done()) {
        ctx->complete = true;
        if (chunked_) out_ += "0\r\n\r\n";  // last chunk
        end_job(ctx, ending_outcome_);
      }
      flush();
    } else if (ctx->job->done()) {
      ctx->complete = true;
      auto [status, body] = ctx->job->final_response();
      end_job(ctx, ending_outcome_);
      job_.reset();
      send(status, std::move(body), "application/json", keep_alive_);
    }
  }

  void queue_chunk(const std::string& data) {
    if (data.empty()) return;
    last_data_ = std::chrono::steady_clock::now();
    if (!chunked_) {
      out_ += data;
      return;
    }
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
      if (!keep_alive_ || srv_.draining()) return graceful_close();
      do_read();
    }
  }

  // While a generation runs, a pending read notices the client closing the connection (EOF / reset). Bytes it
  // reads are a pipelined next request: they stay in buf_ for the next header read, and reading goes on.
  void start_monitor() {
    if (monitoring_ || closed_ || closing_) return;
    if (buf_.size() >= kMaxPipelinedBytes) return probe_tcp_state();
    monitoring_ = true;
    stream_.async_read_some(buf_.prepare(std::min<size_t>(16384, kMaxPipelinedBytes + 1 - buf_.size())),
                            beast::bind_front_handler(&Session::on_monitor, shared_from_this()));
  }

  void on_monitor(beast::error_code ec, size_t n) {
    monitoring_ = false;
    if (closing_ || closed_) return close();
    if (ec == net::error::operation_aborted && want_read_) {  // cancelled by do_read: the generation is over
      want_read_ = false;
      return do_read();
    }
    if (ec) {
      if (job_ && !job_->complete) return client_gone();
      return close();
    }
    buf_.commit(n);
    if (job_ && !job_->complete) return start_monitor();
    if (want_read_) {
      want_read_ = false;
      do_read();
    }
  }

  // The client pipelined more than we buffer, so no read is pending: watch the kernel's TCP state instead. A FIN
  // (CLOSE_WAIT) or a reset (CLOSE) means the client is gone.
  void probe_tcp_state() {
    probe_.expires_after(kTcpProbePeriod);
    probe_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->job_ || self->job_->complete) return;
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (getsockopt(self->stream_.socket().native_handle(), IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
          (info.tcpi_state == TCP_CLOSE_WAIT || info.tcpi_state == TCP_CLOSE))
        return self->client_gone();
      self->probe_tcp_state();
    });
  }

  void client_gone() {
    if (job_ && !job_->complete && !job_->cancelled) {
      job_->cancelled = true;
      srv_.counters().client_disconnects.fetch_add(1);
      for (const auto& id : job_->job->unfinished_ids()) srv_.backend().abort(id);
      end_job(job_, "client_disconnect");
    }
    job_.reset();
    close();
  }

  // ---- shutdown -------------------------------------------------------------------------------------------
  // An idle connection (waiting for a request's first byte) is closed — by cancelling its read, not by closing
  // the socket here: that read may already have completed with the start of a request, which then goes on and
  // is answered 503. Connections busy with a request finish it and close (send() drops keep-alive).
  void on_drain() {
    if (closed_ || !waiting_idle_) return;
    beast::error_code ec;
    stream_.socket().cancel(ec);
  }

  // Bytes already in the kernel's buffer are a request on its way: while draining it is read and answered (503)
  // rather than cut off.
  bool bytes_waiting() {
    beast::error_code ec;
    return stream_.socket().available(ec) > 0;
  }

  void on_end_now() {
    if (closed_) return;
    if (preparing_) {
      preparing_ = false;
      return send_error(ApiError(503, "The server shut down before this request was prepared", "", "shutting_down"),
                        false, true);
    }
    if (job_ && !job_->complete && !job_->cancelled) {
      auto ctx = job_;
      srv_.counters().shutdown_aborts.fetch_add(1);
      for (const auto& id : ctx->job->unfinished_ids()) srv_.backend().abort(id);
      ending_outcome_ = "shutdown_abort";
      if (ctx->job->streaming()) {
        // End every unfinished choice as the engine would on abort: finish chunks, [DONE], last chunk.
        EngineOutput aborted;
        aborted.finish = FinishReason::Abort;
        for (int i = 0; i < ctx->job->num_choices() && !ctx->complete; ++i) on_engine_output(ctx, i, aborted);
        return;
      }
      ctx->cancelled = true;
      end_job(ctx, ending_outcome_);
      job_.reset();
      return send_error(ApiError(503, "The server shut down before this request finished; it was aborted", "",
                                 "shutting_down"),
                        false, true);
    }
    if (!job_ && !writing_ && !sending_) close();
  }

  // ---- closing --------------------------------------------------------------------------------------------
  void uncount() {
    (reserve_ ? srv_.counters().connections_reserve : srv_.counters().connections_active).fetch_sub(1);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    release_body();
    uncount();
    if (closing_) srv_.counters().connections_closing.fetch_sub(1);
    keepalive_.cancel();
    probe_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  // Half-close and drain what the client still sends (e.g. the rest of an oversized body) so the kernel does not
  // answer it with a reset before the client read our response.
  void graceful_close() {
    if (closed_ || closing_) return;
    release_body();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    closing_ = true;
    srv_.counters().connections_closing.fetch_add(1);
    if (!monitoring_) drain_input();  // else the pending monitor read completes and closes
  }

  void drain_input() {
    stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain_input();
    });
  }

  beast::tcp_stream stream_;
  HttpServer& srv_;
  const HttpServerConfig& cfg_;
  bool reserve_;
  std::string peer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::function<void(uint64_t, beast::string_view, beast::error_code&)> chunk_cb_;  // the parser keeps a reference
  http::request<http::string_body> req_;
  bool keep_alive_ = true;
  bool anthropic_ = false;  // the request is on an Anthropic route: errors in Anthropic's shape
  bool chunked_ = true;
  bool first_request_ = true;
  bool budget_refused_ = false;
  uint64_t reserved_ = 0;  // bytes of max_buffered_body_bytes this connection holds
  std::string request_id_header_, cors_origin_;
  AccessRecord rec_;
  bool logged_ = false;
  std::chrono::steady_clock::time_point t0_{};
  // request_stage_seconds: the body fully read (body_receive ends, dispatch starts); the service's preparation done
  // (submit starts; reset once observed, so only chat / completion jobs count).
  std::chrono::steady_clock::time_point t_body_{}, t_prepared_{};
  std::shared_ptr<JobCtx> job_;
  std::string ending_outcome_;
  std::string out_, inflight_;
  bool writing_ = false;
  bool sending_ = false;
  bool preparing_ = false;  // prepare_off_io in flight
  bool monitoring_ = false;
  bool want_read_ = false;
  bool waiting_idle_ = false;
  bool closed_ = false;
  bool closing_ = false;
  net::steady_timer keepalive_;
  net::steady_timer probe_;
  std::chrono::steady_clock::time_point last_data_{};
  char drain_buf_[4096];
};

}  // namespace

void start_http_session(tcp::socket&& socket, HttpServer& srv, bool reserve) {
  auto s = std::make_shared<Session>(std::move(socket), srv, reserve);
  srv.add_connection(s);
  s->run();
}

}  // namespace m3::server
