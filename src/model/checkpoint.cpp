#include "model/checkpoint.h"

#include <filesystem>

#include "base/error.h"
#include "io/safetensors.h"

namespace m3 {

Checkpoint load_checkpoint(const std::string& model_dir, const std::function<void(const M3Config&)>& before_weights,
                           const RankShare& share) {
  namespace fs = std::filesystem;
  M3_CHECK(fs::is_directory(model_dir), "model directory {} does not exist", model_dir);
  Checkpoint ck;
  ck.config = load_m3_config((fs::path(model_dir) / "config.json").string());
  if (before_weights) before_weights(ck.config);
  SafeTensors st = SafeTensors::open(model_dir);
  ck.weights = M3Weights::load(ck.config, st, share);
  return ck;
}

}  // namespace m3
