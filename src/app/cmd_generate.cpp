// m3serve generate: one request through the serving engine (engine/engine.h), on the calling thread. The prompt
// is text or token ids; the output is the text (text prompt) or the generated ids, then tokens/s on stderr. Stop
// strings, stop_token_ids, min_tokens, penalties and logprobs go through the same code as `serve`: the engine's
// scheduler and sampler, and the server's per-choice stream (detokenizer + stop-string matcher).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_runner.h"
#include "base/error.h"
#include "engine/engine.h"
#include "model/executor_factory.h"
#include "server/choice_stream.h"
#include "text/tokenizer/tokenizer.h"

namespace m3::app {

namespace {
struct GenerateOptions {
  std::string model;
  std::string ids;
  std::string prompt;
  std::string tokenizer;
  int max_tokens = 32;
  int min_tokens = 0;
  int64_t chunk = 0;
  float temperature = 0.f;
  float top_p = 1.f;
  int top_k = -1;
  float min_p = 0.f;
  int64_t seed = -1;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::string stop_token_ids;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  float repetition_penalty = 1.f;
  int logprobs = -1;
  std::string device = "auto";
  LoadOptions load;
  ParallelOptions parallel;
};

GenerationParams generation_params(const GenerateOptions& o) {
  GenerationParams p;
  p.sampling.temperature = o.temperature;
  p.sampling.top_p = o.top_p;
  p.sampling.top_k = o.top_k;
  p.sampling.min_p = o.min_p;
  if (o.seed >= 0) p.sampling.seed = uint64_t(o.seed);
  p.max_tokens = o.max_tokens;
  p.min_tokens = o.min_tokens;
  p.ignore_eos = o.ignore_eos;
  if (!o.stop_token_ids.empty()) p.stop_token_ids = parse_id_list(o.stop_token_ids);
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.repetition_penalty = o.repetition_penalty;
  p.top_logprobs = o.logprobs;
  return p;
}

}  // namespace

CommandRun register_generate(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens from a prompt (one request through the engine)");
  cmd->add_option("--model", opt->model, "Model directory (config.json + safetensors)")->required();
  auto* ids_opt = cmd->add_option("--prompt-ids", opt->ids, "Prompt as token ids: '1,2,3' or a JSON array");
  auto* text_opt = cmd->add_option("--prompt", opt->prompt, "Prompt as text (needs a tokenizer)");
  ids_opt->excludes(text_opt);
  cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json (default: <model>/tokenizer.json)");
  cmd->add_option("--max-tokens", opt->max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--min-tokens", opt->min_tokens, "EOS and stop ids are suppressed before this many tokens");
  cmd->add_option("--chunk", opt->chunk, "Prefill chunk size in tokens (0 = whole prompt)");
  cmd->add_option("--temperature", opt->temperature, "0 = greedy");
  cmd->add_option("--top-p", opt->top_p, "Nucleus sampling mass");
  cmd->add_option("--top-k", opt->top_k, "Keep the k most likely tokens (-1 = all)");
  cmd->add_option("--min-p", opt->min_p, "Drop tokens below min_p × the top probability");
  cmd->add_option("--seed", opt->seed, "RNG seed (same seed ⇒ same output)");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "Keep generating after the EOS token");
  cmd->add_option("--stop", opt->stop, "Stop string (repeatable; matched on the text, needs a tokenizer)");
  cmd->add_option("--stop-token-ids", opt->stop_token_ids, "Token ids that end generation: '1,2' or a JSON array");
  cmd->add_option("--presence-penalty", opt->presence_penalty, "[-2, 2], on generated tokens");
  cmd->add_option("--frequency-penalty", opt->frequency_penalty, "[-2, 2], on generated tokens");
  cmd->add_option("--repetition-penalty", opt->repetition_penalty, "(0, 2], on prompt and generated tokens");
  cmd->add_option("--logprobs", opt->logprobs,
                  "Print each token's logprob and this many alternatives (0-20) as JSON lines after the output");
  cmd->add_option("--device", opt->device, "auto (CUDA when built with it and a GPU is present), cpu or cuda")
      ->check(CLI::IsMember(device_choices()));
  add_load_flags(*cmd, opt->load);
  add_parallel_flags(*cmd, opt->parallel);
  return [opt]() -> int {
    // Text in/out when a tokenizer is available; ids otherwise.
    std::optional<Tokenizer> tok;
    std::string tok_path = opt->tokenizer;
    if (tok_path.empty() && std::filesystem::exists(std::filesystem::path(opt->model) / "tokenizer.json"))
      tok_path = (std::filesystem::path(opt->model) / "tokenizer.json").string();
    if (!tok_path.empty()) tok = Tokenizer::from_file(tok_path);
    M3_CHECK(!opt->ids.empty() || !opt->prompt.empty(), "give --prompt-ids or --prompt");
    M3_CHECK(opt->prompt.empty() || tok, "--prompt needs a tokenizer: pass --tokenizer or put tokenizer.json in the model");
    M3_CHECK(opt->stop.empty() || tok, "--stop needs a tokenizer: pass --tokenizer or put tokenizer.json in the model");
    EngineRequest req;
    req.id = "generate";
    req.prompt = opt->prompt.empty() ? parse_id_list(opt->ids) : tok->encode(opt->prompt, true);
    req.params = generation_params(*opt);
    M3_CHECK(!req.prompt.empty(), "the prompt is empty");
    req.params.sampling.validate();
    M3_CHECK(opt->chunk >= 0, "--chunk must be 0 or positive, got {}", opt->chunk);

    EngineConfig ec;
    apply_parallel_options(opt->parallel, opt->device, ec, opt->load);  // before the weights load
    auto t_load = std::chrono::steady_clock::now();
    const int64_t total = int64_t(req.prompt.size()) + opt->max_tokens;
    const std::unique_ptr<ModelExecutor> ex = make_executor(opt->model, opt->device, KvBudget{0, total}, opt->load);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    ec.max_num_seqs = 1;
    ec.max_num_batched_tokens = int(opt->chunk > 0 ? std::min<int64_t>(opt->chunk, total) : total);
    Engine engine(*ex, ec);

    // The server's per-choice stream turns events into text and matches stop strings; without a tokenizer the
    // ids are the output.
    const bool text_out = tok && !opt->prompt.empty();
    std::optional<server::ChoiceStream> stream;
    if (tok) {
      server::ChoiceOptions co;
      co.chat = false;
      co.stop = opt->stop;
      stream.emplace(*tok, co);
    }
    std::vector<int32_t> out;
    std::vector<TokenLogprob> logprobs;
    std::string error;
    bool done = false;
    std::optional<std::chrono::steady_clock::time_point> t_first;
    const size_t prompt_len = req.prompt.size();
    engine.submit(std::move(req), [&](const EngineOutput& o) {
      if (done) return;
      if (!t_first && !o.tokens.empty()) t_first = std::chrono::steady_clock::now();
      out.insert(out.end(), o.tokens.begin(), o.tokens.end());
      logprobs.insert(logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finish == FinishReason::Error) error = o.error;
      if (stream) {
        server::ChoiceDelta d = stream->on_output(o);
        if (text_out) {
          std::fputs(d.text.c_str(), stdout);
          std::fflush(stdout);
        }
        if (d.needs_abort) engine.abort("generate");
        done = d.finished;
      } else {
        done = o.finish != FinishReason::None;
      }
    });
    auto t0 = std::chrono::steady_clock::now();
    while (engine.step()) {
    }
    auto t2 = std::chrono::steady_clock::now();
    M3_CHECK(error.empty(), "generation failed: {}", error);
    const auto t1 = t_first.value_or(t2);
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    if (text_out) {
      std::printf("\n");
    } else {
      std::string text;
      for (size_t i = 0; i < out.size(); ++i) text += (i ? "," : "") + std::to_string(out[i]);
      std::printf("%s\n", text.c_str());
    }
    for (const TokenLogprob& lp : logprobs) {
      nlohmann::json j{{"token", lp.id}, {"logprob", lp.logprob}, {"top", nlohmann::json::array()}};
      for (auto [id, l] : lp.top) j["top"].push_back({id, l});
      std::printf("%s\n", j.dump().c_str());
    }
    std::fprintf(stderr,
                 "%s | loaded in %.2f s | prompt %zu tokens in %.3f s (%.1f tok/s) | generated %zu tokens in %.3f s "
                 "(%.1f tok/s)\n",
                 ex->describe().c_str(), load_s, prompt_len, prefill_s, double(prompt_len) / std::max(prefill_s, 1e-9),
                 out.size(), decode_s, double(out.size()) / std::max(decode_s, 1e-9));
    return 0;
  };
}

}  // namespace m3::app
