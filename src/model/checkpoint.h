// A model directory read once: config.json → M3Config, then the safetensors → M3Weights (fp32 on the host). Both
// executors start from this.
#pragma once

#include <functional>
#include <string>

#include "io/config.h"
#include "model/m3_weights.h"
#include "model/rank_share.h"

namespace m3 {

struct Checkpoint {
  M3Config config;
  M3Weights weights;
};

// Throws m3::Error naming the directory, file or tensor that is missing or wrong. `before_weights`, when given,
// sees the config before the (slow) weight load, so a caller can reject bad options early. `share`: load only one
// rank's tensors and rows (model/rank_share.h).
Checkpoint load_checkpoint(const std::string& model_dir,
                           const std::function<void(const M3Config&)>& before_weights = {},
                           const RankShare& share = {});

}  // namespace m3
