// Collectives between the ranks of one parallel group (issue 17; docs/PARALLEL.md). A rank is one model replica
// slice: with data-parallel attention + expert-parallel MoE, every rank runs the attention of its own requests and
// the experts it owns, and the MoE layers exchange token rows through these collectives.
//
// The buffers are host memory for the in-process implementation (CPU executors, tests without GPUs) and device
// memory for the NCCL one (one GPU per rank; the calls are queued on the rank's stream). Every collective is called
// by all ranks of the group in the same order with the same sizes (fixed per step, so a GPU step stays capturable);
// sizes are per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"

namespace m3::dist {

// What a rank's collective throws when another rank aborted the group (InProcessGroup::abort): the cause is the
// failing rank's own error, this one only reports that the group stopped.
class GroupAborted : public Error {
 public:
  explicit GroupAborted(const std::string& why) : Error("parallel group aborted: " + why) {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[q·bytes .. (q+1)·bytes) = rank q's send[0 .. bytes), for every q (rank order).
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // send: [size · n] floats; recv[i] = Σ_q (rank q's send)[rank · n + i], summed in rank order q = 0, 1, …
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t n) = 0;
  // buf[i] = Σ_q (rank q's buf)[i] in rank order, in place on every rank.
  virtual void all_reduce_sum(float* buf, size_t n) = 0;
  virtual void barrier() = 0;
};

}  // namespace m3::dist
