// The load client behind `m3serve bench-serve` (src/app/cmd_bench_serve.cpp registers the options).
//
// Traffic shapes (BenchOptions::traffic):
//   random         --num-prompts independent prompts of --random-input-len tokens
//   shared-prefix  --num-groups groups; each prompt = its group's --shared-prefix-len prefix + --suffix-len suffix
//   agentic        sessions (default: one per --concurrency slot), each --turns turns run one after another; turn t's
//                  prompt = one prefix shared by every session (--shared-prefix-len, default 60,000 tokens) + the
//                  session's suffixes 1..t (each uniform in [--suffix-len-min, --suffix-len-max], default 1–2k), so a
//                  turn re-sends the previous turn's prompt as an agent loop does (the model's own output is not
//                  re-sent: it is random text on a dummy model). A warm-up request with the prefix alone runs
//                  first, outside the timing, so the timed turns see the steady state of an agent fleet.
//   long           one request of --prompt-tokens tokens (e.g. 1,000,000): TTFT = the prefill, TPOT = decode at
//                  that context.
// Prompts are token ids (exact lengths, no tokenizer needed) or, with --prompt-format text, English-like words that
// the server's POST /tokenize maps to about the asked count (so the server's tokenizer is on the measured path).
// The summary goes to stdout (vLLM's layout) and, with --json FILE, to a JSON object; server-side numbers (prefix-
// cache hit rate, KV bytes, preprocess / detokenize time) come from GET /metrics before and after the run.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace m3::app::bench {

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;
  std::string traffic;        // random | shared-prefix | agentic | long; empty: shared-prefix if a prefix is set
  std::string prompt_format = "ids";  // ids | text
  int num_prompts = 100;
  int max_concurrency = 8;
  int input_len = 128;
  int output_len = -1;        // -1: the traffic's default (agentic 300, else 64)
  int shared_prefix_len = 0;  // agentic: 0 → 60,000
  int suffix_len = 32;
  int suffix_len_min = 1000, suffix_len_max = 2000;  // agentic
  int turns = 2;              // agentic: turns per session
  int num_sessions = 0;       // agentic: 0 → max_concurrency
  int64_t prompt_tokens = 100000;  // long
  int num_groups = 1;
  int token_low = 1000, token_high = 20000;
  bool ignore_eos = true;
  bool warmup = true;         // agentic / shared-prefix: one untimed request with the prefix first
  double temperature = 0.0;
  double max_duration = 0;    // > 0: start no new request after this many seconds (in-flight ones finish)
  double metrics_interval = 0.5;  // seconds between /metrics polls (peak KV use); 0 = before/after only
  uint64_t seed = 0;
  std::string output_file;    // one JSON line per request
  std::string json_file;      // the summary as one JSON object
  std::vector<std::string> tags;  // KEY=VALUE, copied into the JSON summary
};

// Runs the benchmark; returns the exit code (0 when every request succeeded).
int run_bench(BenchOptions o);

// ---- pieces exposed for tests -------------------------------------------------------------------------------------

struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, min = 0, max = 0;
  size_t n = 0;
};
// Percentiles by linear interpolation between closest ranks (numpy's default).
Summary summarize(std::vector<double> v);

// Prometheus text → {"name{labels}" → value} plus {"name" → value} for the first series of each name.
std::map<std::string, double> parse_prometheus(const std::string& text);

// English-like text of `words` words from a fixed list (a newline instead of a space every ~16 words), deterministic
// in `seed`. Starts with a newline when `leading_newline` (so concatenated pieces tokenise independently).
std::string token_text(uint64_t seed, int64_t words, bool leading_newline);

}  // namespace m3::app::bench
