// The vision tower's two rotary variants (model/vision_model.h VitRope; docs/MEDIA.md "Rotary variants") on the CPU:
// the official (vLLM `_get_3d_rope_embed`) 3D RoPE against a re-implementation written here from the specification
// (head dim 80: dims 0..77 rotated as NeoX pairs (i, i + 39), 39 frequencies = 13 t | 13 h | 13 w, each
// 10000^(−2k/26), dims 78 and 79 untouched), with positions derived here from the merge-window order; the layout
// (t restarting per ≤ 4-group video segment under official only, one attention sequence per image / segment); the
// whole tower's segment scope; and how the variant is chosen (config.json vit_rope, the load override, the default).
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "base/error.h"
#include "model/vision_model.h"

namespace fs = std::filesystem;

namespace m3 {
namespace {

constexpr int kHd = 80;

struct Pos {
  std::vector<int32_t> t, h, w;
};

// Positions of an item's rows straight from the merge-window order (rows: temporal group, then 2×2 window
// row-major over the (gh/2) × (gw/2) windows, then the window's four patches row-major). `restart`: t counts from 0
// again every `seg` groups (the official variant's per-segment t).
Pos spec_positions(std::array<int, 3> g, bool restart, int seg = 4) {
  Pos p;
  const int64_t per_group = int64_t(g[1]) * g[2];
  for (int64_t r = 0; r < g[0] * per_group; ++r) {
    const int ti = int(r / per_group), q = int(r % per_group), win = q / 4, in = q % 4;
    const int wins_per_row = g[2] / 2;
    p.t.push_back(restart ? ti % seg : ti);
    p.h.push_back(2 * (win / wins_per_row) + in / 2);
    p.w.push_back(2 * (win % wins_per_row) + in % 2);
  }
  return p;
}

// The official RoPE of the specification at head dim 80, in double: x [T, H, 80] in place.
void spec_rope_official_80(std::vector<float>& x, int64_t T, int64_t H, const Pos& p, double theta) {
  for (int64_t r = 0; r < T; ++r) {
    double ang[39];
    for (int k = 0; k < 13; ++k) {
      const double inv = std::pow(theta, -2.0 * k / 26.0);
      ang[k] = p.t[size_t(r)] * inv;
      ang[13 + k] = p.h[size_t(r)] * inv;
      ang[26 + k] = p.w[size_t(r)] * inv;
    }
    for (int64_t h = 0; h < H; ++h) {
      float* v = &x[size_t((r * H + h) * kHd)];
      for (int i = 0; i < 39; ++i) {
        const double a = v[i], b = v[i + 39];
        v[i] = float(a * std::cos(ang[i]) - b * std::sin(ang[i]));
        v[i + 39] = float(b * std::cos(ang[i]) + a * std::sin(ang[i]));
      }
      // v[78], v[79]: not rotated.
    }
  }
}

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// max over rows of max|a − b| / max|b| (rows of `cols`).
double row_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t cols) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t r = 0; r * size_t(cols) < a.size(); ++r) {
    double err = 0, ref = 1e-30;
    for (size_t i = r * size_t(cols); i < (r + 1) * size_t(cols); ++i) {
      err = std::max(err, double(std::fabs(a[i] - b[i])));
      ref = std::max(ref, double(std::fabs(b[i])));
    }
    worst = std::max(worst, err / ref);
  }
  return worst;
}

VisionConfig small_config(VitRope rope) {
  VisionConfig c;
  c.hidden_size = 2 * kHd, c.num_heads = 2, c.intermediate_size = 64, c.num_layers = 2;
  c.projector_hidden_size = 32, c.text_hidden_size = 16;
  c.rope = rope;
  c.validate();
  return c;
}

VisionWeights random_weights(const VisionConfig& c, uint32_t seed) {
  const size_t D = size_t(c.hidden_size), I = size_t(c.intermediate_size), P = size_t(c.projector_hidden_size),
               Ht = size_t(c.text_hidden_size), K = size_t(c.patch_dim());
  uint32_t s = seed;
  auto mat = [&](size_t rows, size_t cols) { return random_vec(rows * cols, ++s, 1.f / std::sqrt(float(cols))); };
  auto ln = [&](size_t n) {
    auto v = random_vec(n, ++s, 0.2f);
    for (auto& x : v) x += 1.f;
    return v;
  };
  auto bias = [&](size_t n) { return random_vec(n, ++s, 0.05f); };
  VisionWeights w;
  // Pixels are ~N(0, 1) over 1176 values: a larger patch embed keeps q·k far from uniform softmax.
  w.patch_embed = random_vec(D * K, ++s, 0.2f);
  w.pre_ln_w = ln(D), w.pre_ln_b = bias(D);
  for (int l = 0; l < c.num_layers; ++l) {
    VisionLayerWeights L;
    L.ln1_w = ln(D), L.ln1_b = bias(D), L.ln2_w = ln(D), L.ln2_b = bias(D);
    L.wqkv = mat(3 * D, D);
    for (size_t i = 0; i < 2 * D * D; ++i) L.wqkv[i] *= 4.f;  // sharp attention: positions matter
    L.bqkv = bias(3 * D), L.wo = mat(D, D), L.bo = bias(D);
    L.fc1 = mat(I, D), L.fc1_b = bias(I), L.fc2 = mat(D, I), L.fc2_b = bias(D);
    w.layers.push_back(std::move(L));
  }
  w.proj1 = mat(P, D), w.proj1_b = bias(P), w.proj2 = mat(Ht, P), w.proj2_b = bias(Ht);
  w.merge1 = mat(P, 4 * Ht), w.merge1_b = bias(P), w.merge2 = mat(Ht, P), w.merge2_b = bias(Ht);
  return w;
}

// The official rotary op against the specification: an image (t = 0), a video of 10 temporal groups (t restarting
// at 0, 4, 8), a non-square grid 1×2×58 (h < 2, w up to 57) and a tall 1×40×4 one; dims 78 and 79 bit-identical.
TEST(VisionRopeOfficial, MatchesTheSpecificationAtHeadDim80) {
  const int H = 3;
  const VisionConfig c = small_config(VitRope::kOfficial);
  for (std::array<int, 3> g : {std::array<int, 3>{1, 6, 10}, std::array<int, 3>{10, 4, 6},
                               std::array<int, 3>{1, 2, 58}, std::array<int, 3>{1, 40, 4}}) {
    const std::string name = std::to_string(g[0]) + "x" + std::to_string(g[1]) + "x" + std::to_string(g[2]);
    const VisionModel::Layout lay = VisionModel::layout(c, std::span<const std::array<int, 3>>(&g, 1));
    const Pos want = spec_positions(g, true);
    ASSERT_EQ(lay.t, want.t) << name;
    ASSERT_EQ(lay.h, want.h) << name;
    ASSERT_EQ(lay.w, want.w) << name;
    const int64_t T = int64_t(lay.t.size());
    const std::vector<float> x0 = random_vec(size_t(T * H * kHd), 11u + uint32_t(T));
    std::vector<float> got = x0, ref = x0;
    cpu::vision_rope_official(got.data(), T, H, kHd, lay.t.data(), lay.h.data(), lay.w.data(), 10000.0);
    spec_rope_official_80(ref, T, H, want, 10000.0);
    const double e = row_rel(got, ref, kHd);
    EXPECT_LT(e, 2e-5) << name;
    for (int64_t r = 0; r < T * H; ++r)
      for (int d : {78, 79})
        ASSERT_EQ(got[size_t(r * kHd + d)], x0[size_t(r * kHd + d)]) << name << " dim " << d << " must pass through";
    // The test can tell the axes apart: h and w swapped (or t not restarting) is far off.
    if (g[1] != g[2]) {
      Pos swapped = want;
      std::swap(swapped.h, swapped.w);
      std::vector<float> bad = x0;
      spec_rope_official_80(bad, T, H, swapped, 10000.0);
      EXPECT_GT(row_rel(got, bad, kHd), 1e-2) << name << ": h/w swapped must differ";
    }
    if (g[0] > 4) {
      std::vector<float> bad = x0;
      spec_rope_official_80(bad, T, H, spec_positions(g, false), 10000.0);
      EXPECT_GT(row_rel(got, bad, kHd), 1e-2) << name << ": t not restarting must differ";
    }
  }
  // A still image's temporal channels (pairs 0..12) have angle 0: those dims are unchanged too.
  const std::array<int, 3> img{1, 2, 4};
  const auto lay = VisionModel::layout(c, std::span<const std::array<int, 3>>(&img, 1));
  std::vector<float> x = random_vec(size_t(8 * kHd), 5), x0 = x;
  cpu::vision_rope_official(x.data(), 8, 1, kHd, lay.t.data(), lay.h.data(), lay.w.data(), 10000.0);
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 13; ++i) {
      EXPECT_EQ(x[size_t(r * kHd + i)], x0[size_t(r * kHd + i)]);
      EXPECT_EQ(x[size_t(r * kHd + i + 39)], x0[size_t(r * kHd + i + 39)]);
    }
}

// The layout of one call: one attention sequence per image, videos cut every 4 temporal groups (both variants);
// t restarts per segment under official only; h and w over the full grid.
TEST(VisionRopeOfficial, LayoutCutsVideosIntoSegmentsOfFourGroups) {
  const std::array<int, 3> grids[] = {{1, 4, 6}, {10, 2, 4}, {4, 2, 2}, {5, 2, 2}};
  for (VitRope rope : {VitRope::kOfficial, VitRope::kHf517}) {
    const VisionModel::Layout lay = VisionModel::layout(small_config(rope), grids);
    EXPECT_EQ(lay.seq, (std::vector<int64_t>{0, 24, 24 + 32, 24 + 64, 24 + 80, 24 + 80 + 16, 120 + 16, 136 + 4}))
        << vit_rope_name(rope);
    Pos want;
    for (const auto& g : grids) {
      const Pos p = spec_positions(g, rope == VitRope::kOfficial);
      want.t.insert(want.t.end(), p.t.begin(), p.t.end());
      want.h.insert(want.h.end(), p.h.begin(), p.h.end());
      want.w.insert(want.w.end(), p.w.begin(), p.w.end());
    }
    EXPECT_EQ(lay.t, want.t) << vit_rope_name(rope);
    EXPECT_EQ(lay.h, want.h);
    EXPECT_EQ(lay.w, want.w);
  }
  VisionConfig one = small_config(VitRope::kOfficial);
  one.segment_max_groups = 0;  // no cut: one sequence per item, t as is
  const VisionModel::Layout lay = VisionModel::layout(one, grids);
  EXPECT_EQ(lay.seq, (std::vector<int64_t>{0, 24, 104, 120, 140}));
  EXPECT_EQ(lay.t[24 + 9 * 8], 9);
}

// The whole tower (head dim 80): a 6-group video equals its first 4 groups and its last 2 encoded as separate
// videos — bit for bit under official (attention per segment, t from 0 in each); under hf517 the second segment keeps
// t = 4, 5, which RoPE, being relative, turns into the same scores up to rounding. One sequence over all 6 groups
// (segment_max_groups 0) differs: the scope is visible. The two variants give different features; an item's result
// does not depend on the batch.
TEST(VisionRopeOfficial, TowerAttendsPerSegmentAndRestartsT) {
  const std::array<int, 3> g6{6, 2, 4}, g4{4, 2, 4}, g2{2, 2, 4}, img{1, 4, 2};
  const int64_t per_group = 8, K = 1176;
  const std::vector<float> px = random_vec(size_t(6 * per_group * K), 3);
  const std::span<const float> all(px), first = all.subspan(0, size_t(4 * per_group * K)),
                                  last = all.subspan(size_t(4 * per_group * K));
  const std::vector<float> px_img = random_vec(size_t(8 * K), 4);
  std::vector<float> official_video;
  for (VitRope rope : {VitRope::kOfficial, VitRope::kHf517}) {
    const VisionConfig c = small_config(rope);
    const VisionModel vm(c, random_weights(c, 17));
    const int64_t Ht = c.text_hidden_size;
    const std::vector<float> video = vm.encode(all, g6);
    ASSERT_EQ(video.size(), size_t(6 * 2 * Ht));
    const std::vector<float> a = vm.encode(first, g4), b = vm.encode(last, g2);
    EXPECT_EQ(std::vector<float>(video.begin(), video.begin() + 8 * Ht), a) << vit_rope_name(rope);
    const std::vector<float> tail(video.begin() + 8 * Ht, video.end());
    if (rope == VitRope::kOfficial) {
      EXPECT_EQ(tail, b) << "official: the second segment is a video of its own";
      official_video = video;
    } else {
      EXPECT_LT(row_rel(tail, b, Ht), 1e-5) << "hf517: t shifted by 4 in the whole segment";
    }
    VisionConfig joint = c;
    joint.segment_max_groups = 0;
    const VisionModel vm_joint(joint, random_weights(joint, 17));
    std::vector<float> separate = a;
    separate.insert(separate.end(), b.begin(), b.end());
    EXPECT_GT(row_rel(vm_joint.encode(all, g6), separate, Ht), 1e-3)
        << vit_rope_name(rope) << ": attention over all groups at once must differ from per segment";
    // Batched with an image, each item's features are its own.
    const VisionModel::Item items[] = {{px_img, img}, {all, g6}};
    const std::vector<float> batch = vm.encode_batch(items);
    std::vector<float> want = vm.encode(px_img, img);
    want.insert(want.end(), video.begin(), video.end());
    EXPECT_EQ(batch, want);
  }
  const VisionConfig hf = small_config(VitRope::kHf517);
  const VisionModel vm_hf(hf, random_weights(hf, 17));
  EXPECT_GT(row_rel(vm_hf.encode(all, g6), official_video, hf.text_hidden_size), 1e-3)
      << "the variant must change the features";
}

// vision_config.vit_rope picks the variant ("official" when absent); the load override wins; a bad name is an
// error; vision_segment_max_frames sets the segment length. The HF-parity fixture pins hf517.
TEST(VisionRopeOfficial, ConfigSelectsTheVariant) {
  const fs::path dir = fs::temp_directory_path() / ("m3_vit_rope_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path cfg = dir / "config.json";
  auto write = [&](const std::string& extra) {
    std::ofstream(cfg) << R"({"projector_hidden_size": 32, "text_config": {"hidden_size": 16},
      "vision_config": {"hidden_size": 160, "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 2)" << extra << "}}";
  };
  write("");
  EXPECT_EQ(load_vision_config(cfg.string()).rope, VitRope::kOfficial);
  EXPECT_EQ(load_vision_config(cfg.string()).segment_max_groups, 4);
  EXPECT_EQ(load_vision_config(cfg.string(), VitRope::kHf517).rope, VitRope::kHf517);
  write(R"(, "vit_rope": "hf517", "vision_segment_max_frames": 2)");
  EXPECT_EQ(load_vision_config(cfg.string()).rope, VitRope::kHf517);
  EXPECT_EQ(load_vision_config(cfg.string()).segment_max_groups, 2);
  EXPECT_EQ(load_vision_config(cfg.string(), VitRope::kOfficial).rope, VitRope::kOfficial);
  write(R"(, "vit_rope": "official")");
  EXPECT_EQ(load_vision_config(cfg.string()).rope, VitRope::kOfficial);
  write(R"(, "vit_rope": "axial")");
  EXPECT_THROW(load_vision_config(cfg.string()), Error);
  EXPECT_THROW(parse_vit_rope("3d"), Error);
  EXPECT_EQ(parse_vit_rope(vit_rope_name(VitRope::kHf517)), VitRope::kHf517);
  EXPECT_EQ(parse_vit_rope(vit_rope_name(VitRope::kOfficial)), VitRope::kOfficial);
  fs::remove_all(dir);
  const fs::path fixture = fs::path(M3_SOURCE_DIR) / "tests/golden/fixtures/tiny_vl/config.json";
  EXPECT_EQ(load_vision_config(fixture.string()).rope, VitRope::kHf517) << "HF-parity fixture: pinned to hf517";
}

}  // namespace
}  // namespace m3
