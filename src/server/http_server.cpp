#include "server/http_server.h"

#include <csignal>
#include <cstdio>
#include <future>
#include <optional>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include "base/error.h"
#include "server/crash_handler.h"
#include "server/http_session.h"

namespace m3::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct HttpServer::Impl {
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::thread_pool> prepare;  // blocking request preparation (run_off_io)
};

namespace {

void do_accept(HttpServer& srv, HttpServer::Impl& impl) {
  impl.acceptor->async_accept(net::make_strand(impl.ioc), [&srv, &impl](boost::system::error_code ec,
                                                                         tcp::socket socket) {
    if (ec == net::error::operation_aborted || !impl.acceptor->is_open()) return;
    if (!ec) {
      auto& c = srv.counters();
      c.connections_accepted.fetch_add(1);
      bool reserve = false;
      if (c.connections_active.load() < srv.config().max_connections) {
        c.connections_active.fetch_add(1);
      } else if (c.connections_reserve.load() < srv.config().reserved_connections) {
        c.connections_reserve.fetch_add(1);
        reserve = true;
      } else {
        // Every regular and reserve slot is taken: refuse without reading anything.
        c.connections_rejected.fetch_add(1);
        boost::system::error_code ignored;
        socket.close(ignored);
        return do_accept(srv, impl);
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      start_http_session(std::move(socket), srv, reserve);
    }
    do_accept(srv, impl);
  });
}

// Polls `done` every few ms until it holds or `limit` passes.
template <typename Pred>
bool wait_for(Pred done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

HttpServer::HttpServer(HttpServerConfig cfg, const OpenAIService& service, GenerationBackend& backend)
    : cfg_(std::move(cfg)), service_(service), backend_(backend), impl_(std::make_unique<Impl>()) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  boost::system::error_code ec;
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
  impl_->prepare.emplace(size_t(std::max(1, cfg_.prepare_threads)));
  do_accept(*this, *impl_);
  for (int i = 0; i < std::max(1, cfg_.io_threads); ++i) threads_.emplace_back([this] {
      use_crash_stack_on_this_thread();
      impl_->ioc.run();
    });
}

void HttpServer::add_connection(const std::shared_ptr<HttpConnection>& c) {
  std::lock_guard<std::mutex> l(conns_mu_);
  if (conns_.size() >= 64 && conns_.size() % 64 == 0)
    std::erase_if(conns_, [](const std::weak_ptr<HttpConnection>& w) { return w.expired(); });
  conns_.push_back(c);
}

std::vector<std::shared_ptr<HttpConnection>> HttpServer::live_connections() {
  std::lock_guard<std::mutex> l(conns_mu_);
  std::vector<std::shared_ptr<HttpConnection>> out;
  std::erase_if(conns_, [](const std::weak_ptr<HttpConnection>& w) { return w.expired(); });
  for (const auto& w : conns_)
    if (auto c = w.lock()) out.push_back(std::move(c));
  return out;
}

bool HttpServer::shutdown(std::chrono::milliseconds grace) {
  if (threads_.empty()) return true;
  draining_ = true;
  // The acceptor belongs to the io threads: close it there, and wait so that no connection is accepted after
  // this returns (new clients get "connection refused" from the kernel).
  std::promise<void> closed;
  net::post(impl_->ioc, [this, &closed] {
    boost::system::error_code ec;
    if (impl_->acceptor) impl_->acceptor->close(ec);
    closed.set_value();
  });
  closed.get_future().wait();
  for (const auto& c : live_connections()) c->drain();
  const bool clean = wait_for([this] { return counters_.jobs_active.load() == 0; }, grace);
  for (const auto& c : live_connections()) c->end_now();
  // Every answer written: connections are closed or half-closed (the client has our FIN and every byte).
  wait_for(
      [this] {
        return counters_.connections_active.load() + counters_.connections_reserve.load() -
                   counters_.connections_closing.load() ==
               0;
      },
      std::chrono::seconds(3));
  stop();
  return clean;
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  net::post(impl_->ioc, [this] {
    boost::system::error_code ec;
    if (impl_->acceptor) impl_->acceptor->close(ec);
  });
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // A preparation still running finishes (bounded by the media fetch deadline); its answer is dropped.
  if (impl_->prepare) {
    impl_->prepare->join();
    impl_->prepare.reset();
  }
}

void HttpServer::run_off_io(std::function<void()> fn) {
  M3_CHECK(impl_->prepare.has_value(), "HttpServer::run_off_io before start()");
  net::post(*impl_->prepare, std::move(fn));
}

int HttpServer::wait_for_signal() {
  net::io_context sig_ioc;
  net::signal_set signals(sig_ioc, SIGINT, SIGTERM);
  int got = 0;
  signals.async_wait([&got](boost::system::error_code, int sig) { got = sig; });
  sig_ioc.run();
  return got;
}

void HttpServer::log(const std::string& line) const {
  if (cfg_.log) return cfg_.log(line);
  std::fprintf(stderr, "%s\n", line.c_str());
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
  out += service_.timings().to_prometheus(lbl);
  one("http_connections_active", "gauge", "Open HTTP connections.", double(c.connections_active.load()));
  one("http_connections_reserve", "gauge", "Open connections over --max-connections (health checks only).",
      double(c.connections_reserve.load()));
  one("http_connections_accepted_total", "counter", "Accepted TCP connections.",
      double(c.connections_accepted.load()));
  one("http_connections_rejected_total", "counter",
      "Connections refused (429, or closed when the health-check reserve is full too).",
      double(c.connections_rejected.load()));
  one("http_client_disconnects_total", "counter", "Generations aborted because the client went away.",
      double(c.client_disconnects.load()));
  one("http_shutdown_aborts_total", "counter", "Generations aborted because shutdown's grace period ran out.",
      double(c.shutdown_aborts.load()));
  one("http_streams_total", "counter", "Streaming (SSE) responses started.", double(c.streams_started.load()));
  one("http_body_bytes_buffered", "gauge", "Request body bytes held against --max-buffered-body-bytes.",
      double(c.body_bytes_buffered.load()));
  one("http_body_budget_refusals_total", "counter", "Requests refused with 503 over --max-buffered-body-bytes.",
      double(c.body_budget_refusals.load()));
  return out;
}

}  // namespace m3::server
