// m3serve tokenize --tokenizer FILE [--decode] [--no-special]
// Reads stdin line by line and writes one JSON line per input line:
//   encode: input is a JSON string, a JSON object {"text": ...}, or (if the line is not JSON) the raw
//           line itself; output is the JSON array of ids.
//   decode: input is a JSON array of ids (or {"ids": [...]}); output is the decoded JSON string.
// --no-special: encode without add_special_tokens / decode with skip_special_tokens.
// A bad line yields {"error": "..."} and the command goes on with the next line.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "base/error.h"
#include "text/tokenizer/tokenizer.h"

namespace m3::app {

namespace {

struct TokenizeOptions {
  std::string tokenizer_path;
  bool decode = false;
  bool no_special = false;
};

std::string encode_line(const Tokenizer& tok, const std::string& line, bool add_special) {
  std::string text;
  bool parsed = false;
  if (!line.empty() && (line[0] == '"' || line[0] == '{')) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.is_string()) {
        text = j.get<std::string>();
        parsed = true;
      } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
        text = j["text"].get<std::string>();
        parsed = true;
      } else {
        fail("expected a JSON string or an object with a \"text\" string");
      }
    } catch (const nlohmann::json::exception&) {
      parsed = false;
    }
  }
  if (!parsed) text = line;
  nlohmann::json out = tok.encode(text, add_special);
  return out.dump();
}

std::string decode_line(const Tokenizer& tok, const std::string& line, bool skip_special) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail("not JSON: {}", e.what());
  }
  if (j.is_object() && j.contains("ids")) j = j["ids"];
  if (!j.is_array()) fail("expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (auto& x : j) {
    if (!x.is_number_integer()) fail("token ids must be integers");
    int64_t v = x.get<int64_t>();
    if (v < 0 || v > INT32_MAX) fail("token id {} out of range", v);
    ids.push_back(int32_t(v));
  }
  nlohmann::json out = tok.decode(ids, skip_special);
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

CommandRun register_tokenize(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand("tokenize", "Encode (or --decode) stdin lines with a HuggingFace tokenizer.json");
  sub->add_option("--tokenizer", opts->tokenizer_path, "path to tokenizer.json")->required();
  sub->add_flag("--decode", opts->decode, "input lines are JSON arrays of ids; print the decoded text");
  sub->add_flag("--no-special", opts->no_special,
                "encode without special tokens (BOS/EOS) / decode skipping special tokens");
  return [opts] {
    Tokenizer tok = Tokenizer::from_file(opts->tokenizer_path);
    std::ios::sync_with_stdio(false);
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::string out;
      try {
        out = opts->decode ? decode_line(tok, line, opts->no_special) : encode_line(tok, line, !opts->no_special);
      } catch (const Error& e) {
        out = nlohmann::json{{"error", e.what()}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }
      std::cout << out << '\n';
    }
    std::cout.flush();
    return 0;
  };
}

}  // namespace m3::app
