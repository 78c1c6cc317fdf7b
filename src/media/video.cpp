// The FFmpeg-free part of video.h: frame sampling and prompt timestamps (decode_video is in video_ffmpeg.cpp, or
// video_unavailable.cpp in a build without FFmpeg's libraries).
#include "media/video.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "media/media_error.h"
#include "media/prompt.h"

namespace m3::media {

std::vector<int64_t> sample_frame_indices(const std::vector<double>& ts, double fps, double max_seconds,
                                          int max_frames) {
  std::vector<int64_t> keep;
  if (ts.empty()) return keep;
  const double step = 1.0 / fps;
  double last = 0.0;
  for (size_t i = 0; i < ts.size() && int(keep.size()) < max_frames; ++i) {
    if (ts[i] - ts[0] > max_seconds) break;
    if (keep.empty() || ts[i] >= last + step - 1e-4) {
      keep.push_back(int64_t(i));
      last = ts[i];
    }
  }
  return keep;
}

std::vector<std::string> video_timestamps(const VideoFrames& v) {
  std::vector<std::string> out;
  if (v.src_fps <= 0 || v.indices.empty()) return out;
  const size_t n = v.indices.size();
  for (size_t k = 0; 2 * k < n || (k == 0 && n > 0); ++k)
    out.push_back(format_timestamp(double(v.indices[std::min(2 * k, n - 1)]) / v.src_fps));
  return out;
}

}  // namespace m3::media
