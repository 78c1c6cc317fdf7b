#include "model/vision_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "base/error.h"

namespace m3 {

namespace {

using json = nlohmann::json;

int get_int(const json& j, const char* key, int fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

// Released / save_pretrained prefix first, then HF module names with and without "model.".
std::vector<std::string> tower_prefixes() {
  return {"vision_tower.vision_model.", "model.vision_tower.", "vision_tower."};
}

std::vector<float> read(const SafeTensors& st, const std::vector<std::string>& suffixes,
                        const std::vector<std::string>& prefixes, const std::vector<int64_t>& shape) {
  for (const auto& p : prefixes)
    for (const auto& s : suffixes)
      if (st.has(p + s)) return st.read_f32(p + s, shape);
  fail("missing vision tensor {}{} (or its other spellings)", prefixes.front(), suffixes.front());
}

}  // namespace

VitRope parse_vit_rope(std::string_view name) {
  if (name == "official") return VitRope::kOfficial;
  if (name == "hf517") return VitRope::kHf517;
  fail("vit_rope '{}' is not one of official, hf517", name);
}

const char* vit_rope_name(VitRope r) { return r == VitRope::kHf517 ? "hf517" : "official"; }

void VisionConfig::validate() const {
  M3_CHECK(hidden_size > 0 && num_heads > 0 && hidden_size % num_heads == 0,
           "vision_config: hidden_size {} must be a positive multiple of num_attention_heads {}", hidden_size,
           num_heads);
  M3_CHECK(head_dim() % 4 == 0, "vision_config: head dim {} must be a multiple of 4 (axial RoPE)", head_dim());
  M3_CHECK(rope != VitRope::kOfficial || head_dim() >= 6, "vision_config: head dim {} is too small for the 3D RoPE",
           head_dim());
  M3_CHECK(segment_max_groups >= 0, "vision_config: vision_segment_max_frames {} is negative", segment_max_groups);
  M3_CHECK(num_layers >= 0 && intermediate_size > 0, "vision_config: bad layer count / intermediate_size");
  M3_CHECK(merge_size == 2, "vision_config: spatial_merge_size {} is not supported (M3 uses 2)", merge_size);
  M3_CHECK(projector_hidden_size > 0 && text_hidden_size > 0, "config: projector_hidden_size / text hidden missing");
}

VisionConfig load_vision_config(const std::string& path, std::optional<VitRope> rope) {
  std::ifstream f(path, std::ios::binary);
  M3_CHECK(f.good(), "cannot open config file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json root;
  try {
    root = json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  auto vit = root.find("vision_config");
  M3_CHECK(vit != root.end() && vit->is_object(), "{}: no vision_config (not a vision-language checkpoint)", path);
  const json& v = *vit;
  VisionConfig c;
  c.hidden_size = get_int(v, "hidden_size", 0);
  c.intermediate_size = get_int(v, "intermediate_size", 0);
  c.num_layers = get_int(v, "num_hidden_layers", 0);
  c.num_heads = get_int(v, "num_attention_heads", 0);
  c.patch_size = get_int(v, "patch_size", 14);
  c.num_channels = get_int(v, "num_channels", 3);
  c.temporal_patch_size = get_int(v, "temporal_patch_size", get_int(root, "temporal_patch_size", 2));
  c.merge_size = get_int(v, "spatial_merge_size", get_int(root, "spatial_merge_size", 2));
  if (auto e = v.find("layer_norm_eps"); e != v.end() && e->is_number()) c.layer_norm_eps = e->get<float>();
  if (auto r = v.find("rope_theta"); r != v.end() && r->is_number()) c.rope_theta = r->get<double>();
  if (auto rp = v.find("rope_parameters"); rp != v.end() && rp->is_object() && rp->contains("rope_theta"))
    c.rope_theta = (*rp)["rope_theta"].get<double>();
  // The rotary variant: vit_rope in vision_config (or at the top level), else the serving default (official).
  for (const json* j : std::array<const json*, 2>{&root, &v})
    if (auto r = j->find("vit_rope"); r != j->end()) {
      M3_CHECK(r->is_string(), "{}: vit_rope must be a string (official or hf517)", path);
      try {
        c.rope = parse_vit_rope(r->get<std::string>());
      } catch (const Error& e) {
        fail("{}: {}", path, e.what());
      }
    }
  if (rope) c.rope = *rope;
  // Read as temporal groups per segment, as the specification states it (docs/MEDIA.md "Rotary variants").
  c.segment_max_groups = get_int(v, "vision_segment_max_frames", get_int(root, "vision_segment_max_frames", 4));
  if (auto act = v.find("hidden_act"); act != v.end() && act->is_string())
    M3_CHECK(act->get<std::string>() == "gelu", "{}: vision hidden_act '{}' is not supported (M3 uses exact gelu)",
             path, act->get<std::string>());
  c.projector_hidden_size = get_int(root, "projector_hidden_size", 0);
  if (auto t = root.find("text_config"); t != root.end() && t->is_object())
    c.text_hidden_size = get_int(*t, "hidden_size", 0);
  if (c.text_hidden_size == 0) c.text_hidden_size = get_int(root, "hidden_size", 0);
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  return c;
}

VisionWeights load_vision_weights(const SafeTensors& st, const VisionConfig& c) {
  const int64_t D = c.hidden_size, I = c.intermediate_size, P = c.projector_hidden_size, Ht = c.text_hidden_size;
  const auto tp = tower_prefixes();
  VisionWeights w;
  w.patch_embed = read(st, {"embeddings.patch_embedding.weight", "embeddings.proj.weight"}, tp,
                       {D, c.num_channels, c.temporal_patch_size, c.patch_size, c.patch_size});
  w.pre_ln_w = read(st, {"pre_layrnorm.weight"}, tp, {D});
  w.pre_ln_b = read(st, {"pre_layrnorm.bias"}, tp, {D});
  for (int l = 0; l < c.num_layers; ++l) {
    std::vector<std::string> lp;
    for (const auto& p : tp) {
      lp.push_back(p + "encoder.layers." + std::to_string(l) + ".");
      lp.push_back(p + "layers." + std::to_string(l) + ".");
    }
    VisionLayerWeights L;
    L.ln1_w = read(st, {"layer_norm1.weight"}, lp, {D});
    L.ln1_b = read(st, {"layer_norm1.bias"}, lp, {D});
    L.ln2_w = read(st, {"layer_norm2.weight"}, lp, {D});
    L.ln2_b = read(st, {"layer_norm2.bias"}, lp, {D});
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
      auto wt = read(st, {std::string("self_attn.") + n + ".weight"}, lp, {D, D});
      auto b = read(st, {std::string("self_attn.") + n + ".bias"}, lp, {D});
      L.wqkv.insert(L.wqkv.end(), wt.begin(), wt.end());
      L.bqkv.insert(L.bqkv.end(), b.begin(), b.end());
    }
    L.wo = read(st, {"self_attn.out_proj.weight"}, lp, {D, D});
    L.bo = read(st, {"self_attn.out_proj.bias"}, lp, {D});
    L.fc1 = read(st, {"mlp.fc1.weight", "block_sparse_moe.fc1.weight"}, lp, {I, D});
    L.fc1_b = read(st, {"mlp.fc1.bias", "block_sparse_moe.fc1.bias"}, lp, {I});
    L.fc2 = read(st, {"mlp.fc2.weight", "block_sparse_moe.fc2.weight"}, lp, {D, I});
    L.fc2_b = read(st, {"mlp.fc2.bias", "block_sparse_moe.fc2.bias"}, lp, {D});
    w.layers.push_back(std::move(L));
  }
  const std::vector<std::string> pp = {"multi_modal_projector.", "model.multi_modal_projector."};
  w.proj1 = read(st, {"linear_1.weight"}, pp, {P, D});
  w.proj1_b = read(st, {"linear_1.bias"}, pp, {P});
  w.proj2 = read(st, {"linear_2.weight"}, pp, {Ht, P});
  w.proj2_b = read(st, {"linear_2.bias"}, pp, {Ht});
  const int64_t M = int64_t(c.merge_size) * c.merge_size * Ht;
  const std::vector<std::string> mp = {"patch_merge_mlp.", "model.patch_merge_mlp."};
  auto merge = [&](const char* released, const char* hf, const std::vector<int64_t>& shape) {
    for (const auto& p : mp)
      if (st.has(p + released)) return st.read_f32(p + released, shape);
    return read(st, {hf}, pp, shape);
  };
  w.merge1 = merge("linear_1.weight", "merge_linear_1.weight", {P, M});
  w.merge1_b = merge("linear_1.bias", "merge_linear_1.bias", {P});
  w.merge2 = merge("linear_2.weight", "merge_linear_2.weight", {Ht, P});
  w.merge2_b = merge("linear_2.bias", "merge_linear_2.bias", {Ht});
  return w;
}

VisionModel VisionModel::load(const std::string& model_dir, std::optional<VitRope> rope) {
  VisionConfig c = load_vision_config((std::filesystem::path(model_dir) / "config.json").string(), rope);
  SafeTensors st = SafeTensors::open(model_dir);
  return VisionModel(c, load_vision_weights(st, c));
}

void VisionModel::patch_positions(std::array<int, 3> g, int merge, std::vector<int32_t>& t, std::vector<int32_t>& h,
                                  std::vector<int32_t>& w) {
  t.clear();
  h.clear();
  w.clear();
  for (int ti = 0; ti < g[0]; ++ti)
    for (int hb = 0; hb < g[1] / merge; ++hb)
      for (int wb = 0; wb < g[2] / merge; ++wb)
        for (int dh = 0; dh < merge; ++dh)
          for (int dw = 0; dw < merge; ++dw) {
            t.push_back(ti);
            h.push_back(hb * merge + dh);
            w.push_back(wb * merge + dw);
          }
}

VisionModel::Layout VisionModel::layout(const VisionConfig& c, std::span<const std::array<int, 3>> grids) {
  Layout L;
  L.seq = {0};
  std::vector<int32_t> t, h, w;
  for (const auto& g : grids) {
    patch_positions(g, c.merge_size, t, h, w);
    const int64_t per_group = int64_t(g[1]) * g[2];
    const int S = c.segment_max_groups > 0 ? c.segment_max_groups : std::max(g[0], 1);
    for (int t0 = 0; t0 < g[0]; t0 += S) {
      const int t1 = std::min(g[0], t0 + S);
      L.seq.push_back(L.seq.back() + int64_t(t1 - t0) * per_group);
      if (c.rope == VitRope::kOfficial)
        for (int64_t r = t0 * per_group; r < t1 * per_group; ++r) t[size_t(r)] -= t0;
    }
    L.t.insert(L.t.end(), t.begin(), t.end());
    L.h.insert(L.h.end(), h.begin(), h.end());
    L.w.insert(L.w.end(), w.begin(), w.end());
  }
  return L;
}

std::vector<float> VisionModel::encode(std::span<const float> pixels, std::array<int, 3> g,
                                       VisionTrace* trace) const {
  const Item item{pixels, g};
  return encode_batch(std::span<const Item>(&item, 1), trace);
}

std::vector<float> VisionModel::encode_batch(std::span<const Item> items, VisionTrace* trace) const {
  const VisionConfig& c = cfg_;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim(), I = c.intermediate_size;
  const int64_t P = c.projector_hidden_size, Ht = c.text_hidden_size, K = c.patch_dim();
  const int64_t m2 = int64_t(c.merge_size) * c.merge_size;
  std::vector<std::array<int, 3>> grids;
  int64_t R = 0;
  std::vector<float> pixels;
  for (const Item& it : items) {
    const auto& g = it.grid_thw;
    M3_CHECK(g[0] > 0 && g[1] > 0 && g[2] > 0 && g[1] % c.merge_size == 0 && g[2] % c.merge_size == 0,
             "vision: grid ({}, {}, {}) must be positive with h and w multiples of {}", g[0], g[1], g[2],
             c.merge_size);
    const int64_t Ri = int64_t(g[0]) * g[1] * g[2];
    M3_CHECK(int64_t(it.pixels.size()) == Ri * K, "vision: {} pixel values for grid ({}, {}, {}); expected {} × {}",
             it.pixels.size(), g[0], g[1], g[2], Ri, K);
    grids.push_back(g);
    R += Ri;
  }
  if (R == 0) return {};
  const Layout pos = layout(c, grids);  // rotary positions and attention sequences
  const float* px = items[0].pixels.data();
  if (items.size() > 1) {
    pixels.reserve(size_t(R * K));
    for (const Item& it : items) pixels.insert(pixels.end(), it.pixels.begin(), it.pixels.end());
    px = pixels.data();
  }

  std::vector<float> x(size_t(R * D));
  cpu::matmul_nt(px, R, K, w_.patch_embed.data(), D, x.data());
  if (trace) trace->patch_embed = x;
  cpu::layer_norm(x.data(), R, D, w_.pre_ln_w.data(), w_.pre_ln_b.data(), c.layer_norm_eps, x.data());
  if (trace) {
    trace->pre_ln = x;
    trace->layers.clear();
  }
  std::vector<float> xn(size_t(R * D)), qkv(size_t(R * 3 * D)), q(size_t(R * D)), k(size_t(R * D)),
      v(size_t(R * D)), att(size_t(R * D)), o(size_t(R * D)), f(size_t(R * I));
  const float scale = 1.0f / std::sqrt(float(hd));
  for (const VisionLayerWeights& L : w_.layers) {
    cpu::layer_norm(x.data(), R, D, L.ln1_w.data(), L.ln1_b.data(), c.layer_norm_eps, xn.data());
    cpu::matmul_nt(xn.data(), R, D, L.wqkv.data(), 3 * D, qkv.data());
    cpu::add_bias(qkv.data(), R, 3 * D, L.bqkv.data());
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(&q[r * D], &qkv[r * 3 * D], size_t(D) * 4);
      std::memcpy(&k[r * D], &qkv[r * 3 * D + D], size_t(D) * 4);
      std::memcpy(&v[r * D], &qkv[r * 3 * D + 2 * D], size_t(D) * 4);
    }
    for (float* x : {q.data(), k.data()}) {
      if (c.rope == VitRope::kHf517)
        cpu::vision_rope_hf517(x, R, H, hd, pos.t.data(), pos.h.data(), c.rope_theta);
      else
        cpu::vision_rope_official(x, R, H, hd, pos.t.data(), pos.h.data(), pos.w.data(), c.rope_theta);
    }
    for (size_t i = 0; i + 1 < pos.seq.size(); ++i) {  // block-diagonal: one sequence per image / video segment
      const int64_t off = pos.seq[i] * D;
      cpu::attention_full(q.data() + off, k.data() + off, v.data() + off, pos.seq[i + 1] - pos.seq[i], H, hd, scale,
                          att.data() + off);
    }
    cpu::matmul_nt(att.data(), R, D, L.wo.data(), D, o.data());
    cpu::add_bias(o.data(), R, D, L.bo.data());
    for (int64_t i = 0; i < R * D; ++i) x[size_t(i)] += o[size_t(i)];
    cpu::layer_norm(x.data(), R, D, L.ln2_w.data(), L.ln2_b.data(), c.layer_norm_eps, xn.data());
    cpu::matmul_nt(xn.data(), R, D, L.fc1.data(), I, f.data());
    cpu::add_bias(f.data(), R, I, L.fc1_b.data());
    cpu::gelu_erf(f.data(), R * I);
    cpu::matmul_nt(f.data(), R, I, L.fc2.data(), D, o.data());
    cpu::add_bias(o.data(), R, D, L.fc2_b.data());
    for (int64_t i = 0; i < R * D; ++i) x[size_t(i)] += o[size_t(i)];
    if (trace) trace->layers.push_back(x);
  }
  // Projector per patch, then the 2×2 merge: 4 consecutive rows (one window) side by side (§5.5).
  std::vector<float> p1(size_t(R * P)), p2(size_t(R * Ht));
  cpu::matmul_nt(x.data(), R, D, w_.proj1.data(), P, p1.data());
  cpu::add_bias(p1.data(), R, P, w_.proj1_b.data());
  cpu::gelu_erf(p1.data(), R * P);
  cpu::matmul_nt(p1.data(), R, P, w_.proj2.data(), Ht, p2.data());
  cpu::add_bias(p2.data(), R, Ht, w_.proj2_b.data());
  if (trace) trace->projected = p2;
  const int64_t N = R / m2;
  std::vector<float> m1(size_t(N * P)), out(size_t(N * Ht));
  cpu::matmul_nt(p2.data(), N, m2 * Ht, w_.merge1.data(), P, m1.data());
  cpu::add_bias(m1.data(), N, P, w_.merge1_b.data());
  cpu::gelu_erf(m1.data(), N * P);
  cpu::matmul_nt(m1.data(), N, P, w_.merge2.data(), Ht, out.data());
  cpu::add_bias(out.data(), N, Ht, w_.merge2_b.data());
  return out;
}

}  // namespace m3
