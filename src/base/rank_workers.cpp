#include "base/rank_workers.h"

#include "base/error.h"

namespace m3 {

RankWorkers::RankWorkers(int ranks) {
  M3_CHECK(ranks >= 1, "rank workers: at least one rank, got {}", ranks);
  errors_.resize(size_t(ranks));
  for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankWorkers::loop(int r) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(r);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu_);
    errors_[size_t(r)] = err;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void RankWorkers::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    pending_ = int(threads_.size());
    for (auto& e : errors_) e = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  try {
    fn(0);
  } catch (...) {
    errors_[0] = std::current_exception();  // only this thread writes slot 0, and no worker reads it
  }
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
  for (auto& e : errors_)
    if (e) std::rethrow_exception(e);
}

}  // namespace m3
