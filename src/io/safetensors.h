// safetensors reading (mmap, single file or sharded via model.safetensors.index.json) and writing.
// Tensor names are normalised on load so the model sees one spelling:
//   "language_model.model.layers.0.x" → "model.layers.0.x", "language_model.lm_head.weight" → "lm_head.weight",
//   "model.language_model.…" (some re-exports) likewise; other prefixes (vision_tower., multi_modal_projector.,
//   patch_merge_mlp.) are kept as they are.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace m3 {

struct TensorRef {
  std::string name;       // normalised name
  std::string file;       // file it lives in (for error messages)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mmap; valid while the SafeTensors object lives
  size_t nbytes = 0;
  int64_t numel() const;
};

class SafeTensors {
 public:
  // Opens `path`: a directory (model.safetensors.index.json or model.safetensors or every *.safetensors
  // in it) or a single .safetensors file. Throws m3::Error naming the file on any malformed input
  // (bad header length, invalid JSON, unknown dtype, offsets outside the file, overlapping data).
  static SafeTensors open(const std::string& path);

  SafeTensors(SafeTensors&&) noexcept;
  SafeTensors& operator=(SafeTensors&&) noexcept;
  ~SafeTensors();

  bool has(const std::string& name) const;
  // Throws m3::Error("missing tensor <name> in <dir>") when absent.
  const TensorRef& get(const std::string& name) const;
  std::vector<std::string> names() const;

  // Reads a tensor as fp32 and checks its shape, naming tensor and file on mismatch. BF16/F16/F32/F64
  // convert; F8_E4M3 requires the MXFP8 companion "<name minus .weight>.weight_scale_inv" (U8, one UE8M0
  // byte per 32 consecutive elements of the last dim) and dequantises w·2^(s−127).
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // The block rows [row0, row1) × columns [col0, col1) of a tensor viewed as [rows, last dim] (a sharded load,
  // model/rank_share.h): fp32, row-major [row1 − row0, col1 − col0]. Only those bytes (and, for MXFP8, their
  // scale bytes) of the mmap are touched. FP8 slices need col0 % 32 == 0 (whole scale blocks).
  std::vector<float> read_f32_block(const std::string& name, const std::vector<int64_t>& expected_shape, int64_t row0,
                                    int64_t row1, int64_t col0, int64_t col1) const;
  // Bytes of tensor data (values and FP8 scales) read by read_f32 / read_f32_block since open: what a sharded load
  // touched, for the tests that a rank never reads another rank's tensors.
  int64_t bytes_read() const { return bytes_read_; }

  struct Mapping;  // one mmap'd file

 private:
  SafeTensors();
  std::vector<std::unique_ptr<Mapping>> maps_;
  std::map<std::string, TensorRef> tensors_;
  std::string root_;
  mutable int64_t bytes_read_ = 0;
};

std::string normalise_tensor_name(const std::string& raw);

// Writer: accumulates tensors, then writes one safetensors file (header sorted by name, 8-byte aligned).
class SafeTensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
  void write(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace m3
