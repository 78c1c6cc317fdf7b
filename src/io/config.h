// config.json → typed M3 text-model config. Accepts the released VL layout (text_config +
// sparse_attention_config), a text-only layout (the same keys at top level), and the flat layout that
// HF transformers' save_pretrained writes (index_* keys, layer_types, mlp_layer_types, rope_parameters).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m3 {

enum class AttnKind : uint8_t { Dense, Sparse };  // per layer: full causal GQA or MSA
enum class MlpKind : uint8_t { Dense, MoE };

struct M3Config {
  // Decoder shape.
  int hidden_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;

  // Positions: NeoX rotary on the first rotary_dim channels of every head.
  double rope_theta = 5e6;
  int rotary_dim = 0;

  // SwiGLU-OAI.
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;

  // MLPs.
  int dense_intermediate_size = 0;   // dense MLP layers
  int moe_intermediate_size = 0;     // per routed expert
  int shared_intermediate_size = 0;  // the shared expert (0 = none)
  int num_experts = 0;
  int num_experts_per_tok = 0;
  float routed_scaling_factor = 1.0f;
  bool use_routing_bias = true;

  // MSA.
  int index_num_heads = 0;  // = num_kv_heads in M3
  int index_head_dim = 0;
  int sparse_block_size = 0;  // = KV page size
  int sparse_topk_blocks = 0;  // blocks per (token, KV head), local block included

  std::vector<AttnKind> attn_kinds;  // [num_layers]
  std::vector<MlpKind> mlp_kinds;    // [num_layers]

  // Special tokens (from the top-level or text config when present; -1 when absent).
  int bos_token_id = -1;
  int eos_token_id = -1;
  // Image / video feature slots (top-level image_token_index / video_token_index, or *_token_id; -1 when absent):
  // their embedding rows are replaced by vision features (SeqInput::media_embeds; docs/M3_MODEL.md §5.6).
  int image_token_id = -1;
  int video_token_id = -1;

  int num_sparse_layers() const;
  int q_width() const { return num_q_heads * head_dim; }
  int kv_width() const { return num_kv_heads * head_dim; }

  // Throws m3::Error naming the offending key when the config is inconsistent.
  void validate() const;
};

// Parse a config.json text; `source` names the file in error messages.
M3Config parse_m3_config(const std::string& json_text, const std::string& source = "config.json");
M3Config load_m3_config(const std::string& path);

// The config's first `num_layers` layers plus the head (embedding, final norm, LM head): the dense/sparse attention
// and dense/MoE MLP kinds of layers 0..num_layers-1 are kept as they are, so M3's real widths can run on one GPU
// (`--num-layers`). Throws m3::Error for num_layers < 1 or > cfg.num_layers.
M3Config truncate_layers(const M3Config& cfg, int num_layers);

}  // namespace m3
