// Plain driver for the libFuzzer targets of tests/fuzz: feeds every file of the given files or directories to
// LLVMFuzzerTestOneInput once, so the seed corpora (regression seeds included) run under ctest with g++ — no clang
// and no sanitizers needed. A target signals a bug by crashing or aborting, which fails the test.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

namespace {

bool replay_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", p.c_str());
    return false;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int files = 0;
  bool ok = true;
  for (int a = 1; a < argc; ++a) {
    const fs::path arg = argv[a];
    std::vector<fs::path> paths;
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::recursive_directory_iterator(arg))
        if (e.is_regular_file()) paths.push_back(e.path());
    } else {
      paths.push_back(arg);
    }
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      ok = replay_file(p) && ok;
      ++files;
    }
  }
  std::printf("replayed %d inputs\n", files);
  if (files == 0) {
    std::fprintf(stderr, "no inputs found: an empty corpus replays nothing\n");
    return 1;
  }
  return ok ? 0 : 1;
}
