// Images through the serving engine (issue 12 items 4 and 6) on the CPU reference, with the HF-matched tiny VL
// model (tests/golden/fixtures/tiny_vl): EngineRequest::media_embeds reach the slot rows chunk by chunk (the first
// greedy token equals the argmax of HF's last-position logits; chunked prefill generates the same tokens), and the
// prefix cache reuses the image's pages only for the same image (EngineRequest::media content hashes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "base/error.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/m3_model.h"
#include "model/vision_model.h"

namespace fs = std::filesystem;

namespace m3 {
namespace {

struct Fixture {
  Fixture() {
    const fs::path dir = fs::path(M3_SOURCE_DIR) / "tests/golden/fixtures/tiny_vl";
    model = std::make_unique<M3Model>(M3Model::load(dir.string()));
    VisionModel vm = VisionModel::load(dir.string());
    SafeTensors gold = SafeTensors::open((dir / "golden.safetensors").string());
    const TensorRef& t = gold.get("input_ids");
    ids.resize(size_t(t.numel()));
    std::memcpy(ids.data(), t.data, t.nbytes);
    int32_t g[3];
    std::memcpy(g, gold.get("image_grid_thw").data, sizeof(g));
    embeds = std::make_shared<std::vector<float>>(
        vm.encode(gold.read_f32("pixel_values", gold.get("pixel_values").shape), {g[0], g[1], g[2]}));
    logits = gold.read_f32("logits", gold.get("logits").shape);
    image_start = std::find(ids.begin(), ids.end(), model->config().image_token_id) - ids.begin();
  }
  std::unique_ptr<M3Model> model;
  std::vector<int32_t> ids;
  std::shared_ptr<std::vector<float>> embeds;
  std::vector<float> logits;
  int64_t image_start = 0;
};

Fixture& fx() {
  static Fixture f;
  return f;
}

struct Out {
  std::vector<int32_t> tokens;
  int cached = -1;
  std::string error;
};

std::map<std::string, Out> run(Engine& e, std::vector<EngineRequest> reqs) {
  std::map<std::string, Out> out;
  std::mutex mu;
  for (auto& r : reqs) {
    const std::string id = r.id;
    e.submit(std::move(r), [&out, &mu, id](const EngineOutput& o) {
      std::lock_guard<std::mutex> lk(mu);
      auto& c = out[id];
      c.tokens.insert(c.tokens.end(), o.tokens.begin(), o.tokens.end());
      if (o.finish != FinishReason::None) {
        c.cached = o.cached_tokens;
        c.error = o.error;
      }
    });
    while (e.step()) {
    }
  }
  return out;
}

EngineRequest request(const std::string& id, std::shared_ptr<const std::vector<float>> embeds, uint64_t hash) {
  EngineRequest r;
  r.id = id;
  r.prompt = fx().ids;
  r.params.max_tokens = 4;
  r.params.sampling.temperature = 0;
  r.media_embeds = std::move(embeds);
  r.media.push_back({fx().image_start, int64_t(r.media_embeds->size()) / fx().model->config().hidden_size, hash});
  return r;
}

TEST(EngineMedia, ImageFeaturesReachTheModelChunkByChunkAndMatchHf) {
  const M3Config& c = fx().model->config();
  const int64_t T = int64_t(fx().ids.size()), V = c.vocab_size;
  const float* last = &fx().logits[size_t((T - 1) * V)];
  const int32_t hf_first = int32_t(std::max_element(last, last + V) - last);
  EngineConfig one;
  one.max_num_batched_tokens = 64;
  Engine a(*fx().model, one);
  auto ra = run(a, {request("a", fx().embeds, 1)});
  ASSERT_EQ(ra["a"].error, "");
  ASSERT_EQ(ra["a"].tokens.size(), 4u);
  EXPECT_EQ(ra["a"].tokens[0], hf_first) << "first greedy token = argmax of HF's logits with the image";
  EngineConfig chunked;
  chunked.max_num_batched_tokens = 7;  // the image's 12 slots cross chunk boundaries
  Engine b(*fx().model, chunked);
  EXPECT_EQ(run(b, {request("b", fx().embeds, 1)})["b"].tokens, ra["a"].tokens);
  // Wrong row count: refused at submit.
  auto bad = request("bad", std::make_shared<std::vector<float>>(fx().embeds->begin(), fx().embeds->end() - c.hidden_size), 1);
  EXPECT_THROW(b.submit(std::move(bad), [](const EngineOutput&) {}), Error);
}

TEST(EngineMedia, PrefixCacheReusesImagePagesOnlyForTheSameImage) {
  EngineConfig cfg;
  cfg.enable_prefix_caching = true;
  Engine e(*fx().model, cfg);
  auto other = std::make_shared<std::vector<float>>(*fx().embeds);
  for (float& v : *other) v = -v;  // another picture, same slot token ids
  auto r = run(e, {request("first", fx().embeds, 0xA), request("again", fx().embeds, 0xA),
                   request("other", other, 0xB)});
  EXPECT_EQ(r["first"].cached, 0);
  EXPECT_EQ(r["again"].cached, 16) << "page 0 (text + the image's first slots) reused";
  EXPECT_EQ(r["again"].tokens, r["first"].tokens);
  EXPECT_EQ(r["other"].cached, 0) << "same ids, different image: the image's page must not be reused";
  EngineConfig plain;
  plain.enable_prefix_caching = true;
  Engine e2(*fx().model, plain);
  auto r2 = run(e2, {request("other", other, 0xB)});
  EXPECT_EQ(r["other"].tokens, r2["other"].tokens) << "after the first image ran, the other image still gets its own";
}

}  // namespace
}  // namespace m3
