// Images through the serving engine (issue 12 items 4 and 6) on the CPU reference, with the HF-matched tiny VL
// model (tests/golden/fixtures/tiny_vl): EngineRequest::media_embeds reach the slot rows chunk by chunk (the first
// greedy token equals the argmax of HF's last-position logits; chunked prefill generates the same tokens), and the
// prefix cache reuses the image's pages only for the same image (EngineRequest::media content hashes). With
// features on demand (EngineRequest::media_encoder) only the items not entirely inside the cached prefix are encoded,
// and the answer is the one without prefix caching.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

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
    vm = std::make_unique<VisionModel>(VisionModel::load(dir.string()));
    SafeTensors gold = SafeTensors::open((dir / "golden.safetensors").string());
    const TensorRef& t = gold.get("input_ids");
    ids.resize(size_t(t.numel()));
    std::memcpy(ids.data(), t.data, t.nbytes);
    for (const char* p : {"", "b."}) {  // image A (in the prompt, 12 slots) and image B (10 slots)
      const std::string px = std::string(p) + "pixel_values", grid = std::string(p) + "image_grid_thw";
      pixels.push_back(gold.read_f32(px, gold.get(px).shape));
      int32_t g[3];
      std::memcpy(g, gold.get(grid).data, sizeof(g));
      grids.push_back({g[0], g[1], g[2]});
    }
    embeds = std::make_shared<std::vector<float>>(vm->encode(pixels[0], grids[0]));
    logits = gold.read_f32("logits", gold.get("logits").shape);
    image_start = std::find(ids.begin(), ids.end(), model->config().image_token_id) - ids.begin();
  }
  std::unique_ptr<M3Model> model;
  std::unique_ptr<VisionModel> vm;
  std::vector<std::vector<float>> pixels;  // A, B
  std::vector<std::array<int, 3>> grids;
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

// ---- features on demand (EngineRequest::media_encoder) ----

// Tokens of the two-image prompt: the fixture's 30 tokens (image A's 12 slots at [10, 22)), text, image B's 10 slots
// at [44, 54) between its markers — B crosses the page boundary at 48 (16-token pages) — and text to 64 tokens,
// four full pages.
constexpr int64_t kBStart = 44, kP1 = 64;
int32_t text_token(int64_t i, int64_t salt = 0) {
  static const int32_t kText[] = {481, 808, 938, 533, 245, 123, 897, 91, 39, 874, 732, 53, 11, 875};
  return kText[size_t(i + salt) % std::size(kText)];
}
std::vector<int32_t> two_image_prompt() {
  std::vector<int32_t> p = fx().ids;
  while (int64_t(p.size()) < kBStart - 1) p.push_back(text_token(int64_t(p.size())));
  p.push_back(1002);
  p.insert(p.end(), 10, fx().model->config().image_token_id);
  p.push_back(1003);
  while (int64_t(p.size()) < kP1) p.push_back(text_token(int64_t(p.size())));
  return p;
}

// A MediaEncoder over images A and B that counts the items it encodes; `delay` > 0 answers from another thread
// after that long (the engine must hold the request meanwhile), 0 answers inside the call.
struct Encoder {
  std::vector<int> images;  // fixture image (0 = A, 1 = B) of each item
  std::chrono::milliseconds delay{0};
  std::string fail;  // answer with this error instead
  std::shared_ptr<std::atomic<int>> encoded = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::vector<std::thread>> threads = std::make_shared<std::vector<std::thread>>();

  std::shared_ptr<const MediaEncoder> make() const {
    auto me = std::make_shared<MediaEncoder>();
    for (int im : images) me->item_slots.push_back(int64_t(fx().pixels[size_t(im)].size() / 1176 / 4));
    me->encode = [images = images, delay = delay, fail = fail, encoded = encoded, threads = threads](
                     size_t first, size_t end, MediaEncoder::Done done) {
      auto job = [=] {
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        if (!fail.empty()) return done(nullptr, fail);
        std::vector<VisionModel::Item> items;
        for (size_t i = first; i < end; ++i) {
          const int im = images[i];
          items.push_back({fx().pixels[size_t(im)], fx().grids[size_t(im)]});
        }
        *encoded += int(end - first);
        done(std::make_shared<const std::vector<float>>(fx().vm->encode_batch(items)), "");
      };
      if (delay.count() > 0)
        threads->emplace_back(job);  // the engine thread must not wait for it
      else
        job();
    };
    return me;
  }
  void join() const {
    for (auto& t : *threads) t.join();
    threads->clear();
  }
};

EngineRequest on_demand(const std::string& id, std::vector<int32_t> prompt, const Encoder& enc) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = 6;
  r.params.sampling.temperature = 0;
  r.media_encoder = enc.make();
  const int32_t slot = fx().model->config().image_token_id;
  size_t item = 0;
  for (int64_t i = 0; i < int64_t(r.prompt.size()); ++i) {
    if (r.prompt[size_t(i)] != slot || (i > 0 && r.prompt[size_t(i - 1)] == slot)) continue;
    const int64_t n = r.media_encoder->item_slots.at(item);
    r.media.push_back({i, n, 0xA0u + uint64_t(enc.images[item++])});  // the content hash: which image
  }
  return r;
}

// The same request on a fresh engine without prefix caching: every item encoded, the reference answer.
std::vector<int32_t> uncached(const std::string& id, const std::vector<int32_t>& prompt, const Encoder& like) {
  EngineConfig cfg;
  cfg.enable_prefix_caching = false;
  Engine e(*fx().model, cfg);
  Encoder enc;
  enc.images = like.images;
  auto out = run(e, {on_demand(id, prompt, enc)});
  EXPECT_EQ(out[id].error, "");
  EXPECT_EQ(*enc.encoded, int(like.images.size())) << "without the prefix cache every item is encoded";
  return out[id].tokens;
}

TEST(EngineMedia, OnDemandFeaturesEqualTheUpFrontOnes) {
  EngineConfig cfg;
  cfg.max_num_batched_tokens = 7;  // both images cross chunk boundaries
  Engine e(*fx().model, cfg);
  Encoder enc;
  enc.images = {0};
  auto lazy = run(e, {on_demand("lazy", fx().ids, enc)});
  ASSERT_EQ(lazy["lazy"].error, "");
  EXPECT_EQ(*enc.encoded, 1);
  EngineRequest eager = request("eager", fx().embeds, 0xA0);
  eager.params.max_tokens = 6;
  Engine e2(*fx().model, cfg);
  EXPECT_EQ(run(e2, {std::move(eager)})["eager"].tokens, lazy["lazy"].tokens);
}

// A second turn repeating the first's prompt (both images) plus more text: its prefix hit holds every slot of
// both images, so nothing is encoded, and the answer is the uncached one.
TEST(EngineMedia, ARepeatedPrefixEncodesNoneOfItsImagesAndAnswersAsWithoutTheCache) {
  EngineConfig cfg;
  cfg.enable_prefix_caching = true;
  Engine e(*fx().model, cfg);
  Encoder enc;
  enc.images = {0, 1};
  const std::vector<int32_t> p1 = two_image_prompt();
  std::vector<int32_t> p2 = p1;
  for (int64_t i = 0; i < 10; ++i) p2.push_back(text_token(i, 5));
  auto first = run(e, {on_demand("first", p1, enc)});
  ASSERT_EQ(first["first"].error, "");
  EXPECT_EQ(*enc.encoded, 2);
  EXPECT_EQ(e.metrics().media_items_requested, 2u);
  auto second = run(e, {on_demand("second", p2, enc)});
  ASSERT_EQ(second["second"].error, "");
  EXPECT_EQ(second["second"].cached, kP1) << "the first turn's four pages";
  EXPECT_EQ(*enc.encoded, 2) << "the second turn encoded no image";
  EXPECT_EQ(e.metrics().media_items_requested, 2u);
  EXPECT_EQ(e.metrics().media_items_skipped, 2u);
  EXPECT_EQ(second["second"].tokens, uncached("second", p2, enc));
  EXPECT_EQ(first["first"].tokens, uncached("first", p1, enc));
}

// The cached prefix ends inside image B (pages 0–2 match; page 3 holds B's last slots and then other text): A is
// skipped, B is encoded, and B's remaining rows reach the prefill — the answer is the uncached one.
TEST(EngineMedia, AnImageThePrefixHitEndsInsideIsStillEncoded) {
  EngineConfig cfg;
  cfg.enable_prefix_caching = true;
  cfg.max_num_batched_tokens = 7;
  Engine e(*fx().model, cfg);
  Encoder enc;
  enc.images = {0, 1};
  enc.delay = std::chrono::milliseconds(20);  // answered from another thread
  const std::vector<int32_t> p1 = two_image_prompt();
  std::vector<int32_t> p3(p1.begin(), p1.begin() + kBStart + 11);  // through B's end marker
  while (int64_t(p3.size()) < kP1 + 5) p3.push_back(text_token(int64_t(p3.size()), 3));
  ASSERT_NE(std::vector<int32_t>(p3.begin() + 48, p3.begin() + 64), std::vector<int32_t>(p1.begin() + 48, p1.end()));
  run(e, {on_demand("first", p1, enc)});
  enc.join();
  EXPECT_EQ(*enc.encoded, 2);
  auto third = run(e, {on_demand("third", p3, enc)});
  enc.join();
  ASSERT_EQ(third["third"].error, "");
  EXPECT_EQ(third["third"].cached, 48);
  EXPECT_EQ(*enc.encoded, 3) << "B encoded again, A not";
  EXPECT_EQ(e.metrics().media_items_skipped, 1u);
  EXPECT_EQ(third["third"].tokens, uncached("third", p3, enc));
}

// The hit shrinks between the request's arrival (nothing to encode then) and its admission: a long request takes
// the only sequence slot and its decode evicts the cached pages. The admission check then asks for both images.
TEST(EngineMedia, AnEvictedPrefixIsEncodedAtAdmission) {
  EngineConfig cfg;
  cfg.enable_prefix_caching = true;
  cfg.max_num_seqs = 1;
  cfg.num_pages = 8;
  Engine e(*fx().model, cfg);
  Encoder enc;
  enc.images = {0, 1};
  const std::vector<int32_t> p1 = two_image_prompt();
  std::vector<int32_t> p2 = p1;
  for (int64_t i = 0; i < 10; ++i) p2.push_back(text_token(i, 5));
  run(e, {on_demand("first", p1, enc)});
  ASSERT_EQ(*enc.encoded, 2);
  EngineRequest hog;
  hog.id = "hog";
  for (int64_t i = 0; i < 16; ++i) hog.prompt.push_back(text_token(i, 1));
  hog.params.max_tokens = 80;
  hog.params.ignore_eos = true;
  hog.params.sampling.temperature = 0;
  std::map<std::string, Out> out;
  auto sink = [&out](const std::string& id) {
    return [&out, id](const EngineOutput& o) {  // steps run on this thread
      auto& c = out[id];
      c.tokens.insert(c.tokens.end(), o.tokens.begin(), o.tokens.end());
      if (o.finish != FinishReason::None) c.cached = o.cached_tokens, c.error = o.error;
    };
  };
  e.submit(std::move(hog), sink("hog"));
  e.submit(on_demand("second", p2, enc), sink("second"));  // arrives while the first turn's pages are cached
  while (e.step()) {
  }
  ASSERT_EQ(out["hog"].error, "");
  ASSERT_EQ(out["second"].error, "");
  EXPECT_LT(out["second"].cached, kP1) << "the hog's pages evicted the first turn's";
  EXPECT_EQ(*enc.encoded, 4) << "both images encoded at admission";
  EXPECT_EQ(out["second"].tokens, uncached("second", p2, enc));
}

TEST(EngineMedia, AnEncoderErrorFailsTheRequestAndBadEncodersAreRefused) {
  Engine e(*fx().model, EngineConfig{});
  Encoder enc;
  enc.images = {0};
  enc.fail = "no GPU today";
  auto r = run(e, {on_demand("x", fx().ids, enc)});
  EXPECT_EQ(r["x"].error, "no GPU today");
  EXPECT_TRUE(r["x"].tokens.empty());
  Encoder two;
  two.images = {0, 1};  // 22 slots for a prompt with 12
  EXPECT_THROW(e.submit(on_demand("y", fx().ids, two), [](const EngineOutput&) {}), Error);
  Encoder one;
  one.images = {0};
  EngineRequest both = on_demand("z", fx().ids, one);
  both.media_embeds = fx().embeds;
  EXPECT_THROW(e.submit(std::move(both), [](const EngineOutput&) {}), Error);
}

}  // namespace
}  // namespace m3
