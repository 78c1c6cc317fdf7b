#include "dist/nccl_communicator.h"

#include <nccl.h>

#include <cstdlib>

#include "base/error.h"

namespace m3::dist {

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  M3_CHECK(r == ncclSuccess, "NCCL {} failed: {}", what, ncclGetErrorString(r));
}
void cuda_check(cudaError_t e, const char* what) {
  M3_CHECK(e == cudaSuccess, "CUDA {} failed: {}", what, cudaGetErrorString(e));
}

}  // namespace

class NcclGroup::Rank final : public Communicator {
 public:
  Rank(ncclComm_t comm, int r, int n, int device) : comm_(comm), r_(r), n_(n), device_(device) {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaMalloc(&one_, sizeof(float)), "cudaMalloc");
  }
  ~Rank() override {
    cudaSetDevice(device_);
    if (one_) cudaFree(one_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return r_; }
  int size() const override { return n_; }
  cudaStream_t stream() const { return stream_; }

  void all_gather(const void* send, size_t bytes, void* recv) override {
    nccl_check(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_), "all_gather");
  }
  void reduce_scatter_sum(const float* send, float* recv, size_t n) override {
    nccl_check(ncclReduceScatter(send, recv, n, ncclFloat32, ncclSum, comm_, stream_), "reduce_scatter");
  }
  void all_reduce_sum(float* buf, size_t n) override {
    nccl_check(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, stream_), "all_reduce");
  }
  void barrier() override {
    all_reduce_sum(static_cast<float*>(one_), 1);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  ncclComm_t comm_ = nullptr;
  int r_, n_, device_;
  cudaStream_t stream_ = nullptr;
  void* one_ = nullptr;
};

NcclGroup::NcclGroup(const std::vector<int>& devices) : devices_(devices) {
  M3_CHECK(!devices.empty(), "an NCCL group needs at least one device");
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::vector<ncclComm_t> comms(devices.size());
  nccl_check(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
  for (size_t r = 0; r < devices.size(); ++r)
    ranks_.push_back(std::make_unique<Rank>(comms[r], int(r), int(devices.size()), devices[r]));
}

NcclGroup::~NcclGroup() = default;

Communicator& NcclGroup::rank(int r) { return *ranks_.at(size_t(r)); }
cudaStream_t NcclGroup::stream(int r) const { return ranks_.at(size_t(r))->stream(); }

}  // namespace m3::dist
