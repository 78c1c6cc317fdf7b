// Where a step's GPU time goes (issue 9's end-to-end benchmark): CUDA events recorded between the ops of a forward,
// each interval charged to the category of the work it ended (attention, indexer, MoE, GEMMs, ...). Off unless
// M3_STEP_PROFILE=1 (or 2: also the largest single intervals of the decode graph at exit) is set in the environment:
// the events cost a few µs of host time per op. The report splits
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

  // CUDA graphs (docs/ENGINE_STEP.md). flush(): collect the pending step now (before a capture, which may not
  // wait). take_recorded(): after a capture — the marks since begin() were recorded into the graph as event nodes,
  // not executed; returns their categories and forgets them. replay(): a step that replays such a graph; its event
  // nodes record the same events, so the step is collected like an eager one.
  void flush() {
    if (on_) collect();
  }
  std::vector<int8_t> take_recorded();
  void replay(bool decode, const std::vector<int8_t>& cats);

 private:
  void record(Cat c, cudaStream_t s);
  void start_step(bool decode);  // collect the previous step, the idle bookkeeping, an empty event list
  void collect();
  bool on_ = false;
  std::vector<cudaEvent_t> events_;  // reused across steps
  std::vector<int8_t> cats_;         // category of the interval ending at event i (i ≥ 1)
  // Host clock at each record() of an eager step (empty for graph replays): how long the host took to queue each
  // category, and an upper bound on how long the GPU waited for it (docs/ENGINE_STEP.md, "host-bound intervals").
  std::vector<double> host_s_;
  size_t used_ = 0;
  bool pending_ = false, pending_decode_ = false;
  std::array<std::array<double, kCount>, 2> ms_{};  // [prefill, decode][cat]
  std::array<int64_t, 2> steps_{};
  std::array<std::array<double, kCount>, 2> host_ms_{}, wait_ms_{};  // [prefill, decode][cat], eager steps only
  std::array<int64_t, 2> host_steps_{};
  // M3_STEP_PROFILE=2: one line per eager prefill step (the first 64): GPU and host time, the interval with the
  // largest GPU wait — whether a category's wait is steady or one step's (a first-call cost).
  std::vector<std::string> eager_lines_;
  // GPU idle between decode steps, from the host clock: the wall time from one decode step's begin to the next
  // (when the next follows within 100 ms, i.e. the engine had work) against the first step's GPU time.
  double last_begin_s_ = -1.0, pending_gpu_ms_ = 0.0;
  bool last_was_decode_ = false;
  double busy_wall_ms_ = 0.0, busy_gpu_ms_ = 0.0;
  int64_t untimed_ = 0;  // steps whose events could not be timed
  // Decode steps with the same event list (one graph's replays): mean ms per interval, so the report can name the
  // few intervals a category's time sits in (M3_STEP_PROFILE=2 logs the largest ones at exit).
  std::vector<int8_t> interval_cats_;
  std::vector<double> interval_ms_;
  int64_t interval_steps_ = 0;
  bool intervals_ = false;
  std::string interval_report() const;
};

}  // namespace m3
