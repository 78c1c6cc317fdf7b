// MSA top-k (semantics: cpu::msa_topk) following the MSA contract (docs/MSA_CONTRACT.md §1.1): per (index head, row) with
// n = local + 1 visible blocks: n ≤ K → 0..local then −1; else the K − 1 best history blocks (score desc, ties to the
// lower id, NaN last) in ascending id order, then the local block in slot K − 1. No −1 inside the valid prefix.
// Exact fp32 ranking (no score quantisation), so it matches the CPU twin bit for bit on the same scores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace m3::cuda {

// scores: [H, T, max_cols]; pos: [T] (device); selection: [H, T, top_k]. One CTA per (head, row), K ≤ 64.
void msa_topk(const float* scores, int T, int H, const int32_t* pos, int block_size, int64_t max_cols, int top_k,
              int32_t* selection, cudaStream_t s);

}  // namespace m3::cuda
