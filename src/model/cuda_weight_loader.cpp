#include "model/cuda_weight_loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_gemm.cuh"
#include "backend/cuda/weight_convert.cuh"
#include "base/counter_hash.h"
#include "base/error.h"
#include "base/thread_pool.h"

namespace m3 {

namespace {

using Clock = std::chrono::steady_clock;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// One checkpoint tensor's trip: from its mmapped bytes to `dst` (element offset `dst_off` of its slot).
struct Work {
  const TensorRef* t = nullptr;
  const TensorRef* scale = nullptr;  // MXFP8 block scales
  cuda::SrcType src = cuda::SrcType::F32;
  DeviceSlot dst;
  int64_t dst_off = 0;
  int slot = -1;  // index in the plan (FP8 storage: the slot's pieces are counted down to its conversion)
};

cuda::SrcType src_type(const TensorRef& t, const std::string& name) {
  switch (t.dtype) {
    case DType::F32: return cuda::SrcType::F32;
    case DType::F64: return cuda::SrcType::F64;
    case DType::BF16: return cuda::SrcType::BF16;
    case DType::F16: return cuda::SrcType::F16;
    case DType::F8_E4M3: return cuda::SrcType::E4M3;
    default:
      fail("tensor '{}' in {} has dtype {}, which is not a floating-point weight type", name, t.file,
           dtype_name(t.dtype));
  }
}

// Pinned host + device staging buffers, reused round robin. A slot is free again once the event recorded after its
// last use (copy + convert) has completed.
class StagingRing {
 public:
  struct Slot {
    uint8_t* host = nullptr;
    void* dev = nullptr;
    cudaEvent_t done = nullptr;
  };
  StagingRing(size_t bytes, int n) : bytes_(bytes), slots_(size_t(std::max(n, 1))) {
    for (Slot& s : slots_) {
      M3_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s.host), bytes, cudaHostAllocDefault));
      M3_CUDA_CHECK(cudaMalloc(&s.dev, bytes));
      M3_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
  }
  ~StagingRing() {
    for (Slot& s : slots_) {
      if (s.done) cudaEventSynchronize(s.done), cudaEventDestroy(s.done);
      if (s.dev) cudaFree(s.dev);
      if (s.host) cudaFreeHost(s.host);
    }
  }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  size_t bytes() const { return bytes_; }
  // The next slot, once the device is done with it.
  Slot& acquire() {
    Slot& s = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    M3_CUDA_CHECK(cudaEventSynchronize(s.done));
    return s;
  }

 private:
  size_t bytes_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

// mmap → pinned copy on the pool's threads: one thread alone reads page cache at a few GB/s, below PCIe.
void parallel_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  constexpr size_t kPart = size_t(1) << 20;
  const int64_t parts = int64_t((n + kPart - 1) / kPart);
  ThreadPool::global().parallel_for(parts, [&](int64_t b, int64_t e) {
    const size_t lo = size_t(b) * kPart, hi = std::min(n, size_t(e) * kPart);
    std::memcpy(dst + lo, src + lo, hi - lo);
  });
}

}  // namespace

LoadStats stream_weights_to_device(const SafeTensors& st, const std::vector<WeightSlot>& plan, const SlotBinder& bind,
                                   cudaStream_t stream, StreamOptions opt) {
  const auto t0 = Clock::now();
  M3_CHECK(opt.chunk_bytes >= 4096 && opt.chunk_bytes % 8 == 0, "staging chunk of {} bytes", opt.chunk_bytes);
  // 1. Resolve and check every tensor first, so a bad checkpoint fails before any copy.
  std::vector<Work> work;
  const WeightSlot* embed = nullptr;
  std::vector<const WeightSlot*> tied;  // LM heads that are a copy of the embedding
  LoadStats stats;
  size_t max_scale = 0;
  std::vector<int> fp8_pieces_left(plan.size(), 0);
  for (size_t si = 0; si < plan.size(); ++si) {
    const WeightSlot& s = plan[si];
    if (s.kind == SlotKind::Embed) embed = &s;
    if (s.kind == SlotKind::LmHead && s.may_tie_to_embed && !st.has(s.pieces[0].names[0])) {
      tied.push_back(&s);
      continue;
    }
    const DeviceSlot dst = bind(s);
    int64_t off = 0;
    for (const WeightPiece& p : s.pieces) {
      const std::string name = resolve_name(st, p);
      const TensorRef& t = st.get(name);
      M3_CHECK(t.shape == p.shape, "tensor '{}' in {} has shape {} but the config implies {}", name, t.file,
               shape_str(t.shape), shape_str(p.shape));
      Work w;
      w.t = &t;
      w.src = src_type(t, name);
      w.dst = dst;
      w.dst_off = off;
      w.slot = int(si);
      if (dst.fp8) {
        M3_CHECK(w.src == cuda::SrcType::E4M3 && t.shape.size() == 2,
                 "tensor '{}' in {} is {} {}; FP8 storage needs a 2-D MXFP8 tensor", name, t.file,
                 dtype_name(t.dtype), shape_str(t.shape));
        M3_CHECK(dst.ptr && dst.scales, "FP8 slot {} bound without value or scale storage", s.label());
        ++fp8_pieces_left[si];
      }
      if (w.src == cuda::SrcType::E4M3) {
        const std::string scale_name = name + "_scale_inv";
        M3_CHECK(st.has(scale_name), "tensor '{}' in {} is FP8 but its block scale '{}' is missing", name, t.file,
                 scale_name);
        const TensorRef& sc = st.get(scale_name);
        M3_CHECK(!t.shape.empty(), "FP8 tensor '{}' must have at least one dimension", name);
        std::vector<int64_t> sshape = t.shape;
        sshape.back() = (t.shape.back() + 31) / 32;
        M3_CHECK(sc.dtype == DType::U8 || sc.dtype == DType::I8 || sc.dtype == DType::F8_E4M3,
                 "scale '{}' in {} must be one byte per block (UE8M0), got {}", scale_name, sc.file,
                 dtype_name(sc.dtype));
        M3_CHECK(sc.shape == sshape, "scale '{}' in {} has shape {} but [.., {}/32] = {} is needed", scale_name,
                 sc.file, shape_str(sc.shape), t.shape.back(), shape_str(sshape));
        w.scale = &sc;
        max_scale = std::max(max_scale, sc.nbytes);
      }
      work.push_back(w);
      off += p.numel();
    }
  }
  // File order: shard by shard, ascending offsets (the mmap is read front to back).
  std::stable_sort(work.begin(), work.end(), [](const Work& a, const Work& b) {
    return a.t->file != b.t->file ? a.t->file < b.t->file : a.t->data < b.t->data;
  });

  // 2. Stream. Per chunk: wait for a free staging slot, copy mmap → pinned (host threads), copy pinned → device and
  // convert into the slot's storage (both on `stream`), record the slot's event. The host's copy of chunk k+1
  // overlaps the transfer and conversion of chunk k.
  StagingRing ring(opt.chunk_bytes, opt.ring);
  cuda::DeviceBuffer<uint8_t> scales;
  if (max_scale) scales.grow(max_scale);
  std::map<int, cuda::DeviceBuffer<uint8_t>> g32_pending;  // FP8 slots bound as Row128 / Blk128: their G32 scales
  for (const Work& w : work) {
    if (w.scale) {
      // The scales of this tensor, ahead of its data on the same stream (so the previous tensor's conversions have
      // finished reading the scale buffer before it is overwritten).
      for (size_t at = 0; at < w.scale->nbytes; at += ring.bytes()) {
        const size_t n = std::min(ring.bytes(), w.scale->nbytes - at);
        StagingRing::Slot& sl = ring.acquire();
        std::memcpy(sl.host, w.scale->data + at, n);
        M3_CUDA_CHECK(cudaMemcpyAsync(scales.get() + at, sl.host, n, cudaMemcpyHostToDevice, stream));
        M3_CUDA_CHECK(cudaEventRecord(sl.done, stream));
      }
      stats.bytes_read += int64_t(w.scale->nbytes);
    }
    if (w.dst.fp8) {  // FP8 storage: the e4m3 bytes as they are, the UE8M0 scales beside them (docs/FP8.md)
      const WeightSlot& s = plan[size_t(w.slot)];
      const int64_t rows = w.t->shape[0], cols = w.t->shape[1], scols = (cols + 31) / 32, row0 = w.dst_off / cols;
      uint8_t* g32 = static_cast<uint8_t*>(w.dst.scales);
      if (w.dst.fp8_fmt != Fp8Scale::G32) {
        cuda::DeviceBuffer<uint8_t>& b = g32_pending[w.slot];
        if (!b.get()) b.grow(size_t(s.rows() * scols));
        g32 = b.get();
      }
      M3_CUDA_CHECK(cudaMemcpyAsync(g32 + row0 * scols, scales.get(), size_t(rows * scols), cudaMemcpyDeviceToDevice,
                                    stream));
      for (size_t at = 0; at < w.t->nbytes; at += ring.bytes()) {
        const size_t n = std::min(ring.bytes(), w.t->nbytes - at);
        StagingRing::Slot& sl = ring.acquire();
        parallel_copy(sl.host, w.t->data + at, n);
        M3_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(w.dst.ptr) + size_t(w.dst_off) + at, sl.host, n,
                                      cudaMemcpyHostToDevice, stream));
        M3_CUDA_CHECK(cudaEventRecord(sl.done, stream));
      }
      if (--fp8_pieces_left[size_t(w.slot)] == 0 && w.dst.fp8_fmt != Fp8Scale::G32) {
        uint8_t* q = static_cast<uint8_t*>(w.dst.ptr);  // requantised in place
        cuda::fp8_requant_from_mx(q, g32, s.rows(), cols, w.dst.fp8_fmt, q, static_cast<float*>(w.dst.scales),
                                  stream);
        g32_pending.erase(w.slot);  // cudaFree waits for the conversion
      }
      stats.bytes_read += int64_t(w.t->nbytes);
      stats.tensors += 1;
      continue;
    }
    const size_t esz = dtype_size(w.t->dtype);
    const size_t dsz = w.dst.bf16 ? 2 : 4;
    const int64_t cols = w.t->shape.empty() ? 1 : w.t->shape.back();
    const int64_t scols = (cols + 31) / 32;
    const size_t chunk_elems = ring.bytes() / esz;
    const int64_t n_all = w.t->numel();
    for (int64_t e0 = 0; e0 < n_all; e0 += int64_t(chunk_elems)) {
      const int64_t n = std::min<int64_t>(int64_t(chunk_elems), n_all - e0);
      StagingRing::Slot& sl = ring.acquire();
      parallel_copy(sl.host, w.t->data + size_t(e0) * esz, size_t(n) * esz);
      M3_CUDA_CHECK(cudaMemcpyAsync(sl.dev, sl.host, size_t(n) * esz, cudaMemcpyHostToDevice, stream));
      cuda::convert_weights(sl.dev, w.src, n, static_cast<uint8_t*>(w.dst.ptr) + size_t(w.dst_off + e0) * dsz,
                            w.dst.bf16, w.scale ? scales.get() : nullptr, e0, cols, scols, stream);
      M3_CUDA_CHECK(cudaEventRecord(sl.done, stream));
    }
    stats.bytes_read += int64_t(w.t->nbytes);
    stats.tensors += 1;
  }
  for (const WeightSlot* s : tied) {
    M3_CHECK(embed, "tied LM head without an embedding");
    const DeviceSlot from = bind(*embed), to = bind(*s);
    M3_CHECK(from.bf16 == to.bf16 && !from.fp8 && !to.fp8, "tied LM head: embedding and head dtypes differ");
    M3_CUDA_CHECK(cudaMemcpyAsync(to.ptr, from.ptr, size_t(s->numel()) * (to.bf16 ? 2 : 4), cudaMemcpyDeviceToDevice,
                                  stream));
  }
  M3_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (const WeightSlot& s : plan) {
    const DeviceSlot d = bind(s);
    if (d.fp8) {
      const int64_t cols = s.pieces[0].shape.back();
      stats.bytes_written += fp8_matrix_bytes(d.fp8_fmt, s.rows(), cols);
    } else {
      stats.bytes_written += s.numel() * (d.bf16 ? 2 : 4);
    }
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

bool slot_is_mxfp8(const SafeTensors& st, const WeightSlot& s) {
  for (const WeightPiece& p : s.pieces) {
    const std::string name = resolve_name(st, p);
    if (!st.has(name) || !st.has(name + "_scale_inv")) return false;
    const TensorRef& t = st.get(name);
    if (t.dtype != DType::F8_E4M3 || t.shape.size() != 2) return false;
  }
  return !s.pieces.empty();
}

LoadStats fill_dummy_weights(const std::vector<WeightSlot>& plan, const SlotBinder& bind, uint64_t seed,
                             cudaStream_t stream) {
  const auto t0 = Clock::now();
  LoadStats stats;
  const WeightSlot* embed = nullptr;
  for (const WeightSlot& s : plan) {
    if (s.kind == SlotKind::Embed) embed = &s;
    // A tied LM head is the embedding, as dummy_weights (the CPU twin) makes it.
    const WeightSlot& src = (s.kind == SlotKind::LmHead && s.may_tie_to_embed && embed) ? *embed : s;
    const DeviceSlot d = bind(s);
    if (d.fp8) {  // the same uniform values, quantised to e4m3 with one power-of-two scale per tensor
      const int64_t rows = s.rows(), cols = s.pieces[0].shape.back();
      M3_CHECK(&src == &s, "tied LM head in FP8 storage ({})", s.label());
      cuda::fp8_fill_counter_uniform(static_cast<uint8_t*>(d.ptr), d.scales, d.fp8_fmt, rows, cols,
                                     counter_key(seed, s.stream_id()), s.dummy_scale, stream);
      stats.bytes_written += fp8_matrix_bytes(d.fp8_fmt, rows, cols);
      stats.tensors += 1;
      continue;
    }
    cuda::fill_counter_uniform(d.ptr, d.bf16, s.numel(), counter_key(seed, src.stream_id()), src.dummy_scale, stream);
    stats.bytes_written += s.numel() * (d.bf16 ? 2 : 4);
    stats.tensors += 1;
  }
  M3_CUDA_CHECK(cudaStreamSynchronize(stream));
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

}  // namespace m3
