// Shared helpers for the CLI subcommands that run the model directly (generate, score): parse id lists, size a
// cache, and run a prompt through prefill in chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "model/m3_model.h"

namespace m3::app {

// "1,2,3" or "1 2 3" or a JSON array → ids. Throws m3::Error on anything else.
std::vector<int32_t> parse_id_list(const std::string& text);

// Prefills `ids` into `seq` in chunks of `chunk` tokens (0 = one shot); returns the logits of the last chunk
// ([rows, V], rows = chunk length when all_logits else 1). `all_logits` collects logits for every position.
std::vector<float> prefill(const M3Model& model, KVCache& cache, SequenceKV& seq, const std::vector<int32_t>& ids,
                           int64_t chunk, bool all_logits, ForwardTrace* trace = nullptr);

}  // namespace m3::app
