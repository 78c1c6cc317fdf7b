// Writes the e2e suite's video clips (tests/e2e/vision.test.mjs) with libavcodec: MPEG-4 Part 2 in Matroska, made by
// tests/media/clip_util.h. Usage: e2e_make_clip OUT_DIR — writes a.mkv (seed 0) and b.mkv (seed 1): 25 frames of
// 96×64 at 5 fps (5 s), the same size and length, different content.
#include <cstdio>
#include <filesystem>
#include <string>

#include "clip_util.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(argv[1], ec);
  for (int seed : {0, 1}) {
    const auto clip = m3::media::test_clips::make_clip(25, 96, 64, 5, seed);
    if (clip.empty()) {
      std::fprintf(stderr, "e2e_make_clip: libavcodec could not encode MPEG-4\n");
      return 1;
    }
    const std::string path = std::string(argv[1]) + (seed ? "/b.mkv" : "/a.mkv");
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(clip.data(), 1, clip.size(), f) != clip.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "e2e_make_clip: cannot write %s\n", path.c_str());
      return 1;
    }
    std::printf("%s: %zu bytes\n", path.c_str(), clip.size());
  }
  return 0;
}
