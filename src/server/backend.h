// The engine as the HTTP side sees it. m3serve serve wraps m3::Engine in this interface (src/app/cmd_serve.cpp);
// tests use a scripted fake, so the server is tested without a model.
#pragma once

#include <string>

#include "engine/metrics.h"
#include "engine/request.h"

namespace m3::server {

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Thread-safe. Throws m3::Error (→ HTTP 400) when the request can never run. The sink is called from the
  // engine thread for every output event; exactly one event is final (finish != None), also after abort().
  virtual void submit(EngineRequest req, OutputSink sink) = 0;
  // Thread-safe; unknown or finished ids are ignored.
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineMetrics metrics() const = 0;
};

}  // namespace m3::server
