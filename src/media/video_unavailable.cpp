// decode_video (video.h) in a build without FFmpeg's libraries (src/media/CMakeLists.txt: e.g. the GPU machine's
// image, where only the image codecs are carried): every video input gets a clear error; images are unaffected.
#include "media/media_error.h"
#include "media/video.h"

namespace m3::media {

VideoFrames decode_video(std::span<const uint8_t> bytes, const VideoLimits& lim) {
  (void)bytes;
  (void)lim;
  media_fail("video input is not supported by this server build (built without FFmpeg's libraries)");
}

}  // namespace m3::media
