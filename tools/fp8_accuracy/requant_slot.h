// The executor's FP8 weights on the CPU: one weight slot's MXFP8 pieces (codes + UE8M0 scales from a checkpoint)
// requantised to `fmt` (cpu::fp8_requant_from_mx, what the CUDA loader does) and dequantised to fp32, so the CPU
// model computes with exactly the values the FP8 kernels multiply. Shared by fp8_accuracy and fp8_eval_text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/fp8.h"
#include "base/fp8_format.h"
#include "io/safetensors.h"
#include "model/weight_plan.h"

namespace m3::fp8_tools {

// True when every piece of the slot is an F8_E4M3 tensor with a `_scale_inv` beside it.
inline bool slot_pieces_mxfp8(const SafeTensors& st, const WeightSlot& s) {
  for (const WeightPiece& p : s.pieces) {
    const std::string name = resolve_name(st, p);
    if (!st.has(name) || !st.has(name + "_scale_inv") || st.get(name).dtype != DType::F8_E4M3) return false;
  }
  return !s.pieces.empty();
}

// The slot's values [rows, cols] after MXFP8 → fmt requantisation (pieces concatenated along rows).
inline std::vector<float> requantised_slot(const SafeTensors& st, const WeightSlot& s, Fp8Scale fmt) {
  std::vector<uint8_t> q, g;
  for (const WeightPiece& p : s.pieces) {
    const std::string name = resolve_name(st, p);
    const TensorRef& t = st.get(name);
    const TensorRef& sc = st.get(name + "_scale_inv");
    q.insert(q.end(), t.data, t.data + t.nbytes);
    g.insert(g.end(), sc.data, sc.data + sc.nbytes);
  }
  const int64_t rows = s.rows(), cols = s.pieces[0].shape.back();
  std::vector<uint8_t> q2(q.size());
  std::vector<float> s2(size_t(fp8_scale_count(fmt, rows, cols))), out(size_t(rows * cols));
  cpu::fp8_requant_from_mx(q.data(), g.data(), rows, cols, fmt, q2.data(), s2.data());
  cpu::fp8_dequant(q2.data(), s2.data(), fmt, rows, cols, out.data());
  return out;
}

}  // namespace m3::fp8_tools
