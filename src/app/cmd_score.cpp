// m3serve score: run token ids through the model and write, per position, the top-N logits and, per sparse layer,
// the selected block ids per KV head. External checks compare this JSON against the reference implementation.
//
// Output JSON:
//   {"model": DIR, "num_tokens": T, "top": N,
//    "logits": [[[id, value], ... N], ... T],                    // descending value, ties by id
//    "selections": {"<layer>": [[[block ids ascending, local last], ... T], ... Hkv]}}
#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_runner.h"
#include "base/error.h"
#include "model/executor_factory.h"

namespace m3::app {

namespace {
struct ScoreOptions {
  std::string model;
  std::string ids;
  std::string ids_file;
  std::string out = "-";
  int top = 20;
  int64_t chunk = 0;
  std::string device = "cpu";
  LoadOptions load;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  M3_CHECK(f.good(), "cannot open {}", path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
}  // namespace

CommandRun register_score(CLI::App& app) {
  auto opt = std::make_shared<ScoreOptions>();
  auto* cmd = app.add_subcommand("score", "Score token ids: top logits per position and MSA selections (JSON)");
  cmd->add_option("--model", opt->model, "Model directory")->required();
  auto* ids = cmd->add_option("--ids", opt->ids, "Token ids: '1,2,3' or a JSON array");
  auto* file = cmd->add_option("--ids-file", opt->ids_file, "File holding the token ids");
  ids->excludes(file);
  cmd->add_option("--out", opt->out, "Output JSON file ('-' = stdout)");
  cmd->add_option("--top", opt->top, "Logits kept per position")->check(CLI::Range(1, 1000));
  cmd->add_option("--chunk", opt->chunk, "Prefill chunk size (0 = one shot); results must not depend on it");
  cmd->add_option("--device", opt->device, "cpu (reference, default), cuda or auto")
      ->check(CLI::IsMember(device_choices()));
  add_load_flags(*cmd, opt->load);
  return [opt]() -> int {
    M3_CHECK(!opt->ids.empty() || !opt->ids_file.empty(), "score: give --ids or --ids-file");
    std::vector<int32_t> ids = parse_id_list(opt->ids.empty() ? read_all(opt->ids_file) : opt->ids);
    M3_CHECK(!ids.empty(), "score: no token ids");
    const int64_t T = int64_t(ids.size());
    const std::unique_ptr<ModelExecutor> executor = make_executor(opt->model, opt->device, KvBudget{0, T}, opt->load);
    ModelExecutor& ex = *executor;
    const M3Config& c = ex.config();
    SequenceKV seq(ex.pool(), c.sparse_block_size);
    ForwardTrace trace;
    trace.capture_selection = true;
    // Selections are captured per forward call; with chunking, stitch the chunks together per layer.
    std::vector<std::vector<std::vector<std::vector<int32_t>>>> sel(c.num_layers);  // [layer][head][pos][k]
    const int64_t chunk = opt->chunk > 0 ? opt->chunk : T;
    std::vector<float> logits;
    for (int64_t s = 0; s < T; s += chunk) {
      const int64_t len = std::min(chunk, T - s);
      seq.reserve(s + len);
      SeqInput in{std::span<const int32_t>(ids.data() + s, size_t(len)), s, seq.pages(), true};
      auto out = ex.forward(std::span<const SeqInput>(&in, 1), &trace);
      logits.insert(logits.end(), out[0].begin(), out[0].end());
      const int K = c.sparse_topk_blocks;
      for (int l = 0; l < c.num_layers; ++l) {
        if (trace.selection[l].empty()) continue;
        const auto& s0 = trace.selection[l][0];  // [Hidx, len, K]
        sel[l].resize(c.index_num_heads);
        for (int h = 0; h < c.index_num_heads; ++h)
          for (int64_t i = 0; i < len; ++i) {
            std::vector<int32_t> row;
            for (int k = 0; k < K; ++k) {
              const int32_t b = s0[(size_t(h) * len + i) * K + k];
              if (b >= 0) row.push_back(b);
            }
            sel[l][h].push_back(std::move(row));
          }
      }
    }
    const int64_t V = c.vocab_size;
    const int top = std::min<int>(opt->top, int(V));
    nlohmann::json j;
    j["model"] = opt->model;
    j["num_tokens"] = T;
    j["top"] = top;
    nlohmann::json rows = nlohmann::json::array();
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t t = 0; t < T; ++t) {
      const float* lg = &logits[size_t(t * V)];
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + top, idx.end(),
                        [&](int32_t a, int32_t b) { return lg[a] != lg[b] ? lg[a] > lg[b] : a < b; });
      nlohmann::json r = nlohmann::json::array();
      for (int i = 0; i < top; ++i) r.push_back({idx[i], lg[idx[i]]});
      rows.push_back(std::move(r));
    }
    j["logits"] = std::move(rows);
    j["selections"] = nlohmann::json::object();
    for (int l = 0; l < c.num_layers; ++l)
      if (!sel[l].empty()) j["selections"][std::to_string(l)] = sel[l];
    const std::string text = j.dump();
    if (opt->out == "-") {
      std::cout << text << "\n";
    } else {
      std::ofstream f(opt->out, std::ios::binary);
      M3_CHECK(f.good(), "cannot write {}", opt->out);
      f << text << "\n";
    }
    return 0;
  };
}

}  // namespace m3::app
