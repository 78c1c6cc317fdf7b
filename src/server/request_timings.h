// CPU time the HTTP side spends per request around the engine, for /metrics (issue 9: "CPU-side work per request
// under 2 % of TTFT"):
//   m3serve:request_preprocess_seconds   OpenAIService::prepare — parse + validate + chat template + tokenise
//   m3serve:request_detokenize_seconds   per request, the sum over its events of ChoiceStream::on_output —
//                                        incremental detokenisation + stop matching + output parsing
//   m3serve:request_media_gateway_seconds  requests with images/video: the media gateway's wall time (fetch, decode,
//                                        resize, patchify, templating on its pool), part of preprocess
//   m3serve:request_media_encode_seconds   per vision-encoder call: its wall time — part of preprocess where the
//                                        media hook encodes up front; where the engine asks for the features
//                                        (EngineRequest::media_encoder) one call per request with uncached items,
//                                        made while the request waits in the engine (inside its TTFT)
//   m3serve:media_items_total / media_items_encoded_total   images and videos requested / run through the vision
//                                        encoder (the others came from the feature cache, media/feature_cache.h, or
//                                        were never asked for: the engine's media_items_skipped_total)
//   m3serve:request_stage_seconds{stage=…}  a chat / completion request's path stage by stage (RequestStage below),
//                                        so a TTFT can be taken apart: body receive → dispatch → parse → template →
//                                        media (collect, per-item queue / load / hash / process, expand) →
//                                        tokenise → submit; the engine's own part (with the vision encoder where
//                                        the engine asks for the features) is time_to_first_token_seconds
//                                        (arrival in the engine → first token)
// Thread-safe (one mutex; an observation is a few ns of work under it).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "engine/metrics.h"

namespace m3::server {

// Stages of a request's path before the engine (request_stage_seconds{stage="<name>"}). The media_* stages are
// per request with images / video; media_queue / load / hash / process are summed over the request's items (they
// run in parallel on the gateway's pool, so their sum can exceed the gateway's wall time).
enum class RequestStage : int {
  kBodyReceive,   // "body_receive": headers parsed → whole body in memory (the io thread)
  kDispatch,      // "dispatch": body in memory → preparation starts (inline, or on the prepare pool)
  kParse,         // "parse": JSON + validation (parse_chat_request / parse_completion_request)
  kTemplate,      // "template": the chat template (media parts as bare anchors)
  kMediaCollect,  // "media_collect": the media parts' URLs gathered from the messages (request thread)
  kMediaQueue,    // "media_queue": Σ items, posted to the gateway → a pool thread takes it
  kMediaLoad,     // "media_load": Σ items, encoded bytes (base64 decode / file / fetch)
  kMediaHash,     // "media_hash": Σ items, content hash
  kMediaProcess,  // "media_process": Σ items, decode + resize + normalise + patchify
  kMediaProcessUser,  // "media_process_user": Σ items, the pool threads' user CPU time in media_process
  kMediaProcessSys,   // "media_process_sys": Σ items, their system CPU time (page faults on new pixel buffers)
  kMediaExpand,   // "media_expand": placeholders expanded after the last item
  kTokenize,      // "tokenize": the prompt's token ids (+ media spans)
  kSubmit,        // "submit": preparation done → every choice submitted to the engine
  kCount
};
const char* request_stage_name(RequestStage s);

class RequestTimings {
 public:
  RequestTimings();
  void observe_preprocess(double seconds);
  void observe_detokenize(double seconds);
  // items: the request's images and videos; encoded: those the vision encoder ran on (the rest were cached).
  void observe_media(double gateway_seconds, double encode_seconds, int64_t items = 0, int64_t encoded = 0);
  // The two halves on their own: the gateway at preparation, each encoder call when it is made.
  void observe_media_gateway(double gateway_seconds, int64_t items);
  void observe_media_encode(double encode_seconds, int64_t encoded);
  void observe_stage(RequestStage stage, double seconds);
  // Prometheus histograms with the given label set (e.g. model_name="m3").
  std::string to_prometheus(const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  Histogram preprocess_, detokenize_, media_gateway_, media_encode_;
  Histogram stages_[int(RequestStage::kCount)];
  int64_t media_items_ = 0, media_items_encoded_ = 0;
};

}  // namespace m3::server
