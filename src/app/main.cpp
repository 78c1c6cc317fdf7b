// m3serve: one binary, one subcommand per job (generate, score, tokenize, make-checkpoint, serve, ...).
#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

#include "app/commands.h"
#include "base/error.h"

int main(int argc, char** argv) {
  CLI::App app{"m3serve — inference server for MiniMax-M3 and models built like it"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, m3::app::CommandRun>> commands;
  auto add = [&](m3::app::CommandRun (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto run = reg(app);
    auto subs = app.get_subcommands({});
    if (subs.size() > before) commands.emplace_back(subs.back(), std::move(run));
  };
  add(m3::app::register_generate);
  add(m3::app::register_score);
  add(m3::app::register_tokenize);
  add(m3::app::register_serve);
  add(m3::app::register_bench_serve);
  add(m3::app::register_chat_template);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
  } catch (const m3::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
