// Shared helpers for the CLI subcommands (generate, score, serve): parse id lists, the --device choices, and a
// prompt's prefill in chunks (score). Models load through make_executor (model/executor_factory.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "kv/sequence_kv.h"
#include "model/executor.h"
#include "model/load_options.h"

namespace m3::app {

// "1,2,3" or "1 2 3" or a JSON array → ids. Throws m3::Error on anything else.
std::vector<int32_t> parse_id_list(const std::string& text);

// Valid --device values, for CLI checks.
inline const std::vector<std::string>& device_choices() {
  static const std::vector<std::string> v{"auto", "cpu", "cuda"};
  return v;
}

// The parallel layout flags, named as vLLM names them (docs/PARALLEL.md): --tensor-parallel-size,
// --data-parallel-size, --enable-expert-parallel.
struct ParallelOptions {
  int tensor_parallel_size = 1;
  int data_parallel_size = 1;
  bool enable_expert_parallel = false;
};
void add_parallel_flags(CLI::App& cmd, ParallelOptions& o);
// Checks the combination before any weight loads (throws m3::Error naming what does not exist yet: parallelism off
// the CPU backend, KV-head splits combined with data or expert parallelism) and sets the engine's data-parallel
// fields and the load's KV-head split (make_executor builds the ranks).
void apply_parallel_options(const ParallelOptions& o, const std::string& device, EngineConfig& ec,
                            LoadOptions& load);

// Prefills `ids` into `seq` in chunks of `chunk` tokens (0 = one shot). Returns the logits of the last position
// ([V]), or of every position ([n, V]) with all_logits. `trace`, when given, sees every chunk's forward.
std::vector<float> prefill(ModelExecutor& ex, SequenceKV& seq, const std::vector<int32_t>& ids, int64_t chunk,
                           bool all_logits, ForwardTrace* trace = nullptr);

}  // namespace m3::app
