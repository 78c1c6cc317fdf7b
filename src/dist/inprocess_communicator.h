// Ranks as threads of one process, sharing host memory (issue 17): the CPU executors' expert parallelism and every
// parallel test that runs without GPUs. Each collective publishes the ranks' buffer pointers, meets at a barrier,
// reads the others' buffers directly, and meets again before anyone may reuse its buffer. Results equal the NCCL
// ones' definitions bit for bit (sums in rank order).
// A rank that stops calling collectives (an exception) would leave the others waiting forever: its caller calls
// abort(), every rank inside or entering a collective throws dist::GroupAborted, and once all ranks are out, reset() makes
// the group usable again (the engine fails that step's requests and keeps serving).
#pragma once

#include <exception>
#include <memory>
#include <string>
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
  // Wakes every rank waiting in a collective (and fails every later one) with dist::GroupAborted naming `why`.
  void abort(const std::string& why);
  // Clears an abort. Only when no rank is inside a collective (after the rank threads have returned).
  void reset();
  // After a step whose ranks ran on threads (err[r]: rank r's exception, or null): rethrows the first error that is
  // not GroupAborted — the failing rank's own — else the first one; returns when there is none.
  static void rethrow_rank_errors(const std::vector<std::exception_ptr>& err);

 private:
  struct Shared;
  class Rank;
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace m3::dist
