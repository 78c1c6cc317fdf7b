// The MiniMax-M3 vision tower, projector and 2×2 merge on the CPU reference backend (issue 12 item 4;
// docs/M3_MODEL.md §5.4–5.5, docs/VISION.md): pixel rows from the media gateway ([R, 1176], merge-window order,
// src/media/image.h) → one LLM-width embedding per 2×2 window ([R/4, text hidden]) that replaces a slot token's row
// (SeqInput::media_embeds). Matched to HF transformers 5.17 `minimax_m3_vl` with VitRope::kHf517
// (tests/golden/vision_golden_test.cpp); VitRope::kOfficial is the specification's vLLM variant.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace m3 {

// Which rotary the ViT uses (docs/MEDIA.md "Rotary variants": the two references disagree). Chosen by
// vision_config.vit_rope in config.json ("official" | "hf517"; absent: official) or `serve --vit-rope`.
enum class VitRope {
  kHf517,     // HF 5.17: D/4 frequencies over (temporal group, patch row), all D dims, rotate-half, in bf16 in HF
  kOfficial,  // vLLM / official _get_3d_rope_embed: D/6 frequencies each over (t, h, w), first 6·(D/6) dims, NeoX
};
// "official" / "hf517" (anything else throws m3::Error) and back.
VitRope parse_vit_rope(std::string_view name);
const char* vit_rope_name(VitRope r);

struct VisionConfig {
  int hidden_size = 0;        // ViT width (1280 in M3)
  int intermediate_size = 0;  // ViT MLP (5120)
  int num_layers = 0;         // 32
  int num_heads = 0;          // 16
  int patch_size = 14;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int num_channels = 3;
  float layer_norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  int projector_hidden_size = 0;  // width inside both projector MLPs (6144)
  int text_hidden_size = 0;       // output width (6144)
  VitRope rope = VitRope::kOfficial;
  // A video's attention sequences: segments of at most this many temporal groups (vision_segment_max_frames, 4 in
  // M3; docs/MEDIA.md "Rotary variants"); 0: one sequence per item. Images are one sequence each.
  int segment_max_groups = 4;

  int head_dim() const { return hidden_size / num_heads; }
  int patch_dim() const { return num_channels * temporal_patch_size * patch_size * patch_size; }  // 1176
  void validate() const;
};

// From a model directory's config.json (vision_config + projector_hidden_size + text_config.hidden_size). Throws
// m3::Error when the config has no vision tower or it is inconsistent. `rope`, when set, overrides vit_rope.
VisionConfig load_vision_config(const std::string& config_json_path, std::optional<VitRope> rope = std::nullopt);

struct VisionLayerWeights {
  std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
  std::vector<float> wqkv, bqkv;  // [3·D, D], [3·D]: q, k, v stacked
  std::vector<float> wo, bo;      // [D, D]
  std::vector<float> fc1, fc1_b, fc2, fc2_b;
};

struct VisionWeights {
  std::vector<float> patch_embed;  // [D, 1176] (conv weight flattened (c, t, ky, kx))
  std::vector<float> pre_ln_w, pre_ln_b;
  std::vector<VisionLayerWeights> layers;
  std::vector<float> proj1, proj1_b, proj2, proj2_b;    // per patch: D → P → text hidden
  std::vector<float> merge1, merge1_b, merge2, merge2_b;  // per window: 4·text hidden → P → text hidden
};

// Accepts the released names (vision_tower.vision_model.…, patch_merge_mlp.…), HF save_pretrained's spelling
// (…encoder.layers.N.block_sparse_moe.fc1) and HF module names (model.vision_tower.layers.N.mlp.fc1,
// embeddings.proj, multi_modal_projector.merge_linear_N).
VisionWeights load_vision_weights(const SafeTensors& st, const VisionConfig& cfg);

// Optional per-stage outputs (for the golden test).
struct VisionTrace {
  std::vector<float> patch_embed, pre_ln, projected;  // [R, D], [R, D], [R, text hidden]
  std::vector<std::vector<float>> layers;             // [R, D] after each encoder layer
};

class VisionModel {
 public:
  VisionModel(VisionConfig cfg, VisionWeights w) : cfg_(std::move(cfg)), w_(std::move(w)) {}
  static VisionModel load(const std::string& model_dir, std::optional<VitRope> rope = std::nullopt);

  const VisionConfig& config() const { return cfg_; }

  // One image or video: pixel rows [R, 1176] with grid (t, gh, gw), R = t·gh·gw, rows in merge-window order.
  // Attention spans the item's own patches (one sequence per item, as HF does for one item per call), a video's
  // cut into segments of ≤ segment_max_groups temporal groups (vLLM's scope). Returns [R/4, text hidden].
  std::vector<float> encode(std::span<const float> pixels, std::array<int, 3> grid_thw,
                            VisionTrace* trace = nullptr) const;

  struct Item {
    std::span<const float> pixels;
    std::array<int, 3> grid_thw;
  };
  // Several items of any sizes in one call: every matmul, norm and MLP runs over all rows at once; attention is
  // block-diagonal (each image, each ≤ segment_max_groups-group video segment, attends to its own patches only, like
  // vLLM — HF 5.17 would join the items of one call into one sequence, docs/MEDIA.md). Each result equals encode()
  // of that item alone, bit for bit.
  // Returns the items' [R_i/4, text hidden] blocks concatenated, in order. Trace (optional) covers all rows.
  std::vector<float> encode_batch(std::span<const Item> items, VisionTrace* trace = nullptr) const;

  // Rotary positions of each row (temporal group, patch row, patch column), merge-window order.
  static void patch_positions(std::array<int, 3> grid_thw, int merge, std::vector<int32_t>& t,
                              std::vector<int32_t>& h, std::vector<int32_t>& w);

  // The rows of one encoder call over these grids: each row's rotary positions and the attention sequences.
  struct Layout {
    std::vector<int32_t> t, h, w;  // per row, merge-window order; t as the variant wants it (below)
    std::vector<int64_t> seq;      // first row of each attention sequence, then the total row count
  };
  // One sequence per image; a video is cut into segments of ≤ c.segment_max_groups temporal groups (rows are
  // t-major, so a segment is a contiguous row range). kOfficial: t restarts at 0 in each segment; kHf517: t is the
  // group index within the item (HF's position; HF itself would attend over all groups at once). h, w: patch row
  // and column over the item's full grid. Grids are not checked here.
  static Layout layout(const VisionConfig& c, std::span<const std::array<int, 3>> grids);

 private:
  VisionConfig cfg_;
  VisionWeights w_;
};

}  // namespace m3
