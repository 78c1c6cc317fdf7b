// Ranks as threads of one process, sharing host memory (issue 17): the CPU executors' expert parallelism and every
// parallel test that runs without GPUs. Each collective publishes the ranks' buffer pointers, meets at a barrier,
// reads the others' buffers directly, and meets again before anyone may reuse its buffer. Results equal the NCCL
// ones' definitions bit for bit (sums in rank order).
// A rank that stops calling collectives (an exception) leaves the others waiting: tests run ranks under one
// deadline, and the engine's error path tears the whole group down.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace m3::dist {

class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  ~InProcessGroup();
  int size() const { return int(ranks_.size()); }
  // The communicator of rank r; one thread per rank calls it.
  Communicator& rank(int r);

 private:
  struct Shared;
  class Rank;
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace m3::dist
