// Weights straight to the device (issue 9 item 5): the safetensors stay mmapped (io/safetensors.h), each tensor's
// bytes go through a small pinned staging ring (double-buffered: the host copies chunk k+1 while chunk k crosses
// PCIe and is converted) to a device staging buffer, and backend/cuda/weight_convert.cuh converts them into the
// executor's storage in its compute dtype. The host never holds more than the ring (2 × 32 MiB by default) — never an
// fp32 copy of the model. Dummy weights (`--load-format dummy`) are generated on the device from a counter hash.
// Built only with CUDA (part of m3_cuda_executor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/fp8_format.h"
#include "io/safetensors.h"
#include "model/weight_plan.h"

// cuda_runtime.h's own spelling of the stream handle, so this header (and model/cuda_executor.h) needs no CUDA headers.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace m3 {

// Where a slot's elements go: `ptr` holds slot.numel() elements, bf16 when `bf16` else fp32. The binder allocates
// on the first call for a slot and returns the same storage on later calls.
struct DeviceSlot {
  void* ptr = nullptr;
  bool bf16 = false;
  // FP8 storage (issue 15, docs/FP8.md): `ptr` receives the slot's e4m3 bytes as the checkpoint holds them
  // (rows() × cols bytes, pieces concatenated along rows) and `scales` its scales in `fp8_fmt`
  // (fp8_scale_count(fp8_fmt, rows(), cols): UE8M0 bytes for G32, floats otherwise; Row128 / Blk128 are made on the
  // device by cuda::fp8_requant_from_mx once the slot's last piece has arrived). Every piece must be MXFP8
  // (slot_is_mxfp8).
  bool fp8 = false;
  Fp8Scale fp8_fmt = Fp8Scale::G32;
  void* scales = nullptr;
};
using SlotBinder = std::function<DeviceSlot(const WeightSlot&)>;

struct LoadStats {
  double seconds = 0;
  int64_t bytes_read = 0;     // checkpoint bytes that crossed to the device (0 for dummy weights)
  int64_t bytes_written = 0;  // device weight bytes produced
  int64_t tensors = 0;
  double read_gb_per_s() const { return seconds > 0 ? double(bytes_read) / seconds / 1e9 : 0.0; }
};

struct StreamOptions {
  size_t chunk_bytes = size_t(32) << 20;  // one staging slot
  int ring = 2;                           // staging slots (pinned host + device), used round robin
};

// Streams every slot of `plan` from `st` to the device. Checks every tensor (present, shape, a floating dtype, the
// MXFP8 scale's shape) before the first byte moves, with the same messages as SafeTensors::read_f32. Tensors are
// read in file order (shard by shard, ascending offsets) so the mmap is read sequentially. Returns when the device
// holds every weight.
LoadStats stream_weights_to_device(const SafeTensors& st, const std::vector<WeightSlot>& plan, const SlotBinder& bind,
                                   cudaStream_t stream, StreamOptions opt = {});

// Whether every piece of `s` is a 2-D MXFP8 tensor in `st` (F8_E4M3 values and their UE8M0 "_scale_inv"), i.e.
// whether the slot can be bound with FP8 storage.
bool slot_is_mxfp8(const SafeTensors& st, const WeightSlot& s);

// Fills every slot with the dummy weights of `seed` (model/weight_plan.h dummy_slot_values is the CPU twin). A slot
// bound as FP8 gets those values quantised to e4m3 with one power-of-two scale per tensor
// (cuda::fp8_fill_counter_uniform), in the slot's scale format.
LoadStats fill_dummy_weights(const std::vector<WeightSlot>& plan, const SlotBinder& bind, uint64_t seed,
                             cudaStream_t stream);

}  // namespace m3
