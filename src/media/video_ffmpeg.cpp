// decode_video (video.h) with FFmpeg's libraries, from memory. Built when libavformat / libavcodec / libswscale /
// libavutil are present (src/media/CMakeLists.txt); otherwise video_unavailable.cpp stands in.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>
}

#include "media/media_error.h"
#include "media/video.h"

namespace m3::media {

namespace {

struct MemIn {
  std::span<const uint8_t> b;
  int64_t pos = 0;
};
int mem_read(void* opaque, uint8_t* buf, int n) {
  auto* m = static_cast<MemIn*>(opaque);
  int64_t k = std::min<int64_t>(n, int64_t(m->b.size()) - m->pos);
  if (k <= 0) return AVERROR_EOF;
  std::memcpy(buf, m->b.data() + m->pos, size_t(k));
  m->pos += k;
  return int(k);
}
int64_t mem_seek(void* opaque, int64_t off, int whence) {
  auto* m = static_cast<MemIn*>(opaque);
  if (whence == AVSEEK_SIZE) return int64_t(m->b.size());
  int64_t p = (whence & 3) == SEEK_SET ? off : (whence & 3) == SEEK_CUR ? m->pos + off : int64_t(m->b.size()) + off;
  if (p < 0 || p > int64_t(m->b.size())) return -1;
  m->pos = p;
  return p;
}

std::string av_err(int e) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(e, buf, sizeof(buf));
  return buf;
}

}  // namespace

VideoFrames decode_video(std::span<const uint8_t> bytes, const VideoLimits& lim) {
  if (bytes.empty()) media_fail("video data is empty");
  if (!(lim.fps >= 0.2 && lim.fps <= 5.0)) media_fail("video fps {} is outside 0.2 … 5.0", lim.fps);
  // FFmpeg logs demuxer complaints about hostile files to stderr; the MediaError message is what the client sees.
  static const bool quiet = [] {
    av_log_set_level(AV_LOG_QUIET);
    return true;
  }();
  (void)quiet;
  MemIn in{bytes, 0};
  const int kBuf = 1 << 16;
  auto* iobuf = static_cast<uint8_t*>(av_malloc(kBuf));
  AVIOContext* avio = avio_alloc_context(iobuf, kBuf, 0, &in, mem_read, nullptr, mem_seek);
  AVFormatContext* fmt = avformat_alloc_context();
  AVCodecContext* dec = nullptr;
  SwsContext* sws = nullptr;
  AVPacket* pkt = av_packet_alloc();
  AVFrame* fr = av_frame_alloc();
  auto cleanup = [&] {
    sws_freeContext(sws);
    av_frame_free(&fr);
    av_packet_free(&pkt);
    avcodec_free_context(&dec);
    if (fmt) avformat_close_input(&fmt);
    if (avio) {
      av_freep(&avio->buffer);
      avio_context_free(&avio);
    }
  };
  struct Guard {
    decltype(cleanup)& f;
    ~Guard() { f(); }
  } guard{cleanup};
  if (!avio || !fmt || !pkt || !fr) media_fail("video decoder could not start");
  fmt->pb = avio;
  fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  int e = avformat_open_input(&fmt, nullptr, nullptr, nullptr);
  if (e < 0) {
    fmt = nullptr;  // freed by avformat_open_input on failure
    media_fail("video container not recognised: {}", av_err(e));
  }
  if ((e = avformat_find_stream_info(fmt, nullptr)) < 0) media_fail("video stream info unreadable: {}", av_err(e));
  const AVCodec* codec = nullptr;
  int si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  if (si < 0 || !codec) media_fail("no decodable video stream in the file");
  AVStream* st = fmt->streams[si];
  dec = avcodec_alloc_context3(codec);
  if (!dec || avcodec_parameters_to_context(dec, st->codecpar) < 0) media_fail("video decoder setup failed");
  dec->thread_count = 1;  // the gateway parallelises across requests
  if ((e = avcodec_open2(dec, codec, nullptr)) < 0) media_fail("video decoder failed to open: {}", av_err(e));
  VideoFrames out;
  AVRational r = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
  out.src_fps = r.num > 0 && r.den > 0 ? av_q2d(r) : 0.0;
  const double tb = av_q2d(st->time_base);
  const double step = 1.0 / lim.fps;
  int64_t n_decoded = 0;
  double first_ts = NAN, last_kept = 0.0;
  bool done = false;
  auto take = [&](AVFrame* f) {
    int64_t idx = n_decoded++;
    if (n_decoded > lim.max_decoded_frames) media_fail("video has more than {} frames", lim.max_decoded_frames);
    double ts = f->best_effort_timestamp != AV_NOPTS_VALUE ? double(f->best_effort_timestamp) * tb
                : out.src_fps > 0                          ? double(idx) / out.src_fps
                                                           : double(idx);
    if (std::isnan(first_ts)) first_ts = ts;
    if (ts - first_ts > lim.max_seconds || int(out.frames.size()) >= lim.max_frames) {
      done = true;
      return;
    }
    if (!out.frames.empty() && ts < last_kept + step - 1e-4) return;
    if (f->width <= 0 || f->height <= 0 || int64_t(f->width) * f->height > lim.max_pixels_per_frame)
      media_fail("video frame {}x{} exceeds the limit of {} pixels", f->width, f->height, lim.max_pixels_per_frame);
    if (!out.frames.empty() && (f->width != out.frames[0].w || f->height != out.frames[0].h))
      media_fail("video frame size changes mid-stream");
    sws = sws_getCachedContext(sws, f->width, f->height, AVPixelFormat(f->format), f->width, f->height,
                               AV_PIX_FMT_RGB24, SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr,
                               nullptr, nullptr);
    if (!sws) media_fail("video pixel format {} cannot be converted", f->format);
    RgbImage img(f->width, f->height);
    uint8_t* dst[4] = {img.data.data(), nullptr, nullptr, nullptr};
    int dst_stride[4] = {f->width * 3, 0, 0, 0};
    sws_scale(sws, f->data, f->linesize, 0, f->height, dst, dst_stride);
    out.frames.push_back(std::move(img));
    out.indices.push_back(idx);
    last_kept = ts;
  };
  auto drain = [&] {
    while (!done) {
      int r2 = avcodec_receive_frame(dec, fr);
      if (r2 == AVERROR(EAGAIN) || r2 == AVERROR_EOF) break;
      if (r2 < 0) media_fail("video frame decode failed: {}", av_err(r2));
      take(fr);
      av_frame_unref(fr);
    }
  };
  while (!done && av_read_frame(fmt, pkt) >= 0) {
    if (pkt->stream_index == si) {
      e = avcodec_send_packet(dec, pkt);
      av_packet_unref(pkt);
      if (e < 0 && e != AVERROR(EAGAIN)) media_fail("video packet decode failed: {}", av_err(e));
      drain();
    } else {
      av_packet_unref(pkt);
    }
  }
  if (!done) {
    avcodec_send_packet(dec, nullptr);
    drain();
  }
  if (out.frames.empty()) media_fail("video has no decodable frames");
  return out;
}

}  // namespace m3::media
