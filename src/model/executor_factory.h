// The one way the CLI gets a model ready to run: read the checkpoint once, pick the device, size the KV pool in
// the chosen executor's own page size, and build the executor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/executor.h"

namespace m3 {

// How much KV cache to give the executor. bytes > 0: as many pages as fit (in the executor's page_bytes());
// else tokens > 0: pages for that many tokens; else the executor's default (CPU: default_cpu_pages, CUDA: what
// fits in free device memory).
struct KvBudget {
  int64_t bytes = 0;
  int64_t tokens = 0;
};

// device: "cpu", "cuda" or "auto" (CUDA when this build has it and a GPU is present). Throws m3::Error with a
// clear message for a bad device, a budget that holds no page, or a bad checkpoint — the budget is checked
// before the weights load.
std::unique_ptr<ModelExecutor> make_executor(const std::string& model_dir, const std::string& device,
                                             KvBudget kv = {});

}  // namespace m3
