#include "app/model_runner.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace m3::app {

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      fail("token ids: invalid JSON: {}", e.what());
    }
    for (const auto& v : j) {
      M3_CHECK(v.is_number_integer(), "token ids: every entry must be an integer");
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  }
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    for (char ch : cur) M3_CHECK(std::isdigit(static_cast<unsigned char>(ch)), "token ids: '{}' is not an id", cur);
    M3_CHECK(cur.size() < 10, "token ids: '{}' is too large", cur);
    ids.push_back(std::stoi(cur));
    cur.clear();
  };
  for (char ch : text) {
    if (ch == ',' || std::isspace(static_cast<unsigned char>(ch)))
      flush();
    else
      cur.push_back(ch);
  }
  flush();
  return ids;
}

void add_parallel_flags(CLI::App& cmd, ParallelOptions& o) {
  cmd.add_option("--tensor-parallel-size", o.tensor_parallel_size,
                 "Ranks of attention split over KV heads (must divide the KV and index heads); each rank loads only "
                 "its heads' weights and its range of the vocabulary rows, and caches only its KV heads (CPU backend "
                 "so far; not with --data-parallel-size > 1)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd.add_option("--data-parallel-size", o.data_parallel_size,
                 "Data-parallel attention ranks, each with its own KV cache and prefix cache; requests are placed "
                 "by prefix-cache affinity, then load (CPU backend only so far; --kv-cache-memory is per rank)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd.add_flag("--enable-expert-parallel", o.enable_expert_parallel,
               "With --data-parallel-size > 1: routed expert e runs on rank e mod the ranks, the MoE layers "
               "exchange token rows (without it every rank runs every expert); with --tensor-parallel-size > 1: "
               "each rank loads and runs only its experts, their outputs are summed over the ranks");
}

void apply_parallel_options(const ParallelOptions& o, const std::string& device, EngineConfig& ec,
                            LoadOptions& load) {
  M3_CHECK(o.tensor_parallel_size >= 1, "--tensor-parallel-size must be at least 1, got {}", o.tensor_parallel_size);
  M3_CHECK(o.tensor_parallel_size == 1 || device == "cpu",
           "--tensor-parallel-size {} needs the CPU backend for now: pass --device cpu (the multi-GPU path over NCCL "
           "is not written yet)",
           o.tensor_parallel_size);
  M3_CHECK(o.tensor_parallel_size == 1 || o.data_parallel_size == 1,
           "--tensor-parallel-size {} with --data-parallel-size {}: combining them is not supported yet (one KV-head "
           "split serves every request)",
           o.tensor_parallel_size, o.data_parallel_size);
  M3_CHECK(o.data_parallel_size >= 1, "--data-parallel-size must be at least 1, got {}", o.data_parallel_size);
  M3_CHECK(o.data_parallel_size == 1 || device == "cpu",
           "--data-parallel-size {} needs the CPU backend for now: pass --device cpu (the multi-GPU path over NCCL "
           "is not written yet)",
           o.data_parallel_size);
  ec.data_parallel_size = o.data_parallel_size;
  ec.enable_expert_parallel = o.enable_expert_parallel;
  load.tensor_parallel_size = o.tensor_parallel_size;
  load.tensor_parallel_experts = o.tensor_parallel_size > 1 && o.enable_expert_parallel;
  if (o.tensor_parallel_size > 1) ec.enable_expert_parallel = false;  // the experts split inside the TP executor
}

std::vector<float> prefill(ModelExecutor& ex, SequenceKV& seq, const std::vector<int32_t>& ids, int64_t chunk,
                           bool all_logits, ForwardTrace* trace) {
  M3_CHECK(!ids.empty(), "prefill: empty prompt");
  const int64_t n = int64_t(ids.size());
  if (chunk <= 0) chunk = n;
  seq.reserve(n);
  std::vector<float> logits;
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t len = std::min(chunk, n - s);
    SeqInput in{std::span<const int32_t>(ids.data() + s, size_t(len)), s, seq.pages(), all_logits};
    auto out = ex.forward(std::span<const SeqInput>(&in, 1), trace);
    if (all_logits)
      logits.insert(logits.end(), out[0].begin(), out[0].end());
    else
      logits = std::move(out[0]);
  }
  return logits;
}

}  // namespace m3::app
