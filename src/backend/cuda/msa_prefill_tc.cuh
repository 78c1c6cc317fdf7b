// MSA sparse prefill attention on Hopper tensor cores, union-tile query-major loop order (docs/KERNELS.md §8): one
// CTA owns R = 8 consecutive query rows × G = 16 heads of one KV head (128 MMA rows, two 64-row consumer
// warpgroups of 4 tokens each) and walks the union of the rows' selected pages, loading each page's K and V once
// by TMA; rows that did not select a page are masked, the local page is cut at the row's position. bf16 q and bf16 paged HND cache, fp32 accumulate and fp32 output. The fp32 query-major
// MsaPrefill (msa_prefill.cuh) stays the reference baseline.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/attention_dense.cuh"
#include "backend/cuda/common.cuh"

namespace m3::cuda {

// One layer's bf16 K and V pools: element (page p, KV head h, token j, channel d) at base + p·page_stride +
// (h·B + j)·D + d (bf16 elements; page_stride a multiple of 8).
struct DevPagedKVBf16 {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t page_stride = 0;
  int64_t num_pages = 0;
  int num_kv_heads = 0, block_size = 0, head_dim = 0;
};

class MsaPrefillUnion {
 public:
  // Sizes the launch for T rows. Supports head_dim 128, block_size 128, group 16, top_k ≤ 16; else m3::Error.
  void plan(int64_t T, int num_kv_heads, int group, int head_dim, int block_size, int top_k);
  // q: [T, Hq, D] bf16; selection: [Hkv, T, top_k] (valid prefix, local block included, −1 padding); rows: the
  // step's positions and page tables; out: [T, Hq, D] fp32. Allocates nothing after the first call.
  // route (optional, [⌈T / 8⌉, Hkv] bytes): tiles marked 1 are skipped and their rows left untouched (the
  // KV-block-major kernel writes them; msa_prefill_sparse.cuh).
  // out_bf16 (optional): the output as bf16 [T, Hq, D] there instead of fp32 to `out` (what the O projection reads).
  void run(const uint16_t* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKVBf16& kv,
           float scale, float* out, cudaStream_t s, const uint8_t* route = nullptr, uint16_t* out_bf16 = nullptr);
  // Dense causal attention with the same kernel (issue 10: tensor-core dense prefill): no selection, every row
  // reads blocks 0..local of its sequence (the tile walks the pages of the sequences its rows belong to). plan()
  // as above; its top_k is ignored here.
  void run_dense(const uint16_t* q, const DevStepRows& rows, const DevPagedKVBf16& kv, float scale, float* out,
                 cudaStream_t s, uint16_t* out_bf16 = nullptr);
  // Throws m3::Error when a run() since the last check saw a selected block after the row's local block.
  void check(cudaStream_t s);
  // The consumer warpgroups take turns issuing their MMAs (FlashAttention-3's ping-pong); on by default, off for
  // the A/B benchmark.
  void set_pingpong(bool on) { pingpong_ = on; }

 private:
  int64_t T_ = 0;
  int Hkv_ = 0, G_ = 0, K_ = 0;
  bool pingpong_ = true;
  DeviceBuffer<int> error_;
};

}  // namespace m3::cuda
