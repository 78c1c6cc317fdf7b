#include "server/request_timings.h"

#include <iterator>

#include <fmt/format.h>

namespace m3::server {

namespace {

// 50 µs … 10 s: tokenising a short chat is tens of µs, a 1M-token prompt seconds.
Histogram fine_latency() {
  Histogram h;
  h.bounds = {5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

}  // namespace

const char* request_stage_name(RequestStage s) {
  static const char* const kNames[] = {"body_receive",       "dispatch",          "parse",        "template",
                                       "media_collect",      "media_queue",       "media_load",   "media_hash",
                                       "media_process",      "media_process_user", "media_process_sys",
                                       "media_expand",       "tokenize",          "submit"};
  static_assert(std::size(kNames) == size_t(RequestStage::kCount));
  const int i = int(s);
  return i >= 0 && i < int(RequestStage::kCount) ? kNames[i] : "unknown";
}

RequestTimings::RequestTimings()
    : preprocess_(fine_latency()),
      detokenize_(fine_latency()),
      media_gateway_(fine_latency()),
      media_encode_(fine_latency()) {
  for (auto& h : stages_) h = fine_latency();
}

void RequestTimings::observe_stage(RequestStage stage, double s) {
  const int i = int(stage);
  if (i < 0 || i >= int(RequestStage::kCount)) return;
  std::lock_guard<std::mutex> lk(mu_);
  stages_[i].observe(s);
}

void RequestTimings::observe_preprocess(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  preprocess_.observe(s);
}

void RequestTimings::observe_detokenize(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  detokenize_.observe(s);
}

void RequestTimings::observe_media(double gateway_s, double encode_s, int64_t items, int64_t encoded) {
  observe_media_gateway(gateway_s, items);
  observe_media_encode(encode_s, encoded);
}

void RequestTimings::observe_media_gateway(double gateway_s, int64_t items) {
  std::lock_guard<std::mutex> lk(mu_);
  media_gateway_.observe(gateway_s);
  media_items_ += items;
}

void RequestTimings::observe_media_encode(double encode_s, int64_t encoded) {
  std::lock_guard<std::mutex> lk(mu_);
  media_encode_.observe(encode_s);
  media_items_encoded_ += encoded;
}

std::string RequestTimings::to_prometheus(const std::string& lbl) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  auto hist = [&](const char* name, const char* help, const Histogram& h) { h.append_prometheus(out, name, help, lbl); };
  hist("request_preprocess_seconds", "Per request: parse, validation, chat template and tokenisation.", preprocess_);
  hist("request_detokenize_seconds",
       "Per request: incremental detokenisation, stop matching and output parsing, summed over its events.",
       detokenize_);
  hist("request_media_gateway_seconds",
       "Per request with images or video: the media gateway (fetch, decode, resize, patchify, templating), part of "
       "preprocess.",
       media_gateway_);
  hist("request_media_encode_seconds",
       "Per vision-encoder call (one per request with images or video not in the prefix cache): its wall time.",
       media_encode_);
  // One family, one series per stage: the header once, then each stage's lines (append_prometheus's own header cut).
  const char* kStage = "request_stage_seconds";
  out += fmt::format(
      "# HELP m3serve:{} Per request, the stages of its path before the engine (body_receive, dispatch, parse, "
      "template, media_*, tokenize, submit; media_queue/load/hash/process summed over its images and videos).\n"
      "# TYPE m3serve:{} histogram\n",
      kStage, kStage);
  for (int i = 0; i < int(RequestStage::kCount); ++i) {
    std::string one;
    const std::string labels = fmt::format("{},stage=\"{}\"", lbl, request_stage_name(RequestStage(i)));
    stages_[i].append_prometheus(one, kStage, "", labels);
    const size_t body = one.find('\n', one.find('\n') + 1) + 1;  // past "# HELP …" and "# TYPE …"
    out.append(one, body, std::string::npos);
  }
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} counter\nm3serve:{}{{{}}} {}\n", name, help, name, name,
                       lbl, v);
  };
  counter("media_items_total", "Images and videos in requests.", media_items_);
  counter("media_items_encoded_total",
          "Images and videos the vision encoder ran on; the others' features came from the feature cache "
          "(--media-feature-cache-memory) or were not needed (media_items_skipped_total).",
          media_items_encoded_);
  return out;
}

}  // namespace m3::server
