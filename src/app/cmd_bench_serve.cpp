// m3serve bench-serve: a load client for any OpenAI-compatible server, in the style of `vllm bench serve`.
// Sends streaming /v1/completions requests at a fixed concurrency and reports TTFT, TPOT, ITL and E2E latency
// and throughput. Traffic shapes (random, shared-prefix, agentic, long), prompt formats and the JSON summary are
// described in src/app/bench_client.h, which holds the client; this file only declares the options.
#include "app/bench_client.h"
#include "app/commands.h"

namespace m3::app {

CommandRun register_bench_serve(CLI::App& app) {
  auto o = std::make_shared<bench::BenchOptions>();
  auto* cmd = app.add_subcommand("bench-serve", "Load-test an OpenAI-compatible server (like `vllm bench serve`)");
  cmd->add_option("--base-url", o->base_url, "Server URL")->capture_default_str();
  cmd->add_option("--model", o->model, "Model name (default: the first of /v1/models)");
  cmd->add_option("--traffic", o->traffic,
                  "random | shared-prefix | agentic | long (default: shared-prefix when --shared-prefix-len > 0, "
                  "else random)")
      ->check(CLI::IsMember({"random", "shared-prefix", "agentic", "long"}));
  cmd->add_option("--prompt-format", o->prompt_format,
                  "ids: token-id prompts (exact lengths); text: words the server's /tokenize maps to about the "
                  "asked token count")
      ->check(CLI::IsMember({"ids", "text"}))
      ->capture_default_str();
  cmd->add_option("--num-prompts", o->num_prompts, "Requests to send (random / shared-prefix)")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--max-concurrency,--concurrency", o->max_concurrency, "Requests in flight at most")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--random-input-len", o->input_len, "Prompt tokens (random mode)")->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--random-output-len,--output-len", o->output_len,
                  "max_tokens per request (default: agentic 300, otherwise 64)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--shared-prefix-len", o->shared_prefix_len,
                  "Shared-prefix mode when > 0: common prefix tokens per group; agentic: the shared prefix "
                  "(default 60000)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--suffix-len", o->suffix_len, "Shared-prefix mode: random suffix tokens per request")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--suffix-len-min", o->suffix_len_min, "Agentic: fewest new tokens per turn")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--suffix-len-max", o->suffix_len_max, "Agentic: most new tokens per turn")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--turns", o->turns, "Agentic: turns per session (run one after another)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--num-sessions", o->num_sessions, "Agentic: sessions (default: --concurrency)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Long mode: prompt tokens of the one request")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->capture_default_str();
  cmd->add_option("--num-groups", o->num_groups, "Shared-prefix mode: prefix groups (requests round-robin)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--token-id-low", o->token_low, "Random prompt ids are drawn from [low, high)");
  cmd->add_option("--token-id-high", o->token_high, "Random prompt ids are drawn from [low, high)");
  cmd->add_flag("--ignore-eos,!--no-ignore-eos", o->ignore_eos, "Generate exactly --random-output-len tokens");
  cmd->add_flag("--warmup,!--no-warmup", o->warmup,
                "Agentic / shared-prefix: send each shared prefix once, untimed, before the run (default on)");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for prompts (and request seeds)")->capture_default_str();
  cmd->add_option("--max-duration", o->max_duration,
                  "Seconds after which no new request starts (in-flight ones finish); 0 = no limit")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--metrics-interval", o->metrics_interval,
                  "Seconds between GET /metrics polls for the peak KV use; 0 = before and after only")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--output-file", o->output_file, "Write one JSON line per request here");
  cmd->add_option("--json", o->json_file, "Write the summary (and server metrics) as one JSON object here");
  cmd->add_option("--tag", o->tags, "KEY=VALUE copied into the JSON summary's tags (repeatable)");

  return [o]() -> int { return bench::run_bench(*o); };
}

}  // namespace m3::app
