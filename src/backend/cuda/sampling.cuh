// Token sampling on the GPU (issue 9): logits → token ids inside the step, with the CPU sampler's semantics
// (engine/sampler.h) reproduced choice for choice. Per row, in this order:
//   adjust (one kernel): repetition penalty over prompt + generated tokens, presence / frequency penalties over the
//     generated ones, logit_bias, EOS / stop ids → −inf before min_tokens — in place on the logits, each with the
//     CPU's float arithmetic (no FMA contraction); rows that ask for logprobs first keep a raw copy;
//   sample (one kernel, one CTA per row): greedy = the largest (logit, −id) key; otherwise the fixed-point weights
//     of base/rng.h (integer running masses, so no sum order can change a choice) and one of two exact paths:
//       - shared: the candidates that can weigh anything (x = (l − max) / T ≥ −28) are compacted into shared memory
//         (≤ 4096 of 200,064 for any peaked row), sorted there, scanned, cut (top_k, min_p, top_p) and drawn;
//       - select: when more than 4096 can weigh (flat rows), no sort at all: each cut and the draw is a radix
//         select over the 64-bit key (logit, id) by digits of 11 bits, with per-bin counts and integer masses, over
//         the row in global memory (a few passes each, early out once a bin holds one token);
//     then the logprobs of the raw logits when the row asks (log-sum-exp in fp64, top ones by repeated key max).
// CUDA-graph friendly: every per-row parameter lives in one staging buffer that goes up in ONE host → device copy
// per step; kernels take only device pointers and capacity-sized grids (rows ≥ the step's count return at once);
// the only read-back is finish(): the token ids (+ the logprob rows when a row asked), then the one stream sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/common.cuh"

namespace m3::cuda {

constexpr int kMaxTopLogprobs = 20;

// One row as the kernels read it (a plain struct in the staging buffer).
struct SampleRowParams {
  int32_t active = 0;      // 0: the row needs no token (id −1)
  int32_t logit_row = 0;   // which row of the logits [*, V] belongs to it
  float temperature = 1.f;  // 0 → greedy
  float top_p = 1.f;
  int32_t top_k = -1;       // ≤ 0: disabled
  float min_p = 0.f;
  int32_t top_logprobs = -1;  // −1: none; else the chosen token's logprob and this many top ones (raw logits)
  int32_t pad_ = 0;
  uint64_t bits53 = 0;  // the draw: uniform_bits_from_seed(seed, choice, step) (base/rng.h)
  float repetition = 1.f, presence = 0.f, frequency = 0.f;
  // Offsets into the staging pool (int32): tokens [tok_off, +n_tok) (prompt + generated when the repetition penalty
  // is on, else only the generated ones), generated from tok_off + gen_begin; logit_bias ids [bias_off, +n_bias) and
  // their values' float bits right after; ids masked to −inf [mask_off, +n_mask).
  int32_t tok_off = 0, n_tok = 0, gen_begin = 0;
  int32_t bias_off = 0, n_bias = 0;
  int32_t mask_off = 0, n_mask = 0;
  // Constrained decoding: a packed bitmask of the allowed ids [ceil(V / 32)] at pool offset allow_off (−1: none);
  // the others go to −inf after the masks above (engine/sampler.h RowSampling::allowed).
  int32_t allow_off = -1, pad2_ = 0;
};

// What comes back for a row.
struct SampleLogprobs {
  float chosen = 0.f;  // logprob of the chosen token under the raw logits
  int32_t n_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

class DeviceSampler {
 public:
  DeviceSampler() = default;
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  // Sizes every buffer for `max_rows` rows of `vocab` logits (reallocates only when larger). Call before a graph
  // capture: enqueue() reserves on its own, which is fine eagerly but not while capturing.
  void reserve(int max_rows, int vocab, bool logprobs = false);

  // Host side of a step: begin(), then add_row() once per row (rows in order), then enqueue() and finish().
  void begin(int vocab);
  // tokens: what the penalties read (see SampleRowParams); bias: ids + values; mask: ids set to −inf; allowed: the
  // grammar's packed bitmask [ceil(vocab / 32)] (nullptr: unconstrained), staged with the rest (one upload).
  void add_row(const SampleRowParams& p, const int32_t* tokens, int n_tokens, int gen_begin, const int32_t* bias_ids,
               const float* bias_values, int n_bias, const int32_t* mask, int n_mask,
               const uint32_t* allowed = nullptr);
  int rows() const { return int(rows_.size()); }

  // Queues the staging upload (one copy), the adjust kernel and the sample kernel on `s`. Modifies `logits`
  // [*, V] in place (penalties, bias, masks) on the rows it samples.
  void enqueue(float* logits, cudaStream_t s);
  // enqueue() in two halves, for a CUDA graph: upload() (reserve + the staging copy, outside the graph) and launch()
  // (the two kernels; capacity-sized grids reading only the staging, so one captured launch serves any later rows
  // as long as nothing was reallocated — cuda::alloc_epoch() tells).
  void upload(cudaStream_t s);
  void launch(float* logits, cudaStream_t s);
  // Queues the read-back of the ids (and logprob rows when asked) and synchronises `s`: the one host sync.
  void finish(cudaStream_t s);
  // After finish(): the chosen ids (−1 for inactive rows) and logprobs (valid for rows with top_logprobs ≥ 0).
  const int32_t* ids() const { return h_ids_; }
  const SampleLogprobs& logprobs(int row) const { return h_lp_[row]; }

 private:
  int cap_rows_ = 0, vocab_ = 0;
  size_t pool_cap_ = 0;
  bool any_logprobs_ = false;
  std::vector<SampleRowParams> rows_;
  std::vector<int32_t> pool_;
  // Staging: [int32 n_rows, 3 × pad][SampleRowParams × cap][int32 pool × pool_cap], pinned and on the device.
  uint8_t* h_stage_ = nullptr;
  DeviceBuffer<uint8_t> d_stage_;
  // Outputs: [int32 ids × cap][SampleLogprobs × cap], pinned and on the device.
  uint8_t* h_out_ = nullptr;
  int32_t* h_ids_ = nullptr;
  SampleLogprobs* h_lp_ = nullptr;
  DeviceBuffer<uint8_t> d_out_;
  DeviceBuffer<float> raw_;       // [cap, V] raw logits of logprob rows
  DeviceBuffer<int32_t> counts_;  // [adjust CTAs, V] token counts of the penalties, zero between uses
  size_t stage_bytes() const;
  size_t out_bytes() const;
};

}  // namespace m3::cuda
