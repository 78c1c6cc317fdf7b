// The vision tower + projector + 2×2 merge of the CPU reference backend (model/vision_model.h) and the placement of
// its features in the prompt, against HF transformers 5.17 `minimax_m3_vl` on a tiny random VL model
// (tests/golden/fixtures/tiny_vl, written by scripts/oracle/make_vision_golden.py; docs/ORACLE.md §1). Compared:
// every vision stage (patch embed, pre-LN, each encoder layer, per-patch projector, merged embeddings) for image A
// (84×112 → grid 1×6×8) and the merged embeddings of image B (140×56 → 1×10×4), then the logits of a 30-token prompt
// whose 12 slot rows carry image A's features — within the text golden test's 1e-4 row-relative tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>

#include <unistd.h>

#include "base/error.h"
#include "io/safetensors.h"
#include "kv/sequence_kv.h"
#include "model/m3_model.h"
#include "model/vision_model.h"
#include "row_error.h"

namespace fs = std::filesystem;

namespace m3 {
namespace {

fs::path fixture() { return fs::path(M3_SOURCE_DIR) / "tests/golden/fixtures/tiny_vl"; }

std::vector<float> f32(const SafeTensors& st, const std::string& n) { return st.read_f32(n, st.get(n).shape); }

std::vector<int32_t> i32(const SafeTensors& st, const std::string& n) {
  const TensorRef& t = st.get(n);
  std::vector<int32_t> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// Max over rows of max|a − b| / max|b|.
double row_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t cols) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return INFINITY;
  return golden::max_row_rel_error(a, b, cols);
}

std::array<int, 3> grid(const SafeTensors& st, const std::string& n) {
  auto g = i32(st, n);
  return {g[0], g[1], g[2]};
}

TEST(VisionGolden, EveryStageMatchesHfForTwoImageSizes) {
  VisionModel vm = VisionModel::load(fixture().string());
  const VisionConfig& c = vm.config();
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.text_hidden_size, 128);
  SafeTensors gold = SafeTensors::open((fixture() / "golden.safetensors").string());
  VisionTrace tr;
  auto emb = vm.encode(f32(gold, "pixel_values"), grid(gold, "image_grid_thw"), &tr);
  const int64_t D = c.hidden_size, Ht = c.text_hidden_size;
  EXPECT_LT(row_rel(tr.patch_embed, f32(gold, "vision.patch_embed"), D), 1e-5) << "patch embed";
  EXPECT_LT(row_rel(tr.pre_ln, f32(gold, "vision.pre_ln"), D), 1e-5) << "pre_layrnorm";
  for (int l = 0; l < c.num_layers; ++l)
    EXPECT_LT(row_rel(tr.layers[size_t(l)], f32(gold, "vision.layer." + std::to_string(l)), D), 1e-4)
        << "encoder layer " << l;
  EXPECT_LT(row_rel(tr.projected, f32(gold, "vision.projected"), Ht), 1e-4) << "projector";
  const double e = row_rel(emb, f32(gold, "vision.embeds"), Ht);
  EXPECT_LT(e, 1e-4) << "merged embeddings";
  std::printf("[ note ] image A embeddings: max row-relative error %.3g\n", e);

  auto emb_b = vm.encode(f32(gold, "b.pixel_values"), grid(gold, "b.image_grid_thw"));
  EXPECT_EQ(emb_b.size(), size_t(10 * Ht));
  EXPECT_LT(row_rel(emb_b, f32(gold, "b.embeds"), Ht), 1e-4) << "image B (1×10×4) embeddings";
}

TEST(VisionGolden, TwoSizesInOneEncoderCallEqualSeparateCalls) {
  VisionModel vm = VisionModel::load(fixture().string());
  SafeTensors gold = SafeTensors::open((fixture() / "golden.safetensors").string());
  const auto pa = f32(gold, "pixel_values"), pb = f32(gold, "b.pixel_values");
  const auto ga = grid(gold, "image_grid_thw"), gb = grid(gold, "b.image_grid_thw");
  const VisionModel::Item items[] = {{pb, gb}, {pa, ga}, {pb, gb}};
  const auto batch = vm.encode_batch(items);
  auto a = vm.encode(pa, ga), b = vm.encode(pb, gb);
  std::vector<float> want = b;
  want.insert(want.end(), a.begin(), a.end());
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(batch, want) << "block-diagonal batch = one call per item, bit for bit";
  const int64_t Ht = vm.config().text_hidden_size;
  EXPECT_LT(row_rel(std::vector<float>(batch.begin() + 10 * Ht, batch.begin() + 22 * Ht), f32(gold, "vision.embeds"),
                    Ht), 1e-4);
  EXPECT_TRUE(vm.encode_batch({}).empty());
  const VisionModel::Item bad[] = {{std::span<const float>(pa).subspan(1), ga}};
  EXPECT_THROW(vm.encode_batch(bad), Error);
}

TEST(VisionGolden, ImageFeaturesReplaceTheSlotRowsAndLogitsMatchHf) {
  const fs::path dir = fixture();
  M3Model model = M3Model::load(dir.string());
  const M3Config& c = model.config();
  EXPECT_EQ(c.image_token_id, 1000);
  EXPECT_EQ(c.video_token_id, 1001);
  VisionModel vm = VisionModel::load(dir.string());
  SafeTensors gold = SafeTensors::open((dir / "golden.safetensors").string());
  const std::vector<int32_t> ids = i32(gold, "input_ids");
  const std::vector<float> emb = vm.encode(f32(gold, "pixel_values"), grid(gold, "image_grid_thw"));
  const int64_t T = int64_t(ids.size()), V = c.vocab_size;
  ASSERT_EQ(std::count(ids.begin(), ids.end(), c.image_token_id), int64_t(emb.size()) / c.hidden_size);

  auto run = [&](std::span<const float> media, int64_t chunk) {
    KVCache cache(c, int32_t((T + c.sparse_block_size - 1) / c.sparse_block_size));
    SequenceKV seq(cache);
    seq.reserve(T);
    std::vector<float> logits;
    size_t used = 0;
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t len = std::min(chunk, T - s);
      // The chunk's own share of the media rows, in order.
      const size_t n = size_t(std::count(ids.begin() + s, ids.begin() + s + len, c.image_token_id));
      SeqInput in{std::span<const int32_t>(ids.data() + s, size_t(len)), s, seq.pages(), true,
                  media.empty() ? std::span<const float>() : media.subspan(used * c.hidden_size, n * c.hidden_size)};
      used += n;
      auto out = model.forward(std::span<const SeqInput>(&in, 1), cache);
      logits.insert(logits.end(), out[0].begin(), out[0].end());
    }
    return logits;
  };
  const std::vector<float> ref = f32(gold, "logits");
  const std::vector<float> got = run(emb, T);
  const double err = row_rel(got, ref, V);
  EXPECT_LT(err, 1e-4) << "logits with the image";
  std::printf("[ note ] logits with an image: max row-relative error %.3g over %lld positions\n", err,
              static_cast<long long>(T));
  // The image matters: without its features (plain slot embeddings) the logits after the image differ.
  const std::vector<float> plain = run({}, T);
  EXPECT_GT(row_rel(plain, ref, V), 1e-2);
  // Chunked prefill with the image split across chunks gives the same logits bit for bit.
  EXPECT_EQ(run(emb, 7), got);
  // A media row count that does not match the slots is an error, not a silent misplacement.
  KVCache cache(c, 4);
  SequenceKV seq(cache);
  seq.reserve(T);
  SeqInput bad{std::span<const int32_t>(ids), 0, seq.pages(), false,
               std::span<const float>(emb).subspan(0, emb.size() - size_t(c.hidden_size))};
  EXPECT_THROW(model.forward(std::span<const SeqInput>(&bad, 1), cache), Error);
}

// The checkpoint generator's vision weights (tools/checkpoint/make_checkpoint.py --vision-weights, released names,
// F32 patch embedding next to MXFP8 text weights) load and run.
TEST(VisionModel, LoadsTheCheckpointGeneratorsVisionWeights) {
  const fs::path out = fs::temp_directory_path() / ("m3_vision_ckpt_" + std::to_string(::getpid()));
  const std::string cmd = "/usr/bin/python3 " + (fs::path(M3_SOURCE_DIR) / "tools/checkpoint/make_checkpoint.py").string() +
                          " --preset tiny --dtype mxfp8 --vision-weights --seed 3 --out " + out.string() + " >/dev/null";
  if (!fs::exists("/usr/bin/python3") || std::system(cmd.c_str()) != 0) GTEST_SKIP() << "python3 with numpy needed";
  VisionModel vm = VisionModel::load(out.string());
  EXPECT_EQ(vm.config().hidden_size, 48);
  EXPECT_EQ(vm.config().text_hidden_size, 128);
  std::vector<float> px(size_t(16 * 1176));
  for (size_t i = 0; i < px.size(); ++i) px[i] = float(int(i * 2654435761u % 2001) - 1000) / 1000.0f;
  auto e = vm.encode(px, {1, 4, 4});
  ASSERT_EQ(e.size(), size_t(4 * 128));
  double norm = 0;
  for (float v : e) {
    ASSERT_TRUE(std::isfinite(v));
    norm += double(v) * v;
  }
  EXPECT_GT(norm, 0.0);
  M3Model m = M3Model::load(out.string());
  EXPECT_EQ(m.config().image_token_id, 200025);
  fs::remove_all(out);
}

TEST(VisionModel, PatchPositionsFollowTheMergeWindowOrder) {
  std::vector<int32_t> t, h, w;
  VisionModel::patch_positions({2, 2, 4}, 2, t, h, w);
  ASSERT_EQ(t.size(), 16u);
  // window (0,0): (0,0) (0,1) (1,0) (1,1); window (0,1): (0,2) (0,3) (1,2) (1,3); then the next temporal group.
  EXPECT_EQ(h, (std::vector<int32_t>{0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(w, (std::vector<int32_t>{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3}));
  EXPECT_EQ(t[7], 0);
  EXPECT_EQ(t[8], 1);
}

}  // namespace
}  // namespace m3
