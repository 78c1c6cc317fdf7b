// Video decoding with FFmpeg's libraries (libavformat/libavcodec/libswscale) from memory, sampled like vLLM's M3
// loader (docs/M3_MODEL.md §5.3): keep frame 0, then each first frame whose timestamp is ≥ the last kept + 1/fps
// (1e-4 tolerance), up to `max_seconds` of source time and `max_frames` frames.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "media/image.h"

namespace m3::media {

struct VideoLimits {
  double fps = 1.0;                 // sampling rate, 0.2 … 5.0 accepted from a request
  double max_seconds = 300.0;
  int max_frames = 768;
  int64_t max_pixels_per_frame = 4096LL * 2160;
  int64_t max_decoded_frames = 200000;  // bounds work on hostile streams
};

struct VideoFrames {
  std::vector<RgbImage> frames;     // sampled frames, RGB8
  std::vector<int64_t> indices;     // source frame index of each sampled frame
  double src_fps = 0.0;             // average source frame rate (0 when unknown)
};

// Pure sampling rule on frame timestamps (seconds), exposed for tests: indices of kept frames.
std::vector<int64_t> sample_frame_indices(const std::vector<double>& timestamps, double fps, double max_seconds,
                                          int max_frames);

VideoFrames decode_video(std::span<const uint8_t> bytes, const VideoLimits& lim = {});

// Per-group timestamps for the prompt: ts_k = indices[min(2k, n-1)] / src_fps, formatted like Python "%.1f".
std::vector<std::string> video_timestamps(const VideoFrames& v);

}  // namespace m3::media
