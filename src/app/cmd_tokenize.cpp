// Placeholder until the tokenizer lands; the text I/O work replaces this file.
#include "app/commands.h"
#include "base/error.h"

namespace m3::app {

CommandRun register_tokenize(CLI::App& app) {
  app.add_subcommand("tokenize", "Tokenize stdin with a HuggingFace tokenizer.json (not built yet)");
  return [] { m3::fail("tokenize: not implemented yet"); return 1; };
}

}  // namespace m3::app
