// The startup warm-up of `m3serve serve` on a GPU executor (src/app/cmd_serve.cpp): one synthetic request — a prompt
// of a full step's tokens and two new tokens — runs through the engine before the server listens, so the first
// client request does not pay the one-time costs of the first prefill and decode steps (CUDA's lazy module loading
// of every kernel and of cuBLASLt's, GEMM plans and heuristics, buffers growing to a full step, the batch-1 decode
// graph). Measured on the H200 (bench/results/2026-12-03f-h200.md): the first 8192-token prefill step of a 60k prompt
// took 108 ms against 62 ms for the second, 49 ms of it the GPU waiting for the host.
#pragma once

#include <cstdint>

namespace m3 {

class Engine;

struct WarmupResult {
  int64_t prompt_tokens = 0;
  double seconds = 0;
};
// Runs the warm-up request to completion (the engine must be started). tokens: the prompt length (clipped to the
// engine's step and length limits); vocab: token ids are drawn from [0, vocab). Throws m3::Error if it fails.
WarmupResult warm_up_engine(Engine& engine, int64_t tokens, int64_t vocab);

}  // namespace m3
