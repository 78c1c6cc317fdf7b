// MSA sparse attention for prefill, query-major (docs/MSA_CONTRACT.md §4.1): one CTA per (query token, KV head) runs
// its G query heads over its ≤ top_k selected blocks with an online softmax; the causal mask is the last page's
// fill. This is the correctness baseline behind a plan()/run() interface that the KV-block-major / union-tile
// kernels (§4.2–4.4) can slot into later: plan() sees request metadata only (positions → page-list offsets,
// allocation); run() sees per-layer tensors and allocates nothing, so it is capture-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/msa_decode.cuh"

namespace m3::cuda {

class MsaPrefill : public SparseAttentionLists {
 public:
  // pos: host copy of the step's positions (chunk rows of every request, in order).
  void plan(const std::vector<int32_t>& pos, int num_kv_heads, int group, int head_dim, int block_size, int top_k,
            cudaStream_t s);
  // q, out: [T, Hq, D]; selection: [Hkv, T, top_k].
  void run(const float* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKV& kv, float scale,
           float* out, cudaStream_t s);
};

}  // namespace m3::cuda
