// One HTTP connection (http_session.cpp): reading requests under deadlines and budgets, routing, plain replies,
// SSE streams, disconnect detection and the connection's part of shutdown. Internal to src/server.
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include "server/http_server.h"

namespace m3::server {

// Serves an accepted socket until it closes. `reserve`: the connection is over --max-connections and may only
// ask GET /health or GET /metrics (anything else gets 429); the caller counted it in connections_reserve,
// otherwise in connections_active.
void start_http_session(boost::asio::ip::tcp::socket&& socket, HttpServer& srv, bool reserve);

}  // namespace m3::server
