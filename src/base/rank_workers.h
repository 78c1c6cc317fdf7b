// Persistent threads for the ranks of a parallel step (docs/PARALLEL.md) — the data-parallel ranks of one engine,
// the KV-head ranks of model/tp_executor.h: a step runs rank 0 on the calling thread and ranks 1 … P−1 on these, in
// lockstep (the exchanges inside each rank's forward are collective). Starting P − 1 threads per step cost tens of microseconds per thread on every step; these wait
// on a condition variable between steps instead.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

class RankWorkers {
 public:
  // ranks ≥ 1; ranks − 1 threads are started (none for one rank).
  explicit RankWorkers(int ranks);
  ~RankWorkers();  // stops and joins the threads (none may be inside run())
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int ranks() const { return int(threads_.size()) + 1; }
  // Calls fn(r) once for every rank r: r = 0 on the calling thread, the others on the workers; returns when all
  // have returned. An exception from any rank is rethrown here after every rank has finished (the lowest rank's).
  // One caller at a time.
  void run(const std::function<void(int)>& fn);

 private:
  void loop(int r);
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace m3
