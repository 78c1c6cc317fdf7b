// CPU time the HTTP side spends per request around the engine, for /metrics (issue 9: "CPU-side work per request
// under 2 % of TTFT"):
//   m3serve:request_preprocess_seconds   OpenAIService::prepare — parse + validate + chat template + tokenise
//   m3serve:request_detokenize_seconds   per request, the sum over its events of ChoiceStream::on_output —
//                                        incremental detokenisation + stop matching + output parsing
//   m3serve:request_media_gateway_seconds  requests with images/video: the media gateway's wall time (fetch, decode,
//                                        resize, patchify, templating on its pool), part of preprocess
//   m3serve:request_media_encode_seconds   the same requests: the vision encoder's wall time, part of preprocess
//   m3serve:media_items_total / media_items_encoded_total   images and videos requested / run through the vision
//                                        encoder (the others came from the feature cache, media/feature_cache.h)
// Thread-safe (one mutex; an observation is a few ns of work under it).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "engine/metrics.h"

namespace m3::server {

class RequestTimings {
 public:
  RequestTimings();
  void observe_preprocess(double seconds);
  void observe_detokenize(double seconds);
  // items: the request's images and videos; encoded: those the vision encoder ran on (the rest were cached).
  void observe_media(double gateway_seconds, double encode_seconds, int64_t items = 0, int64_t encoded = 0);
  // Prometheus histograms with the given label set (e.g. model_name="m3").
  std::string to_prometheus(const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  Histogram preprocess_, detokenize_, media_gateway_, media_encode_;
  int64_t media_items_ = 0, media_items_encoded_ = 0;
};

}  // namespace m3::server
