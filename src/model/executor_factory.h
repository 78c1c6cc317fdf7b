// The one way the CLI gets a model ready to run: read the checkpoint once, pick the device, size the KV pool in
// the chosen executor's own page size, and build the executor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/executor.h"
#include "model/load_options.h"

namespace m3 {

// How much KV cache to give the executor. bytes > 0: as many pages as fit (in the executor's page_bytes());
// else tokens > 0: pages for that many tokens; else the executor's default (CPU: default_cpu_pages, CUDA: what
// fits in free device memory).
struct KvBudget {
  int64_t bytes = 0;
  int64_t tokens = 0;
};

// device: "cpu", "cuda" or "auto" (CUDA when this build has it and a GPU is present). Throws m3::Error with a
// clear message for a bad device, a budget that holds no page, bad load options (the CPU refuses --dtype bfloat16,
// --kv-cache-dtype fp8 and --attention other than msa; fp8 KV refuses --dtype float32 and --attention msa-v1;
// --num-layers beyond the config) or a bad checkpoint — all checked before the
// weights load. On CUDA the weights stream from the mmapped safetensors to the device (model/cuda_weight_loader.h)
// or are made there (--load-format dummy); the CPU reads them to host fp32 (or makes the dummy weights' CPU twin).
std::unique_ptr<ModelExecutor> make_executor(const std::string& model_dir, const std::string& device,
                                             KvBudget kv = {}, const LoadOptions& load = {});

}  // namespace m3
