// MXFP8 loaded as FP8 (issue 15 item 1, docs/FP8.md): the streaming loader (model/cuda_weight_loader.h) with FP8
// storage keeps the checkpoint's e4m3 bytes and UE8M0 scales (G32) or converts them on the device to 1×128 / 128×128
// power-of-two scales; every FP8 slot's device bytes equal the CPU twin (pieces concatenated along rows, then
// cpu::fp8_requant_from_mx), with tiny staging chunks (tensors straddle chunks) and large ones. Non-FP8 slots keep
// loading as bf16 beside them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "backend/cpu/fp8.h"
#include "backend/cuda/common.cuh"
#include "base/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/cuda_weight_loader.h"
#include "model/weight_plan.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;

// The source tree: $M3_SOURCE_DIR when set (binaries carried to another machine), else the one this was built from.
std::string fixture(const char* name) {
  const char* env = std::getenv("M3_SOURCE_DIR");
  return (fs::path(env && *env ? env : M3_SOURCE_DIR) / "tests/golden/fixtures" / name).string();
}

template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer<uint8_t>& b, size_t n) {
  std::vector<T> h(n);
  M3_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

TEST(GpuFp8Load, Mxfp8SlotsStreamAsFp8EqualToTheCpuConversion) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixture("tiny_sparse_mxfp8");
  const M3Config c = load_m3_config(dir + "/config.json");
  const SafeTensors st = SafeTensors::open(dir);
  const std::vector<WeightSlot> plan = weight_plan(c);
  for (Fp8Scale fmt : {Fp8Scale::G32, Fp8Scale::Row128, Fp8Scale::Blk128})
    for (size_t chunk : {size_t(4096), size_t(32) << 20}) {
      SCOPED_TRACE(std::string(fp8_scale_name(fmt)) + " chunk " + std::to_string(chunk));
      struct Bufs {
        cuda::DeviceBuffer<uint8_t> q, s;
        DeviceSlot d;
      };
      std::map<std::string, Bufs> bufs;
      int fp8_slots = 0;
      const SlotBinder bind = [&](const WeightSlot& s) {
        Bufs& b = bufs[s.label()];
        if (!b.d.ptr) {
          if (s.matrix && slot_is_mxfp8(st, s)) {
            const int64_t cols = s.pieces[0].shape.back();
            b.q.grow(size_t(s.numel()));
            b.s.grow(size_t(fp8_scale_count(fmt, s.rows(), cols) * (fmt == Fp8Scale::G32 ? 1 : 4)));
            b.d = DeviceSlot{b.q.get(), false, true, fmt, b.s.get()};
            ++fp8_slots;
          } else {
            b.q.grow(size_t(s.numel()) * 2);
            b.d = DeviceSlot{b.q.get(), true};
          }
        }
        return b.d;
      };
      StreamOptions so;
      so.chunk_bytes = chunk;
      const LoadStats stats = stream_weights_to_device(st, plan, bind, nullptr, so);
      EXPECT_GT(fp8_slots, 10);
      int checked = 0;
      for (const WeightSlot& s : plan) {
        Bufs& b = bufs[s.label()];
        if (!b.d.fp8) continue;
        const int64_t rows = s.rows(), cols = s.pieces[0].shape.back(), scols = (cols + 31) / 32;
        std::vector<uint8_t> q, g;  // the checkpoint's bytes, pieces concatenated along rows
        for (const WeightPiece& p : s.pieces) {
          const std::string name = resolve_name(st, p);
          const TensorRef& t = st.get(name);
          const TensorRef& sc = st.get(name + "_scale_inv");
          q.insert(q.end(), t.data, t.data + t.nbytes);
          g.insert(g.end(), sc.data, sc.data + sc.nbytes);
        }
        ASSERT_EQ(int64_t(g.size()), rows * scols) << s.label();
        const std::vector<uint8_t> dq = to_host<uint8_t>(b.q, q.size());
        if (fmt == Fp8Scale::G32) {
          EXPECT_EQ(dq, q) << s.label();
          EXPECT_EQ(to_host<uint8_t>(b.s, g.size()), g) << s.label();
        } else {
          std::vector<uint8_t> q2(q.size());
          std::vector<float> s2(size_t(fp8_scale_count(fmt, rows, cols)));
          cpu::fp8_requant_from_mx(q.data(), g.data(), rows, cols, fmt, q2.data(), s2.data());
          EXPECT_EQ(dq, q2) << s.label();
          const std::vector<float> ds = to_host<float>(b.s, s2.size());
          EXPECT_EQ(std::memcmp(ds.data(), s2.data(), s2.size() * 4), 0) << s.label();
        }
        ++checked;
      }
      std::printf("[gpu-fp8-load] %s chunk %zu: %d FP8 slots equal to the CPU conversion, %.2f MB written, %.3f s\n",
                  fp8_scale_name(fmt), chunk, checked, stats.bytes_written / 1e6, stats.seconds);
    }
}

TEST(GpuFp8Load, Fp8StorageOfANonFp8TensorIsRefused) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixture("tiny_sparse_f32");
  const M3Config c = load_m3_config(dir + "/config.json");
  const SafeTensors st = SafeTensors::open(dir);
  std::vector<WeightSlot> plan;
  for (const WeightSlot& s : weight_plan(c))
    if (s.matrix && s.kind == SlotKind::Wo) plan.push_back(s);
  ASSERT_FALSE(plan.empty());
  EXPECT_FALSE(slot_is_mxfp8(st, plan[0]));
  cuda::DeviceBuffer<uint8_t> q(size_t(plan[0].numel())), sc(size_t(plan[0].numel()));
  const SlotBinder bind = [&](const WeightSlot&) { return DeviceSlot{q.get(), false, true, Fp8Scale::G32, sc.get()}; };
  EXPECT_THROW(stream_weights_to_device(st, {plan[0]}, bind, nullptr), Error);
}

}  // namespace
}  // namespace m3
