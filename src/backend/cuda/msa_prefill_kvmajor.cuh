// MSA sparse prefill attention, KV-block-major loop order (the seed's first technique; docs/KERNELS.md §11,
// ../shared/docs/MSA_KERNELS.md §4.3): selected KV blocks outside, the queries that chose them inside. Each
// (KV head, physical page) is one row of a device-built block → queries CSR; a persistent tensor-core kernel takes
// tiles of 4 queries × 16 heads of one row, loads the page's K and V and the 4 queries' Q by TMA, and writes one
// normalised partial output + log-sum-exp per (query, selection slot); a combine kernel merges each query's ≤ 16
// partials by LSE. Unlike the union-tile kernel (msa_prefill_tc.cuh) no MMA row is ever masked for "did not
// select", so its speed does not fall when neighbouring queries pick different blocks (random / long contexts);
// the price is the partials' traffic (16 heads × (128 × 2 + 4) bytes per (query, block)).
// bf16 q and bf16 paged HND cache, fp32 accumulate, fp32 output (the same contract as MsaPrefillUnion).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/msa_prefill_tc.cuh"

namespace m3::cuda {

class MsaPrefillKvMajor {
 public:
  // Sizes every buffer for T rows over a cache of num_pages pages: the CSR (Hkv · num_pages rows), the tile list
  // and the partials [top_k, T, Hq, D] bf16 + [top_k, T, Hq] fp32. Supports head_dim 128, block_size 128, group 16,
  // top_k ≤ 16, T < 2^24; else m3::Error. Allocates only when the sizes grow.
  void plan(int64_t T, int num_kv_heads, int group, int head_dim, int block_size, int top_k, int64_t num_pages);
  // q: [T, Hq, D] bf16; selection: [Hkv, T, top_k] (valid prefix, local block included, −1 padding); out:
  // [T, Hq, D] fp32. Device-only: CSR build (count, one scan, scatter, tile emit), the attention kernel, the
  // combine; no host synchronisation. kv.num_pages must equal the plan's. route (optional, [⌈T / 8⌉, Hkv] bytes):
  // only the tiles of 8 rows marked 1 are served, the others' rows are left untouched (msa_prefill_sparse.cuh).
  // routed (optional, one device int): the number of tiles the router gave this kernel; when it is 0 the CSR build
  // and the attention do no work (a step whose tiles all went to the union-tile kernel pays only the launches).
  // out_bf16 (optional): write the output as bf16 [T, Hq, D] there instead of fp32 to `out`.
  void run(const uint16_t* q, const int32_t* selection, const DevStepRows& rows, const DevPagedKVBf16& kv,
           float scale, float* out, cudaStream_t s, const uint8_t* route = nullptr, const int* routed = nullptr,
           uint16_t* out_bf16 = nullptr);
  // Tile order and CTA shape (speed only; the output is the same bits). window > 0: CSR rows are (KV head, window
  // of `window` consecutive step rows, page), so the tiles of one window's queries run together (0 = one window).
  // chunk: each CTA takes runs of `chunk` consecutive tiles and keeps a page's K/V across them (1 = tiles dealt one
  // by one). consumers: consumer warpgroups per CTA (2 or 3). tma_store: partial blocks leave by TMA stores instead
  // of per-lane global stores (3–6 % faster at every KV length measured, bench/results/2026-12-02e-kvmajor-h200.md).
  // Default (0, 4, 3, true), the fastest measured at KV 64k / 128k; at 16k a window of 16 × the context's pages is
  // 5 % faster still (docs/KERNELS.md §8.1).
  void set_order(int window, int chunk, int consumers = 3, bool tma_store = true);
  // Throws m3::Error when a run() since the last check saw a selected block after the row's local block.
  void check(cudaStream_t s);
  // Bytes of device workspace the plan holds (partials dominate: 16 · T · Hq · 260 B at top-16).
  size_t workspace_bytes() const;
  // Benchmarks: with profiling on, run() records events between its phases; phase_ms() synchronises and returns
  // the last run's CSR build, attention and combine times in ms. Off by default (not capture-safe).
  void profile_phases(bool on);
  void phase_ms(float ms[3]);

 private:
  int64_t T_ = 0, P_ = 0;
  int Hkv_ = 0, G_ = 0, K_ = 0, sms_ = 0;
  int window_ = 0, chunk_ = 4, n_windows_ = 1, consumers_ = 3;
  bool tma_store_ = true;
  DeviceBuffer<int> error_, cnt_, rank_, edge_row_, csr_, n_tiles_;
  DeviceBuffer<unsigned long long> packed_, packed_off_;
  DeviceBuffer<int2> tiles_;
  DeviceBuffer<uint16_t> o_part_;
  DeviceBuffer<float> lse_part_;
  DeviceBuffer<uint8_t> scan_tmp_;
  size_t scan_tmp_bytes_ = 0;
  // Owns the four phase events (created on the first profile_phases(true)); movable, not copyable.
  struct PhaseEvents {
    cudaEvent_t e[4] = {nullptr, nullptr, nullptr, nullptr};
    PhaseEvents() = default;
    PhaseEvents(const PhaseEvents&) = delete;
    PhaseEvents& operator=(const PhaseEvents&) = delete;
    PhaseEvents(PhaseEvents&& o) noexcept { std::swap(e, o.e); }
    PhaseEvents& operator=(PhaseEvents&& o) noexcept {
      std::swap(e, o.e);
      return *this;
    }
    ~PhaseEvents() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } ev_;
  bool profile_ = false;
};

}  // namespace m3::cuda
