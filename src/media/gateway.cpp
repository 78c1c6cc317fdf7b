#include "media/gateway.h"

#include <sys/resource.h>

#include <atomic>
#include <cstring>

#include <xxhash.h>

#include "media/media_error.h"
#include "media/prompt.h"

namespace m3::media {

namespace {
const nlohmann::ordered_json* find_url(const nlohmann::ordered_json& part, const char* key) {
  auto it = part.find(key);
  if (it == part.end()) return nullptr;
  if (it->is_string()) return &*it;
  if (it->is_object()) {
    auto u = it->find("url");
    if (u != it->end() && u->is_string()) return &*u;
  }
  return nullptr;
}
struct ThreadCpu {
  double user = 0, sys = 0;
};
ThreadCpu thread_cpu() {
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) != 0) return {};
  auto sec = [](const timeval& v) { return double(v.tv_sec) + 1e-6 * double(v.tv_usec); };
  return {sec(u.ru_utime), sec(u.ru_stime)};
}
}  // namespace

std::vector<MediaItem> collect_media_items(const nlohmann::ordered_json& messages) {
  std::vector<MediaItem> out;
  if (!messages.is_array()) return out;
  for (size_t m = 0; m < messages.size(); ++m) {
    const auto& msg = messages[m];
    if (!msg.is_object()) continue;
    auto c = msg.find("content");
    if (c == msg.end() || !c->is_array()) continue;
    for (size_t i = 0; i < c->size(); ++i) {
      const auto& part = (*c)[i];
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) continue;
      const std::string type = part["type"].get<std::string>();
      const bool is_img = type == "image_url" || type == "image";
      const bool is_vid = type == "video_url" || type == "video";
      if (!is_img && !is_vid) continue;
      const nlohmann::ordered_json* url = nullptr;
      for (const char* k : {is_img ? "image_url" : "video_url", is_img ? "image" : "video", "url"})
        if (!url) url = find_url(part, k);
      if (!url) media_fail("messages[{}].content[{}]: {} part has no url", m, i, type);
      MediaItem it;
      it.video = is_vid;
      it.url_ref = &url->get_ref<const std::string&>();
      if (is_vid) {
        for (const auto* holder : {&part, part.contains("video_url") ? &part["video_url"] : nullptr}) {
          if (holder && holder->is_object() && holder->contains("fps")) {
            const auto& f = (*holder)["fps"];
            if (!f.is_number() || !(f.get<double>() >= 0.2 && f.get<double>() <= 5.0))
              media_fail("messages[{}].content[{}]: video fps must be a number in 0.2 … 5.0", m, i);
            it.fps = f.get<double>();
          }
        }
      }
      out.push_back(std::move(it));
    }
  }
  return out;
}

MediaGateway::MediaGateway(GatewayOptions opt)
    : opt_(std::move(opt)), cache_(opt_.cache_bytes, [](const PreparedItem& p) { return p.bytes(); }) {
  const int n = std::max(1, opt_.threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { worker(); });
}

MediaGateway::~MediaGateway() {
  {
    std::lock_guard<std::mutex> lk(qmu_);
    stop_ = true;
  }
  qcv_.notify_all();
  for (auto& t : threads_) t.join();
}

void MediaGateway::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(qmu_);
    queue_.push_back(std::move(fn));
  }
  qcv_.notify_one();
}

void MediaGateway::worker() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

MediaGateway::Stats MediaGateway::stats() const {
  const auto s = cache_.stats();
  return {s.hits, s.misses, s.items, s.bytes};
}

std::shared_ptr<const PreparedItem> MediaGateway::prepare_item(const MediaItem& item, GatewayTimings* timings) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  auto t = Clock::now();
  std::vector<uint8_t> bytes = load_media_bytes(item.source(), opt_.source);
  if (int64_t(bytes.size()) > opt_.source.max_bytes)
    media_fail("media item exceeds the size limit of {} bytes", opt_.source.max_bytes);
  if (timings) timings->load += since(t), t = Clock::now();
  uint64_t key = XXH64(bytes.data(), bytes.size(), item.video ? 0x76696465 : 0x696d6167);
  if (item.video) key = XXH64(&item.fps, sizeof(item.fps), key);
  if (timings) timings->hash += since(t), t = Clock::now();
  if (auto hit = cache_.get(key)) return hit;
  const ThreadCpu cpu0 = timings ? thread_cpu() : ThreadCpu{};
  auto p = std::make_shared<PreparedItem>();
  p->video = item.video;
  p->content_hash = key;
  if (item.video) {
    VideoLimits vl = opt_.video;
    vl.fps = item.fps;
    VideoFrames v = decode_video(bytes, vl);
    p->pixels = preprocess_video(v.frames);
    p->timestamps = video_timestamps(v);
  } else {
    p->pixels = preprocess_encoded_image(bytes, opt_.decode);
  }
  if (timings) {
    timings->process += since(t);
    const ThreadCpu cpu1 = thread_cpu();
    timings->process_user += cpu1.user - cpu0.user, timings->process_sys += cpu1.sys - cpu0.sys;
  }
  cache_.put(key, p);
  return p;
}

std::future<PreparedMedia> MediaGateway::prepare(std::string prompt, std::vector<MediaItem> items,
                                                 double collect_seconds) {
  using Clock = std::chrono::steady_clock;
  struct Job {
    std::string prompt;
    std::vector<MediaItem> items;
    std::vector<std::shared_ptr<const PreparedItem>> done;
    std::vector<GatewayTimings> timings;  // per item (each written by its own pool thread)
    double collect = 0;
    std::atomic<int> left{0};
    std::mutex mu;
    std::exception_ptr err;
    std::promise<PreparedMedia> promise;
  };
  auto job = std::make_shared<Job>();
  job->prompt = std::move(prompt);
  job->items = std::move(items);
  job->collect = collect_seconds;
  auto fut = job->promise.get_future();
  int ni = 0, nv = 0;
  for (const auto& it : job->items) (it.video ? nv : ni)++;
  try {
    if (ni > opt_.max_images) media_fail("request has {} images; the limit is {}", ni, opt_.max_images);
    if (nv > opt_.max_videos) media_fail("request has {} videos; the limit is {}", nv, opt_.max_videos);
  } catch (...) {
    job->promise.set_exception(std::current_exception());
    return fut;
  }
  auto finish = [this](const std::shared_ptr<Job>& j) {
    try {
      if (j->err) std::rethrow_exception(j->err);
      const auto t0 = Clock::now();
      PreparedMedia out;
      out.timings.collect = j->collect;
      for (const GatewayTimings& t : j->timings) {
        out.timings.queue += t.queue, out.timings.load += t.load, out.timings.hash += t.hash;
        out.timings.process += t.process, out.timings.process_user += t.process_user;
        out.timings.process_sys += t.process_sys;
      }
      std::vector<ItemExpansion> ex;
      int64_t pixels = 0;
      for (const auto& p : j->done) {
        ItemExpansion e;
        e.video = p->video;
        e.groups = p->pixels.t;
        e.slots_per_group = p->video ? int64_t(p->pixels.gh) * p->pixels.gw / 4 : p->pixels.tokens();
        e.timestamps = p->timestamps;
        out.media_tokens += p->pixels.tokens();
        pixels += int64_t(p->pixels.gh) * p->pixels.gw * 196 * (p->video ? 2 * int64_t(p->pixels.t) : 1);
        ex.push_back(std::move(e));
      }
      if (opt_.max_pixels > 0 && pixels > opt_.max_pixels)
        media_fail("request media have {} pixels after resizing; the limit is {}", pixels, opt_.max_pixels);
      if (out.media_tokens > opt_.max_media_tokens)
        media_fail("request media need {} tokens; the limit is {}", out.media_tokens, opt_.max_media_tokens);
      out.prompt = expand_placeholders(j->prompt, ex);
      out.items = j->done;
      out.timings.expand = std::chrono::duration<double>(Clock::now() - t0).count();
      j->promise.set_value(std::move(out));
    } catch (...) {
      j->promise.set_exception(std::current_exception());
    }
  };
  const int n = int(job->items.size());
  if (n == 0) {
    finish(job);
    return fut;
  }
  job->done.resize(n);
  job->timings.resize(n);
  job->left = n;
  for (int i = 0; i < n; ++i) {
    post([this, job, i, finish, posted = Clock::now()] {
      GatewayTimings& t = job->timings[i];
      t.queue = std::chrono::duration<double>(Clock::now() - posted).count();
      try {
        job->done[i] = prepare_item(job->items[i], &t);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(job->mu);
        if (!job->err)
          job->err = std::make_exception_ptr(
              MediaError(fmt::format("{} {}: {}", job->items[i].video ? "video" : "image", i, e.what())));
      }
      if (job->left.fetch_sub(1) == 1) finish(job);
    });
  }
  return fut;
}

}  // namespace m3::media
