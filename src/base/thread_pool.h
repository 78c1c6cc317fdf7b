// A fixed pool of worker threads for data-parallel loops in the CPU backend.
// parallel_for splits [0, n) into contiguous chunks, runs them on the pool plus the calling thread,
// and returns when all are done. Nested calls from inside a worker, and calls made while another thread's job runs,
// execute serially on the calling thread (no deadlock, no shared job state).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // total threads including the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // fn(begin, end) is called on disjoint chunks covering [0, n); chunks hold at least min_chunk items.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

  // The process-wide pool used by CPU ops (sized by M3_NUM_THREADS or hardware concurrency).
  static ThreadPool& global();

 private:
  void worker_loop(int idx);

  std::vector<std::thread> workers_;
  std::mutex caller_mu_;  // held by the thread whose job the pool is running
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  int64_t next_chunk_ = 0, num_chunks_ = 0, chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace m3
