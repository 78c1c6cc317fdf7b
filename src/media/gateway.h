// The multimodal preprocessing gateway (issue 12 item 3): a thread pool separate from the engine thread that turns
// a rendered prompt with bare media anchors plus the request's media items into the expanded prompt and pixel
// tensors (fetch → decode → resize → patchify → template), with an LRU cache of processed items keyed by content
// hash. The HTTP handler calls prepare() and awaits the future off the engine thread, so the GPU worker never waits
// on preprocessing. See docs/MEDIA.md.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/byte_lru.h"
#include "media/decode.h"
#include "media/image.h"
#include "media/source.h"
#include "media/video.h"

namespace m3::media {

struct MediaItem {
  bool video = false;
  std::string url;     // data:, file path / file://, or http(s)
  double fps = 1.0;    // video sampling rate
  // Borrowed instead of `url` when set (collect_media_items: a request's data: URLs are megabytes each, and copying
  // them on the request thread cost ~6 ms per 8 × 1080p request on the dev VM); it must outlive the gateway's work.
  const std::string* url_ref = nullptr;
  const std::string& source() const { return url_ref ? *url_ref : url; }
};

// Media parts of chat messages, in prompt order. Accepts OpenAI parts {type:image_url, image_url:{url}} /
// {type:video_url, video_url:{url}} and the template's normalised parts {type:image|video, image|video|url: …}.
// Throws MediaError for a malformed media part; text parts are skipped. The items borrow the URL strings
// (MediaItem::url_ref): `messages` must stay alive and unchanged until the gateway is done with them.
std::vector<MediaItem> collect_media_items(const nlohmann::ordered_json& messages);

struct PreparedItem {
  bool video = false;
  uint64_t content_hash = 0;           // xxh64 of the encoded bytes (+ fps for video): the prefix-cache key
  PixelTensor pixels;                  // [rows, 1176] + grid_thw
  std::vector<std::string> timestamps; // video: per temporal group
  int64_t bytes() const { return int64_t(pixels.values.size() * sizeof(float)) + 256; }
};

// Where one request's gateway time went, in seconds (the item stages summed over its items), for /metrics
// (server::RequestTimings' request_stage_seconds).
struct GatewayTimings {
  double collect = 0;  // collect_media_items on the caller's thread (prepare_chat_media)
  double queue = 0;    // Σ items: posted → a pool thread starts it
  double load = 0;     // Σ items: the encoded bytes (data: URL base64 decode, local file read, http(s) fetch)
  double hash = 0;     // Σ items: the content hash
  double process = 0;  // Σ items: decode + resize + normalise + patchify (0 for a cache hit)
  // Σ items: the pool thread's user and system CPU time in `process` (getrusage RUSAGE_THREAD): process − user − sys
  // is time without a core (contention); sys is mostly page faults on the new pixel buffers.
  double process_user = 0, process_sys = 0;
  double expand = 0;   // after the last item: limits and placeholder expansion
};

struct PreparedMedia {
  std::string prompt;                                   // anchors expanded
  std::vector<std::shared_ptr<const PreparedItem>> items;  // prompt order
  int64_t media_tokens = 0;                             // slot tokens over all items
  GatewayTimings timings;
};

struct GatewayOptions {
  int threads = 2;
  int64_t cache_bytes = 1LL << 30;
  int max_images = 16, max_videos = 2;
  int64_t max_media_tokens = 32768;
  // Pixels the model sees per request, over all items after resizing (an image's h·w, a video's h·w per frame ×
  // frames); 0 = no limit beyond max_media_tokens.
  int64_t max_pixels = 0;
  SourcePolicy source;
  DecodeLimits decode;
  VideoLimits video;
};

class MediaGateway {
 public:
  explicit MediaGateway(GatewayOptions opt);
  ~MediaGateway();
  MediaGateway(const MediaGateway&) = delete;
  MediaGateway& operator=(const MediaGateway&) = delete;

  // Never blocks on preprocessing: items run on the pool in parallel; the future holds the result or MediaError.
  // `collect_seconds` is passed through to PreparedMedia::timings.collect.
  std::future<PreparedMedia> prepare(std::string prompt, std::vector<MediaItem> items, double collect_seconds = 0);
  PreparedMedia prepare_sync(std::string prompt, std::vector<MediaItem> items) {
    return prepare(std::move(prompt), std::move(items)).get();
  }

  struct Stats { int64_t hits = 0, misses = 0, cached_items = 0, cached_bytes = 0; };
  Stats stats() const;
  const GatewayOptions& options() const { return opt_; }

  // One item, synchronously on the caller's thread (also what the pool runs); uses the cache. `timings` (optional)
  // receives this item's load, hash and process seconds.
  std::shared_ptr<const PreparedItem> prepare_item(const MediaItem& item, GatewayTimings* timings = nullptr);

 private:
  void post(std::function<void()> fn);
  void worker();

  GatewayOptions opt_;
  std::vector<std::thread> threads_;
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;

  ByteLru<PreparedItem> cache_;  // processed items by content hash
};

// The request-path entry point: the validated chat messages (OpenAI image_url/video_url parts, or the template's
// normalised image/video parts) and the prompt the chat template rendered from them (one bare anchor per item).
// Returns at once; the future yields the expanded prompt and the pixel tensors, or throws MediaError (→ HTTP 400).
// The items borrow the messages' URL strings: keep `messages` alive and unchanged until the future is ready.
inline std::future<PreparedMedia> prepare_chat_media(MediaGateway& gw, const nlohmann::ordered_json& messages,
                                                     std::string rendered_prompt) {
  std::vector<MediaItem> items;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    items = collect_media_items(messages);
  } catch (...) {
    std::promise<PreparedMedia> p;
    p.set_exception(std::current_exception());
    return p.get_future();
  }
  const double collect = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return gw.prepare(std::move(rendered_prompt), std::move(items), collect);
}

// The server's hook (server::ServiceConfig::prepare_media): messages + rendered prompt → expanded prompt, or a
// MediaError (→ 400 invalid_media). Blocks on the gateway's pool; the server calls it off its io threads.
inline std::function<std::string(const nlohmann::ordered_json&, std::string)> make_prepare_hook(
    std::shared_ptr<MediaGateway> gw) {
  return [gw = std::move(gw)](const nlohmann::ordered_json& messages, std::string prompt) {
    return prepare_chat_media(*gw, messages, std::move(prompt)).get().prompt;
  };
}

}  // namespace m3::media
