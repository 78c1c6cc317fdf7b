#include "model/gpu_step_profile.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/common.cuh"

namespace m3 {

const char* GpuStepProfile::name(Cat c) {
  static const char* names[kCount] = {"embed+norms", "gemm", "attention", "indexer", "mlp", "moe", "head", "sampling"};
  return names[c];
}

GpuStepProfile::GpuStepProfile() {
  const char* e = std::getenv("M3_STEP_PROFILE");
  on_ = e && std::strcmp(e, "0") != 0 && *e;
}

GpuStepProfile::~GpuStepProfile() {
  if (on_ && (steps_[0] || steps_[1] || pending_)) {
    cudaDeviceSynchronize();
    collect();
    spdlog::info("gpu step profile (at exit): {}", report());
  }
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
}

void GpuStepProfile::begin(bool decode, cudaStream_t s) {
  if (!on_) return;
  collect();
  if ((steps_[0] + steps_[1]) > 0 && (steps_[0] + steps_[1]) % 500 == 0) spdlog::info("gpu step profile: {}", report());
  used_ = 0;
  cats_.clear();
  pending_ = true;
  pending_decode_ = decode;
  record(kEmbedNorm, s);  // the step's start (its category is unused)
}

void GpuStepProfile::record(Cat c, cudaStream_t s) {
  if (used_ == events_.size()) {
    cudaEvent_t ev;
    M3_CUDA_CHECK(cudaEventCreate(&ev));
    events_.push_back(ev);
  }
  M3_CUDA_CHECK(cudaEventRecord(events_[used_], s));
  cats_.push_back(int8_t(c));
  ++used_;
}

void GpuStepProfile::collect() {
  if (!pending_ || used_ < 2) {
    pending_ = false;
    return;
  }
  M3_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
  auto& acc = ms_[pending_decode_ ? 1 : 0];
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0.f;
    M3_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
    acc[size_t(cats_[i])] += ms;
  }
  ++steps_[pending_decode_ ? 1 : 0];
  pending_ = false;
}

std::string GpuStepProfile::report() const {
  std::string out;
  for (int d = 1; d >= 0; --d) {
    if (!steps_[size_t(d)]) continue;
    double total = 0;
    for (double v : ms_[size_t(d)]) total += v;
    out += fmt::format("{}{} {} steps, {:.3f} ms/step:", out.empty() ? "" : " | ", d ? "decode" : "prefill",
                       steps_[size_t(d)], total / double(steps_[size_t(d)]));
    for (int c = 0; c < kCount; ++c)
      out += fmt::format(" {} {:.3f} ms ({:.0f}%)", name(Cat(c)), ms_[size_t(d)][size_t(c)] / double(steps_[size_t(d)]),
                         total > 0 ? 100.0 * ms_[size_t(d)][size_t(c)] / total : 0.0);
  }
  return out.empty() ? "no steps" : out;
}

}  // namespace m3
