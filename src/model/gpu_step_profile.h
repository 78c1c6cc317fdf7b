// Where a step's GPU time goes (issue 9's end-to-end benchmark): CUDA events recorded between the ops of a forward,
// each interval charged to the category of the work it ended (attention, indexer, MoE, GEMMs, ...). Off unless
// M3_STEP_PROFILE=1 is set in the environment: the events cost a few µs of host time per op. The report splits
// decode steps (every sequence brings ≤ 16 tokens) from prefill steps and is logged every 500 steps and at exit.
// Reading an interval needs its events complete: a step's intervals are collected at the start of the next step
// (the executor has synchronised on the step's read-back by then), so no extra sync is added.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace m3 {

class GpuStepProfile {
 public:
  enum Cat { kEmbedNorm, kGemm, kAttention, kIndexer, kMlp, kMoe, kHead, kSampling, kCount };
  static const char* name(Cat c);

  GpuStepProfile();  // reads M3_STEP_PROFILE
  ~GpuStepProfile();
  GpuStepProfile(const GpuStepProfile&) = delete;
  GpuStepProfile& operator=(const GpuStepProfile&) = delete;

  bool on() const { return on_; }
  // Starts a step on stream s (collects the previous step first).
  void begin(bool decode, cudaStream_t s);
  // The work queued since the last mark belongs to c.
  void mark(Cat c, cudaStream_t s) {
    if (on_) record(c, s);
  }
  // Totals so far as a one-line summary, e.g. "decode 812 steps, 3.10 ms/step: attention 21% …".
  std::string report() const;

 private:
  void record(Cat c, cudaStream_t s);
  void collect();
  bool on_ = false;
  std::vector<cudaEvent_t> events_;  // reused across steps
  std::vector<int8_t> cats_;         // category of the interval ending at event i (i ≥ 1)
  size_t used_ = 0;
  bool pending_ = false, pending_decode_ = false;
  std::array<std::array<double, kCount>, 2> ms_{};  // [prefill, decode][cat]
  std::array<int64_t, 2> steps_{};
};

}  // namespace m3
