// Subcommands of the single `m3serve` binary. Each lives in its own cmd_*.cpp and registers itself with
// the CLI11 app; the returned callback runs when that subcommand was chosen and returns the exit code.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace m3::app {

using CommandRun = std::function<int()>;

CommandRun register_generate(CLI::App& app);        // m3serve generate --model DIR
CommandRun register_score(CLI::App& app);           // m3serve score --model DIR --ids ...
CommandRun register_tokenize(CLI::App& app);        // m3serve tokenize --tokenizer FILE [--decode]
CommandRun register_serve(CLI::App& app);           // m3serve serve --model DIR
CommandRun register_bench_serve(CLI::App& app);     // m3serve bench-serve --base-url URL
CommandRun register_chat_template(CLI::App& app);   // m3serve chat-template --model DIR --request FILE

}  // namespace m3::app
