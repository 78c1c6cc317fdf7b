// Per-tile choice between the union-tile and the KV-block-major MSA prefill kernels (msa_prefill_sparse.cuh).
#include "backend/cuda/msa_prefill_sparse.cuh"

#include <algorithm>
#include <vector>

#include "backend/cpu/msa_route.h"

namespace m3::cuda {
namespace {

constexpr int kTok = 8, kB = 128;
static_assert(kTok == cpu::kMsaRouteTileRows, "the route twin's tiles are the union kernel's");

// CPU twin: cpu::msa_prefill_route (backend/cpu/msa_route.h). One CTA of 128 threads per (tile of 8 rows, KV head);
// thread i = entry (row i / top_k, slot i % top_k) of the tile's selections. E = valid entries; |U| = distinct
// physical pages among them, counted by inserting each page into a 256-slot open-addressing set in shared memory (the
// inserting thread of a new key counts it): O(1) per entry instead of comparing with every earlier entry.
__global__ void msa_route_kernel(const int32_t* selection, const int32_t* pos, const int32_t* row_seq,
                                 const int32_t* pt_indptr, const int32_t* pt_pages, int T, int Hkv, int top_k,
                                 int threshold_pct, uint8_t* route, int* routed) {
  constexpr int kSlots = 256;  // > 2 · 128 entries: short probe chains
  __shared__ int32_t set[kSlots];
  __shared__ int counts[2];
  const int tile = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const int tl = i / top_k, slot = i % top_k, t = tile * kTok + tl;
  set[i] = -1;
  set[i + 128] = -1;
  if (i < 2) counts[i] = 0;
  int page = -1;
  if (tl < kTok && t < T) {
    const int b = selection[(int64_t(h) * T + t) * top_k + slot];
    if (b >= 0 && b <= pos[t] / kB) page = pt_pages[pt_indptr[row_seq[t]] + b];
  }
  __syncthreads();
  int distinct = 0;
  if (page >= 0) {
    for (uint32_t k = (uint32_t(page) * 2654435761u) >> 24;; k = (k + 1) % kSlots) {
      const int prev = atomicCAS(&set[k], -1, page);
      if (prev == -1) {
        distinct = 1;  // this thread inserted the key
        break;
      }
      if (prev == page) break;  // an equal entry got there first
    }
  }
  const uint32_t valid = __ballot_sync(0xffffffffu, page >= 0), first = __ballot_sync(0xffffffffu, distinct != 0);
  if (i % 32 == 0) {
    atomicAdd(&counts[0], __popc(first));
    atomicAdd(&counts[1], __popc(valid));
  }
  __syncthreads();
  if (i == 0) {
    // The rule of cpu::msa_prefill_route, with its absolute term: a union of ≤ top_k pages stays a union tile.
    const bool kv_major = counts[0] > top_k && int64_t(counts[0]) * 100 > int64_t(counts[1]) * threshold_pct;
    route[tile * Hkv + h] = uint8_t(kv_major);
    if (kv_major) atomicAdd(routed, 1);
  }
}

}  // namespace

bool MsaPrefillSparse::union_only(const std::vector<int32_t>& pos, const std::vector<int32_t>& row_seq,
                                  int block_size, int top_k, int threshold_pct) {
  return pos.size() == row_seq.size() &&
         cpu::msa_prefill_union_only(pos.data(), row_seq.data(), int64_t(pos.size()), block_size, top_k, threshold_pct);
}

void MsaPrefillSparse::plan(int64_t T, int num_kv_heads, int group, int head_dim, int block_size, int top_k,
                            int64_t num_pages, Mode mode, const std::vector<int32_t>* pos,
                            const std::vector<int32_t>* row_seq) {
  if (mode == Mode::Auto && pos != nullptr && row_seq != nullptr && int64_t(pos->size()) == T &&
      union_only(*pos, *row_seq, block_size, top_k, threshold_pct_))
    mode = Mode::Union;
  union_.plan(T, num_kv_heads, group, head_dim, block_size, top_k);
  if (mode != Mode::Union) kvmajor_.plan(T, num_kv_heads, group, head_dim, block_size, top_k, num_pages);
  mode_ = mode;
  T_ = T;
  Hkv_ = num_kv_heads;
  K_ = top_k;
  route_.grow(size_t(std::max<int64_t>((T + kTok - 1) / kTok * num_kv_heads, 1)));
  routed_.grow(1);
}

void MsaPrefillSparse::run(const uint16_t* q, const int32_t* selection, const DevStepRows& rows,
                           const DevPagedKVBf16& kv, float scale, float* out, cudaStream_t s, uint16_t* out_bf16) {
  if (T_ == 0) return;
  if (mode_ == Mode::Union) return union_.run(q, selection, rows, kv, scale, out, s, nullptr, out_bf16);
  if (mode_ == Mode::KvMajor) return kvmajor_.run(q, selection, rows, kv, scale, out, s, nullptr, nullptr, out_bf16);
  const dim3 grid(unsigned((T_ + kTok - 1) / kTok), unsigned(Hkv_));
  M3_CUDA_CHECK(cudaMemsetAsync(routed_.get(), 0, sizeof(int), s));
  msa_route_kernel<<<grid, kTok * 16, 0, s>>>(selection, rows.pos, rows.row_seq, rows.pt_indptr, rows.pt_pages,
                                               int(T_), Hkv_, K_, threshold_pct_, route_.get(), routed_.get());
  M3_CUDA_LAUNCH_CHECK();
  union_.run(q, selection, rows, kv, scale, out, s, route_.get(), out_bf16);
  kvmajor_.run(q, selection, rows, kv, scale, out, s, route_.get(), routed_.get(), out_bf16);
}

void MsaPrefillSparse::check(cudaStream_t s) {
  union_.check(s);
  if (mode_ != Mode::Union) kvmajor_.check(s);
}

void MsaPrefillSparse::last_route_counts(cudaStream_t s, int64_t* union_tiles, int64_t* kvmajor_tiles) {
  const int64_t n = (T_ + kTok - 1) / kTok * Hkv_;
  std::vector<uint8_t> h(size_t(std::max<int64_t>(n, 0)));
  if (mode_ != Mode::Auto) {
    *union_tiles = mode_ == Mode::Union ? n : 0;
    *kvmajor_tiles = mode_ == Mode::KvMajor ? n : 0;
    return;
  }
  if (n > 0) M3_CUDA_CHECK(cudaMemcpyAsync(h.data(), route_.get(), size_t(n), cudaMemcpyDeviceToHost, s));
  M3_CUDA_CHECK(cudaStreamSynchronize(s));
  int64_t kv = 0;
  for (uint8_t r : h) kv += r;
  *kvmajor_tiles = kv;
  *union_tiles = n - kv;
}

}  // namespace m3::cuda
