// Ranks as GPUs of one process over NCCL (issue 17; docs/PARALLEL.md): one thread and one device per rank, every
// collective queued on the rank's stream (device buffers; nothing synchronises but barrier()). Built with CUDA when
// the toolkit's NCCL is found. NVLink SHARP / multicast is switched off (NCCL_NVLS_ENABLE=0 unless the environment
// sets it): on the shared machines it can take the host's GPUs out of service.
// Sums: NCCL's own reduction order (ring / tree), not rank order — equal to the in-process group up to rounding.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace m3::dist {

class NcclGroup {
 public:
  // One rank per device id (ncclCommInitAll); each rank gets a non-blocking stream on its device.
  explicit NcclGroup(const std::vector<int>& devices);
  ~NcclGroup();
  int size() const { return int(ranks_.size()); }
  // Rank r's communicator; its thread must have cudaSetDevice(device(r)) current.
  Communicator& rank(int r);
  int device(int r) const { return devices_.at(size_t(r)); }
  cudaStream_t stream(int r) const;

 private:
  class Rank;
  std::vector<int> devices_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace m3::dist
