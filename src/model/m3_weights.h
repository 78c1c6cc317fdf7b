// M3 text-model weights as fp32 arrays (CPU reference). Loaded from safetensors with names normalised by the
// reader ("model.layers.N…", "lm_head.weight"); BF16/F16/F32 convert, MXFP8 dequantises at load.
#pragma once

#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/rank_share.h"

namespace m3 {

struct MlpWeights {        // SwiGLU-OAI MLP; gate_up is [2·I, H] = gate rows then up rows, down is [H, I]
  std::vector<float> gate_up, down;
  int intermediate = 0;
};

struct LayerWeights {
  std::vector<float> input_norm, post_attn_norm;  // [H]
  std::vector<float> wqkv;                        // [Hq·D + 2·Hkv·D, H]: q rows, k rows, v rows
  std::vector<float> wo;                          // [H, Hq·D]
  std::vector<float> q_norm, k_norm;              // [D]
  // MSA index branch (sparse layers): [Hidx·Di + Di, H] = index_q rows then index_k rows
  std::vector<float> w_index_qk, index_q_norm, index_k_norm;
  // FFN: dense MLP, or MoE (router [E, H] fp32, correction bias [E], experts, shared expert)
  MlpWeights mlp;
  std::vector<float> router, router_bias;
  std::vector<MlpWeights> experts;
  MlpWeights shared;
};

struct M3Weights {
  std::vector<float> embed;    // [V, H]
  std::vector<float> final_norm;
  std::vector<float> lm_head;  // [V, H]
  std::vector<LayerWeights> layers;

  // The part of the model these arrays hold (model/rank_share.h): the whole model unless loaded for a rank. A
  // rank's arrays hold only its blocks; another rank's routed experts stay empty.
  RankShare share;

  // Throws m3::Error naming the tensor and file when a tensor is missing or mis-shaped. With a share, reads only the
  // rank's tensors and rows (model/weight_plan.h rank_weight_plan): tensors of other ranks' experts need not exist
  // in `st`, and the bytes of those that do are never read (SafeTensors::bytes_read).
  static M3Weights load(const M3Config& cfg, const SafeTensors& st, const RankShare& share = {});
  // Host bytes of every array (fp32).
  int64_t bytes() const;
  // The layer structure of a config with every tensor empty: one LayerWeights per layer, each dense MLP / expert /
  // shared expert with its intermediate size (the tensors are filled by load() or dummy_weights()).
  static M3Weights skeleton(const M3Config& cfg);
};

}  // namespace m3
