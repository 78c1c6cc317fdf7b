// CPU cost of tokenising a ~60k-token chat prompt cold vs resuming at a cached ~58k-token prefix
// (Tokenizer::encode_cached). Not a test: prints ms; numbers go to bench/results/*-prefix-tokenize-cpu.md.
//   tokenizer_prefix_bench <tokenizer.json> <corpus.jsonl> [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer/tokenizer.h"

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s tokenizer.json corpus.jsonl [reps]\n", argv[0]);
    return 2;
  }
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 9;
  std::vector<std::string> docs;
  {
    std::ifstream f(argv[2]);
    std::string l;
    while (std::getline(f, l)) docs.push_back(nlohmann::json::parse(l).get<std::string>());
  }
  if (docs.size() < 10) {
    std::fprintf(stderr, "corpus %s has too few documents\n", argv[2]);
    return 2;
  }
  m3::Tokenizer tok = m3::Tokenizer::from_file(argv[1]);
  // Prefix: corpus documents until 58k tokens; each request appends a different ~2k-token suffix.
  std::string prefix;
  size_t di = 0;
  while (tok.encode_serial(prefix, false).size() < 58000) {
    for (int k = 0; k < 4; ++k) prefix += docs[di++ % docs.size()] + "\n";
  }
  auto suffix = [&](int r) {
    std::string s = "User turn " + std::to_string(r) + "\n";
    while (s.size() < 8000) s += docs[(di + size_t(r) * 37 + s.size()) % docs.size()] + "\n";
    return s;
  };
  const std::string first = prefix + suffix(0);
  const size_t n_tokens = tok.encode_serial(first, false).size();
  std::vector<double> cold, serial, miss, hit;
  for (int r = 0; r < reps; ++r) {
    std::string text = prefix + suffix(r + 1);
    auto t0 = std::chrono::steady_clock::now();
    auto a = tok.encode(text, false);
    cold.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    auto s = tok.encode_serial(text, false);
    serial.push_back(ms_since(t0));
    // A fresh tokenizer: empty cache, so this is the first request of a conversation.
    m3::Tokenizer fresh = m3::Tokenizer::from_file(argv[1]);
    t0 = std::chrono::steady_clock::now();
    auto b = fresh.encode_cached(text, false);
    miss.push_back(ms_since(t0));
    const std::string next = prefix + suffix(r + 1000);
    t0 = std::chrono::steady_clock::now();
    auto c = fresh.encode_cached(next, false);
    hit.push_back(ms_since(t0));
    if (a != b || a != s || c != fresh.encode_serial(next, false)) {
      std::fprintf(stderr, "MISMATCH between cached and plain encode\n");
      return 1;
    }
  }
  std::printf("tokenizer %s: prefix cache %s\n", argv[1], tok.prefix_cache_enabled() ? "enabled" : "DISABLED");
  std::printf("prompt %zu bytes, %zu tokens; shared prefix %zu bytes; %d reps (median ms)\n", first.size(), n_tokens,
              prefix.size(), reps);
  std::printf("  encode (cold, >=256 KB: pool): %.2f ms\n", median(cold));
  std::printf("  encode_serial (cold, 1 core):  %.2f ms\n", median(serial));
  std::printf("  encode_cached, empty cache:    %.2f ms\n", median(miss));
  std::printf("  encode_cached, cached prefix:  %.2f ms\n", median(hit));
  return 0;
}
