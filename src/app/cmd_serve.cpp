// m3serve serve: load a model directory, start the engine thread and the OpenAI-compatible HTTP server.
// Flags follow `vllm serve` where they apply (--host, --port, --served-model-name, --max-model-len,
// --max-num-seqs, --max-num-batched-tokens, --enable-prefix-caching, --api-key, --allowed-origins); --kv-cache-memory
// sizes the KV pool. Hardening flags (deadlines, budgets, shutdown) are described in docs/SERVER.md.
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_runner.h"
#include "base/error.h"
#include "engine/warmup.h"
#include "engine/engine.h"
#include "model/executor_factory.h"
#include "server/crash_handler.h"
#include "server/http_server.h"
#include "server/openai_service.h"
#ifdef M3_HAVE_MEDIA
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "media/feature_cache.h"
#include "media/gateway.h"
#include "model/vision_model.h"
#ifdef M3_WITH_CUDA
#include "model/cuda_vision_model.h"
#endif
#endif

namespace m3::app {

namespace fs = std::filesystem;

namespace {

struct ServeOptions {
  std::string model, tokenizer, chat_template, host = "127.0.0.1", served_model_name;
  int port = 8000;
  int64_t max_model_len = 0;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  bool warmup = true;  // GPU executors: the startup warm-up request (engine/warmup.h)
  bool prefix_caching = true;
  bool tokenizer_prefix_cache = true;
  std::string kv_cache_memory;
  std::string max_body_bytes = "32MiB";
  int max_connections = 1024;
  int reserved_connections = 32;
  std::string max_buffered_body_bytes = "512MiB";
  double header_timeout = 10, body_timeout = 60, keep_alive_timeout = 60, shutdown_timeout = 5;
  std::string api_key;
  std::vector<std::string> allowed_origins;
  bool log_requests = true;
  int io_threads = 2;
  std::string default_thinking_mode;
  std::string device = "auto";
  LoadOptions load;
  ParallelOptions parallel;
  // Media (issue 12, docs/MEDIA.md): sources, fetch limits, per-request limits.
  std::string allowed_local_media_path;
  bool remote_media = true;
  std::vector<std::string> allowed_media_domains;
  double media_fetch_timeout = 10;
  int max_media_redirects = 3;
  std::string max_media_bytes = "32MiB";
  int max_images = 16, max_videos = 2;
  int64_t max_media_pixels = 0;
  int media_threads = 2;
  std::string vision_device = "auto";  // where the vision tower runs: auto (with the executor), cpu
  std::string vit_rope = "config";     // ViT rotary: config (vision_config.vit_rope, else official), official, hf517
  std::string media_feature_cache = "2GiB";  // vision features kept by content hash (media/feature_cache.h)
};

// "2GiB", "512MiB", "1.5G", "1000000" → bytes.
int64_t parse_bytes(const std::string& text, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    m3::fail("{} '{}' is not a size (examples: 2GiB, 512MiB, 1000000)", flag, text);
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double mult = 1;
  if (unit.empty() || unit == "B" || unit == "b") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "k") mult = 1e3;
  else if (unit == "M" || unit == "MB") mult = 1e6;
  else if (unit == "G" || unit == "GB") mult = 1e9;
  else if (unit == "KiB") mult = 1024.0;
  else if (unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else m3::fail("{} '{}': unknown unit '{}' (use B, KiB, MiB, GiB, K, M, G)", flag, text, unit);
  M3_CHECK(v > 0 && std::isfinite(v), "{} must be positive, got '{}'", flag, text);
  return int64_t(v * mult);
}

int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, rss = 0;
  f >> size >> rss;
  return rss * int64_t(sysconf(_SC_PAGESIZE));
}

// What loading will touch: the mapped safetensors bytes plus an fp32 copy of every tensor (the CPU reference
// backend converts at load). Read from the safetensors headers (8-byte length + JSON).
int64_t expected_load_bytes(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".safetensors") continue;
    total += int64_t(e.file_size(ec));
    std::ifstream f(e.path(), std::ios::binary);
    uint64_t n = 0;
    if (!f.read(reinterpret_cast<char*>(&n), 8) || n > (uint64_t(1) << 30)) continue;
    std::string header(n, '\0');
    if (!f.read(header.data(), std::streamsize(n))) continue;
    auto j = nlohmann::json::parse(header, nullptr, false);
    if (!j.is_object()) continue;
    for (const auto& [name, t] : j.items()) {
      if (name == "__metadata__" || !t.contains("shape")) continue;
      int64_t elems = 1;
      for (const auto& d : t["shape"]) elems *= d.get<int64_t>();
      total += elems * 4;
    }
  }
  return std::max<int64_t>(total, 1);
}

// Loads the model onto `device` while a thread draws a progress bar on stderr. Progress = resident memory grown /
// bytes the load will touch (an estimate: the loader has no callback), clamped below 100 % until it returns.
std::unique_ptr<ModelExecutor> load_with_progress(const std::string& dir, const std::string& device,
                                                  KvBudget kv, const LoadOptions& load) {
  const int64_t expected = expected_load_bytes(dir);
  const int64_t rss0 = resident_bytes();
  std::atomic<bool> done{false};
  const bool tty = isatty(2);
  auto t0 = std::chrono::steady_clock::now();
  auto draw = [&](double frac, bool final) {
    const int width = 30;
    int filled = int(frac * width);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string bar(size_t(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "%sloading weights [%s] %3d%% %.2f GB %.1fs%s", tty ? "\r" : "", bar.c_str(),
                 int(frac * 100), double(expected) / 1e9, secs, (final || !tty) ? "\n" : "");
    std::fflush(stderr);
  };
  std::thread bar([&] {
    int ticks = 0;
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (done.load()) break;
      // Without a terminal, print a line every 2 s only (logs stay short).
      if (tty || ++ticks % 20 == 0)
        draw(std::clamp(double(resident_bytes() - rss0) / double(expected), 0.0, 0.99), false);
    }
  });
  try {
    std::unique_ptr<ModelExecutor> m = make_executor(dir, device, kv, load);
    done = true;
    bar.join();
    draw(1.0, true);
    return m;
  } catch (...) {
    done = true;
    bar.join();
    if (tty) std::fprintf(stderr, "\n");
    throw;
  }
}

class EngineBackend final : public server::GenerationBackend {
 public:
  explicit EngineBackend(Engine& e) : e_(e) {}
  void submit(EngineRequest req, OutputSink sink) override { e_.submit(std::move(req), std::move(sink)); }
  void abort(const std::string& id) override { e_.abort(id); }
  EngineMetrics metrics() const override { return e_.metrics(); }

 private:
  Engine& e_;
};

}  // namespace

CommandRun register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", o->model, "Model directory: config.json, *.safetensors, tokenizer.json "
                                       "[, tokenizer_config.json / chat_template.jinja]")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json to use instead of the model directory's");
  cmd->add_option("--chat-template", o->chat_template,
                  "Jinja chat template file overriding the model's (required when the model directory has none)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0 = any free port; the startup line says which)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in the API (default: directory name)");
  cmd->add_option("--max-model-len", o->max_model_len, "Prompt + generated tokens at most (default: the model's)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Running sequences at most")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per engine step")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_flag("--warmup,!--no-warmup", o->warmup,
                "GPU: run one synthetic full-step request at startup so the first request does not pay one-time "
                "costs (lazy kernel loading, GEMM plans, buffer growth, the first decode graph)")
      ->capture_default_str();
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->prefix_caching,
                "Reuse KV pages of identical prompt prefixes (default on)");
  cmd->add_flag("!--no-tokenizer-prefix-cache", o->tokenizer_prefix_cache,
                "Re-tokenise every chat prompt whole instead of resuming at a cached shared prefix");
  cmd->add_option("--kv-cache-memory", o->kv_cache_memory,
                  "KV cache size, e.g. 2GiB or 512MiB (default: CPU room for 8 sequences of up to 4096 tokens; "
                  "CUDA 90% of free device memory)");
  cmd->add_option("--device", o->device, "auto (CUDA when built with it and a GPU is present), cpu or cuda")
      ->check(CLI::IsMember(device_choices()))
      ->capture_default_str();
  add_load_flags(*cmd, o->load);
  add_parallel_flags(*cmd, o->parallel);
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body; larger ones get 413")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections, "Concurrent connections; more get 429 + Retry-After")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--reserved-connections", o->reserved_connections,
                  "Connections beyond --max-connections still read for GET /health and /metrics only")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--max-buffered-body-bytes", o->max_buffered_body_bytes,
                  "Request body bytes being received, all connections together; more get 503")
      ->capture_default_str();
  auto seconds = CLI::Range(0.001, 86400.0);
  cmd->add_option("--header-timeout", o->header_timeout, "Seconds for a request's headers to arrive")
      ->check(seconds)
      ->capture_default_str();
  cmd->add_option("--body-timeout", o->body_timeout, "Seconds for a request's body to arrive after its headers")
      ->check(seconds)
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", o->keep_alive_timeout, "Seconds an idle keep-alive connection stays open")
      ->check(seconds)
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "Seconds in-flight requests get to finish after SIGTERM/SIGINT before they are aborted")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every /v1 route (default: $M3SERVE_API_KEY)");
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "CORS: origins allowed to call the API from a browser (exact, or '*'); default none")
      ->delimiter(',');
  cmd->add_flag("--enable-log-requests,!--disable-log-requests,!--quiet", o->log_requests,
                "One access-log line per request on stderr (default on; --quiet / --disable-log-requests: off)");
  cmd->add_option("--io-threads", o->io_threads, "HTTP io threads")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--default-thinking-mode", o->default_thinking_mode,
                  "chat_template_kwargs.thinking_mode when a request sets none")
      ->check(CLI::IsMember({"enabled", "disabled", "adaptive"}));
  cmd->add_option("--allowed-local-media-path", o->allowed_local_media_path,
                  "Directory whose files image_url / video_url may name (absolute path or file://); default: local "
                  "files refused");
  cmd->add_flag("--enable-remote-media,!--no-remote-media", o->remote_media,
                "Fetch http(s) image_url / video_url (default on; --no-remote-media: data: URLs and allowed local "
                "files only)");
  cmd->add_option("--allowed-media-domains", o->allowed_media_domains,
                  "Hosts remote media may come from (each also allows its subdomains); default: any")
      ->delimiter(',');
  cmd->add_option("--media-fetch-timeout", o->media_fetch_timeout, "Seconds for one remote media fetch, redirects "
                  "included")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--max-media-redirects", o->max_media_redirects, "Redirects one remote media fetch may follow")
      ->check(CLI::Range(0, 20))->capture_default_str();
  cmd->add_option("--max-media-bytes", o->max_media_bytes, "Largest encoded image / video (data:, file or fetched)")
      ->capture_default_str();
  cmd->add_option("--max-images-per-request", o->max_images, "Images per request at most")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("--max-videos-per-request", o->max_videos, "Videos per request at most")
      ->check(CLI::Range(0, 64))->capture_default_str();
  cmd->add_option("--max-media-pixels-per-request", o->max_media_pixels,
                  "Pixels the model sees per request over all images and video frames after resizing (0: only the "
                  "media token limit)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--media-threads", o->media_threads, "Media preprocessing threads (off the engine thread)")
      ->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--media-feature-cache-memory", o->media_feature_cache,
                  "Host memory for vision-encoder outputs by image/video content hash: an image sent again (every "
                  "turn of a conversation) is not encoded again (0: off)")
      ->capture_default_str();
  cmd->add_option("--vision-device", o->vision_device,
                  "Where the vision tower runs: auto (on the GPU with the CUDA executor, else the CPU) or cpu")
      ->check(CLI::IsMember({"auto", "cpu"}))->capture_default_str();
  cmd->add_option("--vit-rope", o->vit_rope,
                  "The vision tower's rotary (docs/MEDIA.md): config (config.json's vision_config.vit_rope, else "
                  "official), official (vLLM's 3D RoPE) or hf517 (HF transformers 5.17's axial RoPE)")
      ->check(CLI::IsMember({"config", "official", "hf517"}))->capture_default_str();

  return [o]() -> int {
    server::install_crash_handler();
    if (o->api_key.empty())
      if (const char* env = std::getenv("M3SERVE_API_KEY")) o->api_key = env;
    M3_CHECK(fs::is_directory(o->model), "--model '{}' is not a directory", o->model);
    // The prompt format is the model's own (or --chat-template): no template is a startup error, not a 400 later.
    auto tmpl = std::make_shared<const ChatTemplate>(server::load_serving_chat_template(o->model, o->chat_template));
    const std::string tok_path = o->tokenizer.empty() ? (fs::path(o->model) / "tokenizer.json").string() : o->tokenizer;
    M3_CHECK(fs::exists(tok_path), "no tokenizer: '{}' does not exist (pass --tokenizer FILE)", tok_path);
    auto tokenizer = std::make_shared<const Tokenizer>(Tokenizer::from_file(tok_path));
    const int64_t max_body = parse_bytes(o->max_body_bytes, "--max-body-bytes");
    const int64_t max_buffered = parse_bytes(o->max_buffered_body_bytes, "--max-buffered-body-bytes");

    EngineConfig ec;
    ec.max_num_seqs = o->max_num_seqs;
    ec.max_num_batched_tokens = o->max_num_batched_tokens;
    ec.max_model_len = o->max_model_len;
    ec.enable_prefix_caching = o->prefix_caching;
    apply_parallel_options(o->parallel, o->device, ec, o->load);  // before the weights load
    // --kv-cache-memory is divided by the chosen executor's own page size (checked before the weights load).
    KvBudget kv;
    if (!o->kv_cache_memory.empty()) kv.bytes = parse_bytes(o->kv_cache_memory, "--kv-cache-memory");
    const std::unique_ptr<ModelExecutor> executor = load_with_progress(o->model, o->device, kv, o->load);
    const M3Config& c = executor->config();
    if (int64_t(tokenizer->vocab_size()) > c.vocab_size)
      std::fprintf(stderr, "warning: tokenizer has %zu ids but the model's vocabulary is %d; larger ids are rejected\n",
                   tokenizer->vocab_size(), c.vocab_size);
    // Held by pointer so it can be destroyed (dropping every output sink, which hold HTTP connections) before
    // the HTTP server at shutdown.
    auto engine_ptr = std::make_unique<Engine>(*executor, ec);
    Engine& engine = *engine_ptr;
    const EngineConfig rc = engine.config();
    if (o->max_model_len > 0 && rc.max_model_len < o->max_model_len)
      std::fprintf(stderr, "note: --max-model-len %lld reduced to %lld (model limit / KV cache capacity)\n",
                   (long long)o->max_model_len, (long long)rc.max_model_len);
    engine.start();
    // GPU executors: one synthetic full-step request before listening (engine/warmup.h), so the first client
    // request does not pay the first steps' one-time costs.
    if (o->warmup && dynamic_cast<const CpuExecutor*>(executor.get()) == nullptr) {
      const int64_t vocab = std::min<int64_t>(c.vocab_size, int64_t(tokenizer->vocab_size()));
      const WarmupResult w = warm_up_engine(engine, rc.max_num_batched_tokens, vocab);
      std::fprintf(stderr, "warm-up: one %lld-token prefill step and one decode step in %.0f ms\n",
                   (long long)w.prompt_tokens, w.seconds * 1e3);
    }

    server::ServiceConfig sc;
    sc.limits.model_name =
        o->served_model_name.empty() ? fs::path(o->model).lexically_normal().filename().string() : o->served_model_name;
    if (sc.limits.model_name.empty()) sc.limits.model_name = "m3";
    sc.limits.max_model_len = rc.max_model_len;
    sc.limits.vocab_size = c.vocab_size;
    sc.eos_token_id = c.eos_token_id;
    sc.limits.default_thinking_mode = o->default_thinking_mode;
    sc.tokenizer = tokenizer;
    sc.chat_template = tmpl;
    sc.tokenizer_prefix_cache = o->tokenizer_prefix_cache;
#ifdef M3_HAVE_MEDIA
    media::GatewayOptions mo;
    mo.threads = o->media_threads;
    mo.max_images = o->max_images;
    mo.max_videos = o->max_videos;
    mo.max_pixels = o->max_media_pixels;
    mo.source.allowed_local_path = o->allowed_local_media_path;
    mo.source.allow_remote = o->remote_media;
    mo.source.max_bytes = parse_bytes(o->max_media_bytes, "--max-media-bytes");
    mo.source.fetch.timeout_s = o->media_fetch_timeout;
    mo.source.fetch.max_redirects = o->max_media_redirects;
    mo.source.fetch.allowed_domains = o->allowed_media_domains;
    if (!mo.source.allowed_local_path.empty())
      M3_CHECK(fs::is_directory(mo.source.allowed_local_path), "--allowed-local-media-path '{}' is not a directory",
               mo.source.allowed_local_path);
    auto gateway = std::make_shared<media::MediaGateway>(mo);
    sc.prepare_media = media::make_prepare_hook(gateway);
    sc.image_token_id = c.image_token_id;
    sc.video_token_id = c.video_token_id;
    // The vision tower runs with the executor (docs/MEDIA.md): the CPU reference, or CudaVisionModel next to the
    // CUDA executor (--vision-device cpu keeps it on the CPU there). The engine asks for the features of the items
    // its prefix cache does not hold (EngineRequest::media_encoder); they are encoded on a thread of their own (off
    // the engine and io threads) and handed back to it.
    if (c.image_token_id >= 0) {
      using Encode = std::function<std::vector<float>(std::span<const VisionModel::Item>)>;
      Encode encode;
      int width = 0;
      [[maybe_unused]] const bool cpu_executor = dynamic_cast<const CpuExecutor*>(executor.get()) != nullptr;
      const std::optional<VitRope> rope =
          o->vit_rope == "config" ? std::nullopt : std::optional<VitRope>(parse_vit_rope(o->vit_rope));
      const char* rope_name = nullptr;
      try {
#ifdef M3_WITH_CUDA
        if (!cpu_executor && o->vision_device == "auto") {
          std::shared_ptr<CudaVisionModel> gpu = CudaVisionModel::load(o->model, rope);
          width = gpu->config().text_hidden_size;
          rope_name = vit_rope_name(gpu->config().rope);
          encode = [gpu](std::span<const VisionModel::Item> items) { return gpu->encode_batch(items); };
        }
#endif
        if (!encode) {
          auto cpu = std::make_shared<const VisionModel>(VisionModel::load(o->model, rope));
          width = cpu->config().text_hidden_size;
          rope_name = vit_rope_name(cpu->config().rope);
          encode = [cpu](std::span<const VisionModel::Item> items) { return cpu->encode_batch(items); };
        }
      } catch (const m3::Error& e) {
        std::fprintf(stderr, "note: no vision tower loaded (%s); image/video requests get 400\n", e.what());
        encode = nullptr;
      }
      if (encode) {
        M3_CHECK(width == c.hidden_size, "vision projector width {} differs from the text hidden size {}", width,
                 c.hidden_size);
        sc.serve_media = true;
        std::fprintf(stderr, "vision tower: %s rotary (--vit-rope)\n", rope_name ? rope_name : "?");
        const int64_t fc_bytes = parse_bytes(o->media_feature_cache, "--media-feature-cache-memory");
        auto features = fc_bytes > 0 ? std::make_shared<media::FeatureCache>(fc_bytes) : nullptr;
        // The encoder's own thread: the engine asks for the items its prefix cache does not hold
        // (EngineRequest::media_encoder) and must not wait for them. Requests hold it weakly, never its last owner.
        auto worker = std::make_shared<boost::asio::thread_pool>(1);
        sc.prepare_media = [gateway, encode, features, width, worker](const server::OJson& messages,
                                                                      std::string prompt) {
          const auto t0 = std::chrono::steady_clock::now();
          auto pm = std::make_shared<media::PreparedMedia>(
              media::prepare_chat_media(*gateway, messages, std::move(prompt)).get());
          server::MediaPrepared out(std::move(pm->prompt));
          const media::GatewayTimings& gt = pm->timings;
          out.stages = {gt.collect, gt.queue, gt.load, gt.hash, gt.process, gt.process_user, gt.process_sys, gt.expand};
          for (const auto& it : pm->items) {
            out.hashes.push_back(it->content_hash);
            out.slots.push_back(it->pixels.tokens());
          }
          out.gateway_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          // Cached items' features come from the feature cache, the others from one encoder batch. Without the
          // feature cache a cache of the request's own keeps choices (n > 1) from encoding an item twice.
          auto cache = features ? features : std::make_shared<media::FeatureCache>(int64_t(1) << 62);
          out.encode = [pm, hashes = out.hashes, slots = out.slots, encode, cache, width,
                        pool = std::weak_ptr<boost::asio::thread_pool>(worker)](
                           size_t first, size_t end, std::function<void(server::MediaPrepared::Encoded)> done) {
            auto job = [pm, hashes, slots, encode, cache, width, first, end, done] {
              server::MediaPrepared::Encoded r;
              const auto t = std::chrono::steady_clock::now();
              try {
                r.features = std::make_shared<const std::vector<float>>(media::features_with_cache(
                    cache.get(), std::span(hashes).subspan(first, end - first),
                    std::span(slots).subspan(first, end - first), width, [&](std::span<const size_t> misses) {
                      r.items_encoded = int64_t(misses.size());
                      std::vector<VisionModel::Item> items;
                      for (size_t m : misses) {
                        const auto& px = pm->items[first + m]->pixels;
                        items.push_back(
                            {std::span<const float>(px.values.data(), px.values.size()), {px.t, px.gh, px.gw}});
                      }
                      return encode(items);
                    }));
              } catch (const std::exception& e) {
                r.features.reset();
                r.error = fmt::format("the vision encoder failed: {}", e.what());
              }
              r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
              done(std::move(r));
            };
            if (auto p = pool.lock())
              boost::asio::post(*p, std::move(job));
            else
              done({nullptr, "the server is shutting down", 0, 0});
          };
          return out;
        };
      }
    }
#endif
    server::OpenAIService service(sc);
    EngineBackend backend(engine);
    server::HttpServerConfig hc;
    hc.host = o->host;
    hc.port = uint16_t(o->port);
    hc.io_threads = o->io_threads;
    hc.max_body_bytes = size_t(max_body);
    hc.max_connections = o->max_connections;
    hc.reserved_connections = o->reserved_connections;
    hc.max_buffered_body_bytes = size_t(max_buffered);
    auto ms = [](double s) { return std::chrono::milliseconds(int64_t(std::llround(s * 1000))); };
    hc.header_timeout = ms(o->header_timeout);
    hc.body_timeout = ms(o->body_timeout);
    hc.idle_timeout = ms(o->keep_alive_timeout);
    hc.api_key = o->api_key;
    hc.allowed_origins = o->allowed_origins;
    hc.log_requests = o->log_requests;
    server::HttpServer http(hc, service, backend);
    http.start();

    // The executor's description says where it runs and how many KV pages / tokens fit.
    std::fprintf(stdout,
                 "m3serve: serving '%s' from %s (%d layers, hidden %d, vocab %d) | %s | max_model_len %lld | "
                 "prefix caching %s | chat template %s | listening on http://%s:%u\n",
                 sc.limits.model_name.c_str(), o->model.c_str(), c.num_layers, c.hidden_size, c.vocab_size,
                 engine.executor().describe().c_str(), (long long)rc.max_model_len,
                 rc.enable_prefix_caching ? "on" : "off", fs::path(tmpl->name()).filename().c_str(), o->host.c_str(),
                 http.port());
    std::fflush(stdout);

    const int sig = http.wait_for_signal();
    std::fprintf(stderr, "m3serve: %s received, shutting down (in-flight requests get up to %.1f s)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", o->shutdown_timeout);
    // New connections are refused from here; what is in flight finishes or, after the grace period, ends as
    // aborted with a complete HTTP answer (HttpServer::shutdown). Then the engine and the io threads stop.
    const bool clean = http.shutdown(ms(o->shutdown_timeout));
    engine.stop();
    http.stop();
    engine_ptr.reset();
    std::fprintf(stderr, "m3serve: stopped (%s)\n",
                 clean ? "every request finished" : "requests still running at the deadline were aborted");
    return 0;
  };
}

}  // namespace m3::app
