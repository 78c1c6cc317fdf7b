#include "backend/cuda/msa_prefill.cuh"

namespace m3::cuda {

void MsaPrefill::plan(const std::vector<int32_t>& pos, int num_kv_heads, int group, int head_dim, int block_size,
                      int top_k, cudaStream_t s) {
  SparseAttentionLists::plan(pos, num_kv_heads, group, head_dim, block_size, top_k, s);
}

void MsaPrefill::run(const float* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKV& kv,
                     float scale, float* out, cudaStream_t s) {
  if (R_ == 0) return;
  // Query-major: the page list of (token, KV head) is its selection; one CTA each, no split (prefill has
  // T·Hkv ≫ #SMs CTAs).
  fill(selection, rows, kv, s);
  paged_gqa_decode(args(q, kv, scale, out), s);
}

}  // namespace m3::cuda
