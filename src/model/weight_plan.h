// The weights a config needs, as a list of slots (issue 9 item 5): one slot per tensor the executors store (the CPU's
// M3Weights vectors, the CUDA executor's device buffers), each made of checkpoint tensors concatenated along rows
// (wqkv = q, k, v; gate_up = gate, up). M3Weights::load (host fp32), the streaming CUDA loader
// (model/cuda_weight_loader.h) and the dummy weights all walk this one list, so names, shapes and concatenation
// order are written down once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "model/m3_weights.h"
#include "model/rank_share.h"

namespace m3 {

enum class SlotKind : uint8_t {
  Embed, FinalNorm, LmHead,
  InputNorm, PostAttnNorm, Wqkv, Wo, QNorm, KNorm, WIndexQk, IndexQNorm, IndexKNorm,
  MlpGateUp, MlpDown, Router, RouterBias, ExpertGateUp, ExpertDown, SharedGateUp, SharedDown,
};

// One checkpoint tensor: its accepted spellings (released vs HF save_pretrained; the first present wins) and shape.
struct WeightPiece {
  std::vector<std::string> names;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

struct WeightSlot {
  SlotKind kind = SlotKind::Embed;
  int layer = -1;   // -1: embedding / final norm / LM head
  int expert = -1;  // routed experts only
  // Matrices are stored in the executor's compute dtype (bf16 or fp32); norms, the router and its bias stay fp32.
  bool matrix = false;
  // LM head with tie_word_embeddings: when the checkpoint has no lm_head.weight it is a copy of the embedding.
  bool may_tie_to_embed = false;
  std::vector<WeightPiece> pieces;  // concatenated along the first dim, in this order
  float dummy_scale = 0.f;         // dummy weights are uniform in [-dummy_scale, dummy_scale)

  int64_t numel() const;
  int64_t rows() const;  // sum of the pieces' first dims
  std::string label() const;  // e.g. "layers.3.wqkv", "layers.4.experts.17.gate_up"
  uint64_t stream_id() const;  // the dummy fill's counter-hash stream: (kind, layer, expert), not the list position
};

// Every slot of `c`, in load order: embed, final norm, LM head, then each layer's slots.
std::vector<WeightSlot> weight_plan(const M3Config& c);

// Total elements and, for a compute dtype of `matrix_bytes` per element, device bytes of the plan.
int64_t plan_bytes(const std::vector<WeightSlot>& plan, int matrix_bytes);

// The name of `p` in `st`: the first accepted spelling present, else the first (st.get() then reports it missing).
std::string resolve_name(const SafeTensors& st, const WeightPiece& p);

// Where a slot lives in the host weights (resized as needed: layers and experts must exist).
std::vector<float>& host_slot(M3Weights& w, const WeightSlot& s);

// The CPU twin of the device dummy fill: the fp32 values of slot `s` for `seed` (base/counter_hash.h).
std::vector<float> dummy_slot_values(const WeightSlot& s, uint64_t seed);
// A whole model of dummy weights on the host (tied LM head = the embedding, as the device fill does); with a share,
// only that rank's part, each value equal to the same element of the whole model's dummy weights.
M3Weights dummy_weights(const M3Config& c, uint64_t seed, const RankShare& share = {});

// --- Sharded plans (issue 17 item 3; model/rank_share.h) ---

// The part of one checkpoint tensor a rank reads: rows [row0, row1) × columns [col0, col1) of the piece viewed as
// [rows, last dim] (a 1-D piece is one row).
struct PieceBlock {
  int64_t row0 = 0, row1 = 0, col0 = 0, col1 = 0;
  int64_t numel() const { return (row1 - row0) * (col1 - col0); }
};

// A slot a rank holds: the full slot (names, full shapes, dummy stream) and, per piece, the block it reads. The rank
// stores the blocks concatenated along rows, each row-major: e.g. wqkv under TP = its q rows, k rows, v rows;
// wo under TP = [H, its q-head columns].
struct SlotShare {
  WeightSlot slot;
  std::vector<PieceBlock> blocks;  // one per slot.pieces
  int64_t numel() const;
  bool whole() const;  // every block is its whole piece
};

// The slots rank `share` holds, in weight_plan order; slots it does not hold (another rank's routed experts) are
// absent. Throws when the share does not fit `c` (RankShare::validate).
std::vector<SlotShare> rank_weight_plan(const M3Config& c, const RankShare& share);

// Bytes of a share's weights in a storage model: Fp32 = the CPU's host arrays; Bf16 = matrices bf16, norms / router
// / bias fp32 (the CUDA executor's bf16 storage); Fp8 = the MXFP8 matrices as the checkpoint holds them (e4m3 plus
// one UE8M0 byte per 32 elements of a row: attention, index, dense MLP, shared and routed experts), embedding and
// LM head bf16, the rest fp32 (docs/FP8.md); Fp8Bf16Experts = Fp8 with the routed experts bf16 (what `--dtype fp8`
// built before FP8 routed experts, docs/FP8.md §9, and still builds for a layer the grouped MoE does not take).
enum class WeightBytes { Fp32, Bf16, Fp8, Fp8Bf16Experts };
int64_t share_bytes(const std::vector<SlotShare>& plan, WeightBytes model);

}  // namespace m3
