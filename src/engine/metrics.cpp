#include "engine/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace m3 {

Histogram Histogram::latency() {
  Histogram h;
  h.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

void Histogram::observe(double s) {
  size_t i = size_t(std::lower_bound(bounds.begin(), bounds.end(), s) - bounds.begin());
  ++counts[i];
  sum += s;
  ++count;
}

void Histogram::append_prometheus(std::string& out, const char* name, const char* help,
                                  const std::string& labels) const {
  out += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += counts[i];
    out += fmt::format("m3serve:{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds[i], cum);
  }
  cum += counts.back();
  out += fmt::format("m3serve:{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cum);
  out += fmt::format("m3serve:{}_sum{{{}}} {}\nm3serve:{}_count{{{}}} {}\n", name, labels, sum, name, labels, count);
}

std::string EngineMetrics::to_prometheus(const std::string& model) const {
  std::string out;
  const std::string lbl = fmt::format("model_name=\"{}\"", model);
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} gauge\nm3serve:{}{{{}}} {}\n", name, help, name, name,
                       lbl, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP m3serve:{} {}\n# TYPE m3serve:{} counter\nm3serve:{}{{{}}} {}\n", name, help, name,
                       name, lbl, v);
  };
  auto hist = [&](const char* name, const char* help, const Histogram& h) { h.append_prometheus(out, name, help, lbl); };
  gauge("num_requests_running", "Requests in the running batch.", num_running);
  gauge("num_requests_waiting", "Requests waiting to be scheduled.", num_waiting);
  gauge("kv_pages_total", "KV cache pages (K, V and index-K of block_size tokens each).", pages_total);
  gauge("kv_pages_used", "KV pages referenced by requests.", pages_used);
  gauge("kv_pages_cached", "KV pages held by the prefix cache.", pages_cached);
  gauge("kv_pages_free", "KV pages in the free list.", pages_free);
  gauge("kv_cache_bytes", "KV cache capacity in bytes (pages x bytes per page, every layer's K, V and index-K).",
        double(pages_total) * double(page_bytes));
  gauge("kv_cache_used_bytes", "Bytes of the KV pages referenced by requests.", double(pages_used) * double(page_bytes));
  gauge("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens looked up.",
        prefix_query_tokens ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0);
  counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", double(prefix_query_tokens));
  counter("prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", double(prefix_hit_tokens));
  counter("prompt_tokens_total", "Prompt tokens of admitted requests.", double(prompt_tokens));
  counter("generation_tokens_total", "Generated tokens.", double(generation_tokens));
  counter("num_preemptions_total", "Requests preempted (by recompute) because KV pages ran out.", double(preemptions));
  counter("grammar_masks_total", "Token masks computed for constrained decoding (one per constrained row and step).",
          double(grammar_masks));
  counter("grammar_mask_seconds_total", "Host seconds spent computing constrained-decoding token masks.",
          grammar_mask_seconds);
  counter("media_items_requested_total",
          "Images and videos whose features the engine asked the vision encoder for (the items from the first one "
          "not entirely in the prefix cache's hit).",
          double(media_items_requested));
  counter("media_items_skipped_total",
          "Images and videos of finished requests never encoded: the prefix cache held all their slot tokens.",
          double(media_items_skipped));
  out += "# HELP m3serve:request_success_total Finished requests by finish reason.\n"
         "# TYPE m3serve:request_success_total counter\n";
  for (auto [reason, v] : {std::pair{"stop", requests_stop}, {"length", requests_length}, {"abort", requests_abort},
                           {"error", requests_error}})
    out += fmt::format("m3serve:request_success_total{{{},finished_reason=\"{}\"}} {}\n", lbl, reason, v);
  hist("time_to_first_token_seconds", "Time from arrival to the first generated token.", ttft);
  hist("inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", itl);
  hist("e2e_request_latency_seconds", "Time from arrival to finish.", e2e);
  return out;
}

}  // namespace m3
