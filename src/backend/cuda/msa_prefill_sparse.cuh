// MSA sparse prefill with the loop order chosen per tile on the device (docs/KERNELS.md §8, "Choosing";
// ../shared/docs/MSA_KERNELS.md §4.4): a route kernel measures, for every tile of 8 consecutive rows and KV head,
// the width of the union of the rows' selected pages |U| against the tile's selected entries E; tiles whose union is
// wide (|U| · 100 > E · threshold_pct) go to the KV-block-major kernel (msa_prefill_kvmajor.cuh), the rest to the
// union-tile kernel (msa_prefill_tc.cuh). Both then run over the same output, each writing only its own tiles'
// rows. No host synchronisation: the route is device data.
// Why per tile: the union-tile kernel's cost grows with |U| (one page load and two MMAs per union page for 8 rows),
// the KV-block-major kernel's with E (one MMA tile per 8 (row, page) edges plus 4.2 KB of partials per edge); the
// measured per-unit costs on H200 (bench_prefill_tc, 16k chunk) put the crossover near |U| ≈ 0.26 · E.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/msa_prefill_kvmajor.cuh"
#include "backend/cuda/msa_prefill_tc.cuh"

namespace m3::cuda {

class MsaPrefillSparse {
 public:
  enum class Mode { Auto, Union, KvMajor };
  // As MsaPrefillKvMajor::plan (the same limits); the KV-block-major workspace is sized unless mode is Union.
  // pos / row_seq (optional, the step's rows on the host): with Mode::Auto, a step that union_only() proves goes
  // whole to the union kernel runs it alone — no route kernel, no KV-block-major chain (their 8 launches cost
  // 10–35 µs per sparse layer of a step whose tiles all go to the union kernel: docs/KERNELS.md §8.1).
  void plan(int64_t T, int num_kv_heads, int group, int head_dim, int block_size, int top_k, int64_t num_pages,
            Mode mode = Mode::Auto, const std::vector<int32_t>* pos = nullptr,
            const std::vector<int32_t>* row_seq = nullptr);
  // True when the route kernel would send every tile of the step to the union kernel whatever the indexer chose:
  // every row's selection is fixed (local + 1 ≤ top_k: all of its blocks), and per tile of 8 rows the union is at
  // most Σ over the tile's sequences of (their rows' largest local + 1) — an upper bound of |U| (shared prefix pages
  // only lower it) — while E = Σ (local + 1); so |U| · 100 ≤ E · threshold_pct holds for the real |U|. Speed only:
  // either kernel gives the same result.
  static bool union_only(const std::vector<int32_t>& pos, const std::vector<int32_t>& row_seq, int block_size,
                         int top_k, int threshold_pct);
  // The mode the last plan() chose for its step (Union when union_only() held under Auto).
  Mode step_mode() const { return mode_; }
  // q: [T, Hq, D] bf16; selection [Hkv, T, top_k]; out [T, Hq, D] fp32, or bf16 into out_bf16 when given.
  // Capture-safe apart from the TMA maps, which are rebuilt per call (as in both kernels).
  void run(const uint16_t* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKVBf16& kv,
           float scale, float* out, cudaStream_t s, uint16_t* out_bf16 = nullptr);
  void check(cudaStream_t s);
  // Routing threshold in percent (|U| · 100 > E · pct → KV-block-major); tests set 0 / huge to force a kernel.
  void set_threshold_pct(int pct) { threshold_pct_ = pct; }
  // Test / bench hook (synchronises): how many (tile, KV head) pairs the last run routed to each kernel.
  void last_route_counts(cudaStream_t s, int64_t* union_tiles, int64_t* kvmajor_tiles);

 private:
  MsaPrefillUnion union_;
  MsaPrefillKvMajor kvmajor_;
  DeviceBuffer<uint8_t> route_;
  DeviceBuffer<int> routed_;  // [1]: tiles the last route kernel gave the KV-block-major kernel
  Mode mode_ = Mode::Auto;
  int64_t T_ = 0;
  int Hkv_ = 0, K_ = 0, threshold_pct_ = 26;
};

}  // namespace m3::cuda
