// A small MPEG-4 Part 2 clip muxed as Matroska into memory with libavcodec (Debian's build has the native encoder):
// the video decoding tests and the e2e clip fixture (tests/e2e/make_clip.cpp) use it. Returns {} when the encoder
// is missing or a step fails.
#pragma once

#include <cstdint>
#include <vector>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}

namespace m3::media::test_clips {

// n frames of w x h at `fps`; frame k is a flat grey (16 + 8k + 37·seed) mod 220 with a white bar (x < 8), so two
// seeds give two clips of the same size and length but different content.
inline std::vector<uint8_t> make_clip(int n, int w, int h, int fps, int seed = 0) {
  const AVCodec* codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
  if (!codec) return {};
  AVFormatContext* oc = nullptr;
  if (avformat_alloc_output_context2(&oc, nullptr, "matroska", nullptr) < 0 || !oc) return {};
  AVStream* st = avformat_new_stream(oc, nullptr);
  AVCodecContext* c = avcodec_alloc_context3(codec);
  c->width = w;
  c->height = h;
  c->time_base = {1, fps};
  c->framerate = {fps, 1};
  c->pix_fmt = AV_PIX_FMT_YUV420P;
  c->gop_size = 5;
  c->bit_rate = 400000;
  if (oc->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  std::vector<uint8_t> out;
  AVFrame* f = av_frame_alloc();
  AVPacket* pkt = av_packet_alloc();
  bool ok = st && avcodec_open2(c, codec, nullptr) >= 0 && avcodec_parameters_from_context(st->codecpar, c) >= 0;
  if (ok) {
    st->time_base = c->time_base;
    st->avg_frame_rate = c->framerate;
    ok = avio_open_dyn_buf(&oc->pb) >= 0 && avformat_write_header(oc, nullptr) >= 0;
  }
  if (ok) {
    f->format = c->pix_fmt;
    f->width = w;
    f->height = h;
    ok = av_frame_get_buffer(f, 0) >= 0;
  }
  auto flush = [&](AVFrame* fr) {
    avcodec_send_frame(c, fr);
    while (avcodec_receive_packet(c, pkt) == 0) {
      av_packet_rescale_ts(pkt, c->time_base, st->time_base);
      pkt->stream_index = st->index;
      av_interleaved_write_frame(oc, pkt);
    }
  };
  if (ok) {
    for (int k = 0; k < n; ++k) {
      av_frame_make_writable(f);
      const uint8_t grey = uint8_t(16 + (8 * k + 37 * seed) % 220);
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) f->data[0][y * f->linesize[0] + x] = x < 8 ? 235 : grey;
      for (int y = 0; y < h / 2; ++y)
        for (int x = 0; x < w / 2; ++x) f->data[1][y * f->linesize[1] + x] = f->data[2][y * f->linesize[2] + x] = 128;
      f->pts = k;
      flush(f);
    }
    flush(nullptr);
    av_write_trailer(oc);
  }
  if (oc->pb) {
    uint8_t* buf = nullptr;
    const int size = avio_close_dyn_buf(oc->pb, &buf);
    oc->pb = nullptr;
    if (ok && size > 0) out.assign(buf, buf + size);
    av_free(buf);
  }
  av_packet_free(&pkt);
  av_frame_free(&f);
  avcodec_free_context(&c);
  avformat_free_context(oc);
  return out;
}

}  // namespace m3::media::test_clips
