// Shared helpers for the CLI subcommands that run the model directly (generate, score, serve): parse id lists,
// load a model onto the chosen device, and run a prompt through prefill in chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/sequence_kv.h"
#include "model/executor.h"
#include "model/m3_model.h"

namespace m3::app {

// "1,2,3" or "1 2 3" or a JSON array → ids. Throws m3::Error on anything else.
std::vector<int32_t> parse_id_list(const std::string& text);

// A model ready to run: the executor, and the CPU model it wraps when running on the CPU.
struct LoadedModel {
  std::unique_ptr<M3Model> cpu_model;
  std::unique_ptr<ModelExecutor> executor;
};
// device: "cpu", "cuda" or "auto" (cuda when this build has it and a GPU is present). num_pages ≤ 0 lets the
// executor choose (CUDA: from free memory); the CPU executor then gets `cpu_default_pages`.
LoadedModel load_model(const std::string& model_dir, const std::string& device, int32_t num_pages,
                       int32_t cpu_default_pages);
// Valid --device values, for CLI checks.
inline const std::vector<std::string>& device_choices() {
  static const std::vector<std::string> v{"auto", "cpu", "cuda"};
  return v;
}

// Prefills `ids` into `seq` in chunks of `chunk` tokens (0 = one shot). Returns the logits of the last position
// ([V]), or of every position ([n, V]) with all_logits. `trace`, when given, sees every chunk's forward.
std::vector<float> prefill(ModelExecutor& ex, SequenceKV& seq, const std::vector<int32_t>& ids, int64_t chunk,
                           bool all_logits, ForwardTrace* trace = nullptr);

}  // namespace m3::app
