#include "base/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace m3 {

namespace {
thread_local bool t_inside_pool = false;
}

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("M3_NUM_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  int64_t chunks = std::min<int64_t>(max_chunks, int64_t(size()) * 4);
  // One job at a time: a second caller (e.g. an HTTP thread tokenizing while the engine thread runs a GEMM) does its
  // work inline rather than overwrite the running job's state. Results do not depend on the chunking.
  std::unique_lock<std::mutex> caller(caller_mu_, std::try_to_lock);
  if (chunks <= 1 || workers_.empty() || t_inside_pool || !caller.owns_lock()) {
    fn(0, n);
    return;
  }
  int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_chunk_ = 0;
  num_chunks_ = chunks;
  chunks_done_ = 0;
  ++generation_;
  cv_work_.notify_all();
  // The caller works too.
  t_inside_pool = true;
  while (next_chunk_ < num_chunks_) {
    int64_t c = next_chunk_++;
    lk.unlock();
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    lk.lock();
    ++chunks_done_;
  }
  t_inside_pool = false;
  cv_done_.wait(lk, [&] { return chunks_done_ == num_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  t_inside_pool = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_work_.wait(lk, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < num_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < num_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, chunk = job_chunk_;
      lk.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      lk.lock();
      if (++chunks_done_ == num_chunks_) cv_done_.notify_all();
    }
  }
}

}  // namespace m3
