// m3serve generate: load a model (CPU reference or CUDA), prefill a prompt (text or token ids), decode, print the
// generated ids and tokens/s.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include <fmt/format.h>

#include "app/commands.h"
#include "app/model_runner.h"
#include "base/error.h"
#include "engine/sampler.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace m3::app {

namespace {
struct GenerateOptions {
  std::string model;
  std::string ids;
  std::string prompt;
  std::string tokenizer;
  int max_tokens = 32;
  int64_t chunk = 0;
  float temperature = 0.f;
  float top_p = 1.f;
  int top_k = -1;
  float min_p = 0.f;
  int64_t seed = -1;
  bool ignore_eos = false;
  std::string device = "auto";
};
}  // namespace

CommandRun register_generate(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens from a prompt with the CPU reference engine");
  cmd->add_option("--model", opt->model, "Model directory (config.json + safetensors)")->required();
  auto* ids_opt = cmd->add_option("--prompt-ids", opt->ids, "Prompt as token ids: '1,2,3' or a JSON array");
  auto* text_opt = cmd->add_option("--prompt", opt->prompt, "Prompt as text (needs a tokenizer)");
  ids_opt->excludes(text_opt);
  cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json (default: <model>/tokenizer.json)");
  cmd->add_option("--max-tokens", opt->max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--chunk", opt->chunk, "Prefill chunk size in tokens (0 = whole prompt)");
  cmd->add_option("--temperature", opt->temperature, "0 = greedy");
  cmd->add_option("--top-p", opt->top_p, "Nucleus sampling mass");
  cmd->add_option("--top-k", opt->top_k, "Keep the k most likely tokens (-1 = all)");
  cmd->add_option("--min-p", opt->min_p, "Drop tokens below min_p × the top probability");
  cmd->add_option("--seed", opt->seed, "RNG seed (same seed ⇒ same output)");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "Keep generating after the EOS token");
  cmd->add_option("--device", opt->device, "auto (CUDA when built with it and a GPU is present), cpu or cuda")
      ->check(CLI::IsMember(device_choices()));
  return [opt]() -> int {
    SamplingParams sp;
    sp.temperature = opt->temperature;
    sp.top_p = opt->top_p;
    sp.top_k = opt->top_k;
    sp.min_p = opt->min_p;
    if (opt->seed >= 0) sp.seed = uint64_t(opt->seed);
    sp.validate();
    // Text in/out when a tokenizer is available; ids otherwise.
    std::optional<Tokenizer> tok;
    std::string tok_path = opt->tokenizer;
    if (tok_path.empty() && std::filesystem::exists(std::filesystem::path(opt->model) / "tokenizer.json"))
      tok_path = (std::filesystem::path(opt->model) / "tokenizer.json").string();
    if (!tok_path.empty()) tok = Tokenizer::from_file(tok_path);
    M3_CHECK(!opt->ids.empty() || !opt->prompt.empty(), "give --prompt-ids or --prompt");
    M3_CHECK(opt->prompt.empty() || tok, "--prompt needs a tokenizer: pass --tokenizer or put tokenizer.json in the model");
    std::vector<int32_t> ids = opt->prompt.empty() ? parse_id_list(opt->ids) : tok->encode(opt->prompt, true);
    M3_CHECK(!ids.empty(), "the prompt is empty");

    auto t_load = std::chrono::steady_clock::now();
    // Read the config first to size the CPU cache for exactly this prompt + generation.
    const M3Config probe = load_m3_config((std::filesystem::path(opt->model) / "config.json").string());
    const int64_t total = int64_t(ids.size()) + opt->max_tokens;
    const int32_t pages = int32_t((total + probe.sparse_block_size - 1) / probe.sparse_block_size);
    LoadedModel lm = load_model(opt->model, opt->device, opt->device == "cpu" ? pages : 0, pages);
    ModelExecutor& ex = *lm.executor;
    const M3Config& c = ex.config();
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    SequenceKV seq(ex.pool(), c.sparse_block_size);
    Sampler sampler(sp);

    auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = prefill(ex, seq, ids, opt->chunk, false);
    auto t1 = std::chrono::steady_clock::now();
    std::vector<int32_t> out;
    int64_t pos = int64_t(ids.size());
    std::optional<IncrementalDetokenizer> detok;
    if (tok && !opt->prompt.empty()) detok.emplace(*tok, true);
    for (int i = 0; i < opt->max_tokens; ++i) {
      int32_t next = sampler.sample(logits);
      out.push_back(next);
      if (detok) {
        std::fputs(detok->push(next).c_str(), stdout);
        std::fflush(stdout);
      }
      if (!opt->ignore_eos && next == c.eos_token_id) break;
      if (i + 1 == opt->max_tokens) break;
      seq.reserve(pos + 1);
      SeqInput in{std::span<const int32_t>(&out.back(), 1), pos, seq.pages(), false};
      logits = ex.forward(std::span<const SeqInput>(&in, 1))[0];
      ++pos;
    }
    auto t2 = std::chrono::steady_clock::now();
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    if (detok) {
      std::printf("%s\n", detok->flush().c_str());
    } else {
      std::string text;
      for (size_t i = 0; i < out.size(); ++i) text += (i ? "," : "") + std::to_string(out[i]);
      std::printf("%s\n", text.c_str());
    }
    std::fprintf(stderr,
                 "%s | loaded in %.2f s | prompt %zu tokens in %.3f s (%.1f tok/s) | generated %zu tokens in %.3f s "
                 "(%.1f tok/s)\n",
                 ex.describe().c_str(), load_s, ids.size(), prefill_s, double(ids.size()) / std::max(prefill_s, 1e-9), out.size(), decode_s,
                 double(out.size()) / std::max(decode_s, 1e-9));
    return 0;
  };
}

}  // namespace m3::app
