#include "model/gpu_step_profile.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
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
  intervals_ = e && std::strcmp(e, "2") == 0;
}

GpuStepProfile::~GpuStepProfile() {
  if (on_ && (steps_[0] || steps_[1] || pending_)) {
    cudaDeviceSynchronize();
    collect();
    spdlog::info("gpu step profile (at exit): {}", report());
    if (intervals_) spdlog::info("decode step intervals (at exit): {}", interval_report());
    if (intervals_ && !eager_lines_.empty()) {
      std::string all;
      for (const std::string& l : eager_lines_) all += (all.empty() ? "" : " | ") + l;
      spdlog::info("eager prefill steps (at exit): {}", all);
    }
  }
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void GpuStepProfile::begin(bool decode, cudaStream_t s) {
  if (!on_) return;
  start_step(decode);
  record(kEmbedNorm, s);  // the step's start (its category is unused)
}

void GpuStepProfile::start_step(bool decode) {
  collect();
  const double t = now_s();
  if (last_begin_s_ >= 0 && last_was_decode_ && decode && t - last_begin_s_ < 0.1)
    busy_wall_ms_ += 1e3 * (t - last_begin_s_), busy_gpu_ms_ += pending_gpu_ms_;
  last_begin_s_ = t, last_was_decode_ = decode, pending_gpu_ms_ = 0.0;
  if ((steps_[0] + steps_[1]) > 0 && (steps_[0] + steps_[1]) % 500 == 0) spdlog::info("gpu step profile: {}", report());
  used_ = 0;
  cats_.clear();
  host_s_.clear();
  pending_ = true;
  pending_decode_ = decode;
}

void GpuStepProfile::record(Cat c, cudaStream_t s) {
  if (used_ == events_.size()) {
    cudaEvent_t ev;
    M3_CUDA_CHECK(cudaEventCreate(&ev));
    events_.push_back(ev);
  }
  // While a decode graph is captured, a plain record would only order the capture's streams; External makes it an
  // event-record node, so each replay records the event and the step is timed like an eager one.
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  M3_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
  M3_CUDA_CHECK(cudaEventRecordWithFlags(events_[used_], s,
                                         cap == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : 0));
  cats_.push_back(int8_t(c));
  if (cap != cudaStreamCaptureStatusActive) host_s_.push_back(now_s());
  ++used_;
}

void GpuStepProfile::collect() {
  if (!pending_ || used_ < 2) {
    pending_ = false;
    return;
  }
  pending_ = false;
  if (cudaEventSynchronize(events_[used_ - 1]) != cudaSuccess) {
    cudaGetLastError();
    ++untimed_;
    return;
  }
  std::array<double, kCount> step{}, host{}, wait{};
  const bool eager = host_s_.size() == used_;
  double total = 0, worst_wait = 0;
  size_t worst_i = 0;
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0.f;
    if (cudaEventElapsedTime(&ms, events_[i - 1], events_[i]) != cudaSuccess) {  // never fatal: a profile
      cudaGetLastError();
      ++untimed_;
      return;
    }
    step[size_t(cats_[i])] += ms;
    if (eager) {
      // The interval's work was queued by host time host_s_[i]; the GPU reached its start at `total` ms after event
      // 0, which it executed no earlier than it was queued (host_s_[0]). So the GPU can have waited in this interval
      // for at most (queued − reached), clipped to the interval: an upper bound, exact when the GPU was idle at 0.
      const double queued = 1e3 * (host_s_[i] - host_s_[0]);
      host[size_t(cats_[i])] += 1e3 * (host_s_[i] - host_s_[i - 1]);
      const double w = std::clamp(queued - total, 0.0, double(ms));
      wait[size_t(cats_[i])] += w;
      if (w > worst_wait) worst_wait = w, worst_i = i;
    }
    total += ms;
    if (intervals_ && pending_decode_) {
      if (i == 1 && interval_cats_ != cats_) interval_cats_ = cats_, interval_ms_.assign(used_, 0.0), interval_steps_ = 0;
      interval_ms_[i] += ms;
    }
  }
  if (intervals_ && pending_decode_) ++interval_steps_;
  auto& acc = ms_[pending_decode_ ? 1 : 0];
  for (int c = 0; c < kCount; ++c) acc[size_t(c)] += step[size_t(c)];
  if (eager) {
    const size_t d = pending_decode_ ? 1 : 0;
    for (size_t c = 0; c < size_t(kCount); ++c) host_ms_[d][c] += host[c], wait_ms_[d][c] += wait[c];
    ++host_steps_[d];
    if (intervals_ && d == 0 && eager_lines_.size() < 64)
      eager_lines_.push_back(fmt::format(
          "#{}: gpu {:.2f} ms, host {:.2f} ms, largest wait {:.2f} ms in interval {} of {} ({})", host_steps_[0], total,
          1e3 * (host_s_[used_ - 1] - host_s_[0]), worst_wait, worst_i, used_ - 1,
          worst_i ? name(Cat(cats_[worst_i])) : "-"));
  }
  ++steps_[pending_decode_ ? 1 : 0];
  pending_gpu_ms_ = total;
}

std::vector<int8_t> GpuStepProfile::take_recorded() {
  std::vector<int8_t> out;
  if (!on_) return out;
  out.swap(cats_);
  used_ = 0;
  pending_ = false;
  return out;
}

void GpuStepProfile::replay(bool decode, const std::vector<int8_t>& cats) {
  if (!on_ || cats.empty()) return;
  start_step(decode);  // collects the previous step; the graph's event nodes record events_[0..n) themselves
  cats_ = cats;
  used_ = cats.size();
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
    // M3_STEP_PROFILE=2: per eager step, the host's time to queue each category and the GPU's wait for it (≤).
    if (intervals_ && host_steps_[size_t(d)]) {
      const double n = double(host_steps_[size_t(d)]);
      out += fmt::format(" [eager {} steps, host queue / gpu wait ≤ ms per step:", host_steps_[size_t(d)]);
      for (int c = 0; c < kCount; ++c)
        if (host_ms_[size_t(d)][size_t(c)] > 0)
          out += fmt::format(" {} {:.3f} / {:.3f}", name(Cat(c)), host_ms_[size_t(d)][size_t(c)] / n,
                             wait_ms_[size_t(d)][size_t(c)] / n);
      out += "]";
    }
  }
  if (busy_wall_ms_ > 0)
    out += fmt::format(" | gpu idle between back-to-back decode steps {:.1f}% ({:.0f} of {:.0f} ms)",
                       100.0 * std::max(0.0, 1.0 - busy_gpu_ms_ / busy_wall_ms_),
                       std::max(0.0, busy_wall_ms_ - busy_gpu_ms_), busy_wall_ms_);
  if (untimed_) out += fmt::format(" | {} steps not timed", untimed_);
  return out.empty() ? "no steps" : out;
}

std::string GpuStepProfile::interval_report() const {
  if (interval_steps_ == 0) return "none";
  std::vector<size_t> order;
  for (size_t i = 1; i < interval_ms_.size(); ++i) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return interval_ms_[a] > interval_ms_[b]; });
  std::string out = fmt::format("{} steps, {} intervals; largest (interval #: category, mean ms):",
                                interval_steps_, interval_ms_.size() - 1);
  for (size_t k = 0; k < order.size() && k < 24; ++k)
    out += fmt::format(" #{}: {} {:.4f}", order[k], name(Cat(interval_cats_[order[k]])),
                       interval_ms_[order[k]] / double(interval_steps_));
  out += " | in order:";
  for (size_t i = 1; i < interval_ms_.size(); ++i)
    out += fmt::format(" {}:{:.4f}", name(Cat(interval_cats_[i])), interval_ms_[i] / double(interval_steps_));
  return out;
}

}  // namespace m3
