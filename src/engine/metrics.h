// Engine counters and latency histograms, snapshotted under a lock and rendered as Prometheus text by the server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m3 {

struct Histogram {
  std::vector<double> bounds;    // upper bounds (seconds), ascending; +Inf is implicit
  std::vector<uint64_t> counts;  // per bucket, not cumulative; size bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;

  static Histogram latency();  // 1 ms … 60 s buckets
  void observe(double seconds);
  // Appends the Prometheus text of this histogram as m3serve:<name> with the label set `labels` (e.g.
  // model_name="m3"): HELP, TYPE, cumulative buckets, +Inf, sum and count.
  void append_prometheus(std::string& out, const char* name, const char* help, const std::string& labels) const;
};

struct EngineMetrics {
  int num_running = 0;
  int num_waiting = 0;
  int32_t pages_total = 0;
  int32_t pages_used = 0;         // referenced by a running request (cached-only pages not counted)
  int32_t pages_cached = 0;       // in the prefix cache (some may also be in use)
  int32_t pages_free = 0;         // in the free list
  int64_t page_bytes = 0;         // bytes of one page (K, V and index-K of every layer): the executor's page_bytes()
  uint64_t prompt_tokens = 0;     // total prompt tokens of admitted requests
  uint64_t generation_tokens = 0;
  uint64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache
  uint64_t prefix_hit_tokens = 0;    // of those, served from it
  uint64_t preemptions = 0;
  uint64_t grammar_masks = 0;        // constrained rows sampled (one token mask each)
  double grammar_mask_seconds = 0;   // host time spent computing those masks
  // Images / videos of requests whose features the engine asks for (EngineRequest::media_encoder): asked of the
  // vision encoder, and — counted when the request ends — never asked for because the prefix cache held all their
  // slot tokens.
  uint64_t media_items_requested = 0, media_items_skipped = 0;
  uint64_t requests_stop = 0, requests_length = 0, requests_abort = 0, requests_error = 0;
  Histogram ttft = Histogram::latency();
  Histogram itl = Histogram::latency();
  Histogram e2e = Histogram::latency();

  // Prometheus exposition text; metric names prefixed "m3serve:" like vLLM's "vllm:".
  std::string to_prometheus(const std::string& model_name) const;
};

}  // namespace m3
