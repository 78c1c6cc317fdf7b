// Helpers for tests: tiny M3 configs and random in-memory weights (no files), and a one-call forward.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/config.h"
#include "model/m3_model.h"

namespace m3::test {

// 5 layers: 3 dense attention + dense MLP, 2 MSA + MoE (8 experts, top-2, shared expert); block 16, top-4.
M3Config tiny_config();
// A small config on the tensor-core paths of the CUDA executor (head dim 128, 128-token blocks, G = 16, index dim
// 128, top-2; 1 dense + 2 MSA/MoE layers, hidden 256, vocab 512): decode graphs, fused decode indexer, union prefill.
M3Config tensor_core_config();
// Random weights with a fixed seed; scales keep activations O(1) through the layers.
M3Weights random_weights(const M3Config& c, uint64_t seed);
std::vector<int32_t> random_ids(int64_t n, int vocab, uint64_t seed);
// Writes `w` (whole, fp32) as `dir`/model.safetensors under the checkpoint names of the weight plan
// (model/weight_plan.h). `keep_expert(layer, e)` = false leaves that routed expert's tensors out of the file.
void write_checkpoint(const M3Config& c, const M3Weights& w, const std::string& dir,
                      const std::function<bool(int, int)>& keep_expert = {});

// Runs `ids` through a fresh cache in chunks of `chunk` tokens (0 = one shot) and returns logits for every
// position [n, V]; optionally captures a trace of the last chunk.
std::vector<float> run_chunked(const M3Model& model, const std::vector<int32_t>& ids, int64_t chunk,
                               ForwardTrace* trace = nullptr);

}  // namespace m3::test
