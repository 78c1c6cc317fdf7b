// Encoder GPU time per image of the vision tower + projector + 2×2 merge (CudaVisionModel, issue 12 item 7) at
// MiniMax-M3's real vision widths: ViT 1280 wide, 32 layers, 16 heads (head dim 80), MLP 5120, projector
// 1280 → 6144 → 6144, merge 4·6144 → 6144 → 6144; random device-filled weights and pixels. Inputs are the grids the
// media gateway's smart-resize gives (factor 28, ≤ 451,584 pixels): 512² → 504×504 (36×36 patches, 324 tokens),
// 1080p and 4k → 504×896 (36×64 patches, 576 tokens; both hit the pixel cap). CUDA-event medians on the model's
// stream (3 warm-ups, --reps timed calls), effective TFLOP/s from CudaVisionModel::flops, and the attention kernel
// alone over the same items (32 layers' worth) for its share.
//   bench_vision [--reps N] [--layers L]          prints a markdown table and one JSON record per line
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "bench_common/event_timer.h"
#include "backend/cuda/vision_ops.cuh"
#include "backend/cuda/weight_convert.cuh"
#include "model/cuda_vision_model.h"
#ifdef M3_HAVE_MEDIA
#include "media/image.h"
#endif

namespace {

using namespace m3;

struct Input {
  const char* name;
  int h, w;    // the decoded image
  int rh, rw;  // its smart-resized size (media::smart_resize; checked against it when built with the media library)
};

// Sorted per-call times (ms) of f on stream s.
std::vector<float> time_ms(cudaStream_t s, int warm, int reps, const std::function<void()>& f) {
  return m3::bench::time_sorted_ms(f, warm, reps, s);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10, layers = 32;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::max(0, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_vision [--reps N] [--layers L]\n");
      return 2;
    }
  }
  try {
    if (cuda::device_count() == 0) {
      std::fprintf(stderr, "bench_vision: no CUDA device\n");
      return 1;
    }
    VisionConfig c;
    c.hidden_size = 1280, c.intermediate_size = 5120, c.num_layers = layers, c.num_heads = 16;
    c.projector_hidden_size = 6144, c.text_hidden_size = 6144;
    auto model = CudaVisionModel::random(c, 1);
    cudaStream_t s = model->stream();
    const Input inputs[] = {{"512x512", 512, 512, 504, 504}, {"1080p", 1080, 1920, 504, 896},
                            {"4k", 2160, 3840, 504, 896}};
#ifdef M3_HAVE_MEDIA
    for (const Input& in : inputs) {
      const auto [rh, rw] = media::smart_resize(in.h, in.w, media::ResizeLimits{});
      if (rh != in.rh || rw != in.rw) {
        std::fprintf(stderr, "bench_vision: %s resizes to %dx%d, the table says %dx%d\n", in.name, rh, rw, in.rh,
                     in.rw);
        return 1;
      }
    }
#endif
    struct Case {
      std::string name;
      std::vector<std::array<int, 3>> grids;
    };
    std::vector<Case> cases;
    for (const Input& in : inputs) cases.push_back({in.name, {{1, in.rh / 14, in.rw / 14}}});
    cases.push_back({"8 x 1080p in one call", std::vector<std::array<int, 3>>(8, {1, 36, 64})});
    cases.push_back({"512x512 + 1080p + 4k in one call", {{1, 36, 36}, {1, 36, 64}, {1, 36, 64}}});

    int64_t max_rows = 0;
    for (const Case& cs : cases) {
      int64_t r = 0;
      for (const auto& g : cs.grids) r += int64_t(g[0]) * g[1] * g[2];
      max_rows = std::max(max_rows, r);
    }
    cuda::DeviceBuffer<float> px(size_t(max_rows * c.patch_dim()));
    cuda::fill_counter_uniform(px.get(), false, int64_t(px.size()), 12345, 2.f, s);
    // Attention alone: q, k, v random bf16 of the largest case.
    const int64_t D = c.hidden_size;
    cuda::DeviceBuffer<uint16_t> q(size_t(max_rows * D)), k(size_t(max_rows * D)), v(size_t(max_rows * D)),
        o(size_t(max_rows * D));
    cuda::fill_counter_uniform(q.get(), true, max_rows * D, 1, 3.f, s);
    cuda::fill_counter_uniform(k.get(), true, max_rows * D, 2, 1.f, s);
    cuda::fill_counter_uniform(v.get(), true, max_rows * D, 3, 1.f, s);
    cuda::DeviceBuffer<int32_t> tiles;

    cudaDeviceProp prop{};
    M3_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("# bench_vision: %s, ViT %d wide × %d layers, %d heads (head dim %d), MLP %d, projector %d → %d, "
                "bf16 weights and GEMM inputs, fp32 accumulation; median of %d calls\n\n",
                prop.name, c.hidden_size, c.num_layers, c.num_heads, c.head_dim(), c.intermediate_size,
                c.projector_hidden_size, c.text_hidden_size, reps);
    std::printf("| input | grid(s) (t×h×w patches) | patches | tokens | ms / call (min–max) | ms / image | "
                "TFLOP/s | attention ms (32 layers) | attention TFLOP/s |\n|---|---|---|---|---|---|---|---|---|\n");
    std::vector<std::string> json;
    for (const Case& cs : cases) {
      int64_t R = 0;
      std::vector<int64_t> begin = {0};
      std::string gs;
      for (const auto& g : cs.grids) {
        R += int64_t(g[0]) * g[1] * g[2];
        begin.push_back(R);
        gs += (gs.empty() ? "" : ", ") + std::to_string(g[0]) + "×" + std::to_string(g[1]) + "×" +
              std::to_string(g[2]);
      }
      if (cs.grids.size() > 1 && std::all_of(cs.grids.begin(), cs.grids.end(), [&](const auto& g) {
            return g == cs.grids.front();
          }))
        gs = std::to_string(cs.grids.size()) + " × " + gs.substr(0, gs.find(','));
      const auto t = time_ms(s, 3, reps, [&] { model->enqueue(cs.grids, px.get()); });
      const double med = t[t.size() / 2], fl = CudaVisionModel::flops(c, cs.grids);
      // Attention alone: one launch per layer over the same items.
      const auto h_tiles = cuda::vision_attention_tiles(begin);
      cuda::upload(tiles, h_tiles.data(), h_tiles.size(), s);
      const float scale = 1.f / std::sqrt(float(c.head_dim()));
      const auto ta = time_ms(s, 2, reps, [&] {
        for (int l = 0; l < c.num_layers; ++l)
          cuda::vision_attention(q.get(), k.get(), v.get(), tiles.get(), int(h_tiles.size() / 3), c.num_heads,
                                 c.head_dim(), scale, o.get(), s);
      });
      double afl = 0;
      for (size_t i = 0; i + 1 < begin.size(); ++i) {
        const double n = double(begin[i + 1] - begin[i]);
        afl += double(c.num_layers) * 4 * n * n * double(D);
      }
      const double amed = ta[ta.size() / 2];
      const size_t ni = cs.grids.size();
      std::printf("| %s | %s | %lld | %lld | %.2f (%.2f–%.2f) | %.2f | %.0f | %.2f | %.0f |\n", cs.name.c_str(),
                  gs.c_str(), (long long)R, (long long)(R / 4), med, t.front(), t.back(), med / double(ni),
                  fl / (med * 1e-3) / 1e12, amed, afl / (amed * 1e-3) / 1e12);
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "{\"bench\":\"vision\",\"case\":\"%s\",\"images\":%zu,\"patches\":%lld,\"tokens\":%lld,"
                    "\"ms\":%.4f,\"ms_per_image\":%.4f,\"tflops\":%.1f,\"attn_ms\":%.4f,\"attn_tflops\":%.1f}",
                    cs.name.c_str(), ni, (long long)R, (long long)(R / 4), med, med / double(ni),
                    fl / (med * 1e-3) / 1e12, amed, afl / (amed * 1e-3) / 1e12);
      json.push_back(buf);
    }
    std::printf("\n");
    for (const auto& j : json) std::printf("%s\n", j.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vision: %s\n", e.what());
    return 1;
  }
  return 0;
}
