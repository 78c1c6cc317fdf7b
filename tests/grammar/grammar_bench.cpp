// Mask time per decode step with a real tokenizer: `rows` requests share one json_schema grammar (as a batch of one
// client's structured-output calls does) and each step computes every row's mask and feeds it a random allowed
// token; a row that ends restarts. Prints the vocabulary build, grammar compile and per-step mask times, cold (empty
// mask cache) and warm (a second batch on the same compiled grammar).
// Usage: grammar_bench TOKENIZER_JSON [rows=32] [steps=256] [vocab_size=200064]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "grammar/json_schema.h"
#include "grammar/tokenizer_vocab.h"

using namespace m3;
using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: grammar_bench TOKENIZER_JSON [rows] [steps] [vocab_size]\n");
    return 2;
  }
  const int rows = argc > 2 ? std::atoi(argv[2]) : 32;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 256;
  const int vsize = argc > 4 ? std::atoi(argv[4]) : 200064;
  auto t0 = Clock::now();
  const Tokenizer tok = Tokenizer::from_file(argv[1]);
  std::printf("tokenizer load: %.0f ms (%zu ids)\n", ms_since(t0), tok.vocab_size());
  t0 = Clock::now();
  const int32_t eos = int32_t(tok.vocab_size()) - 1;
  auto vocab = grammar::vocab_from_tokenizer(tok, vsize, eos);
  std::printf("vocab + trie: %.0f ms (%zu trie nodes)\n", ms_since(t0), vocab->trie_nodes());
  const auto schema = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "title": {"type": "string"},
      "summary": {"type": "string"},
      "priority": {"enum": ["low", "medium", "high"]},
      "estimate_hours": {"type": "number"},
      "done": {"type": "boolean"},
      "assignees": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 4},
      "labels": {"type": "array", "items": {"type": "string"}}
    },
    "required": ["title", "summary", "priority", "estimate_hours", "done", "assignees", "labels"],
    "additionalProperties": false,
    "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer"}},
                         "required": ["name", "id"], "additionalProperties": false}}
  })");
  t0 = Clock::now();
  auto g = std::make_shared<grammar::CompiledGrammar>(grammar::json_schema_grammar(schema), vocab);
  std::printf("grammar compile: %.2f ms (%zu rules, %zu nodes)\n", ms_since(t0), g->grammar().rules().size(),
              g->grammar().num_nodes());
  const int W = vocab->words();
  std::mt19937_64 rng(7);
  std::vector<uint32_t> masks(size_t(rows) * size_t(W));
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<grammar::Matcher> ms;
    for (int r = 0; r < rows; ++r) ms.emplace_back(g);
    std::vector<double> step_ms;
    int docs = 0;
    uint64_t walks0 = g->mask_walks();
    for (int s = 0; s < steps; ++s) {
      auto t = Clock::now();
      for (int r = 0; r < rows; ++r) ms[size_t(r)].fill_mask(&masks[size_t(r) * size_t(W)]);
      step_ms.push_back(ms_since(t));
      for (int r = 0; r < rows; ++r) {
        const uint32_t* m = &masks[size_t(r) * size_t(W)];
        std::vector<int32_t> allowed;
        for (int w = 0; w < W; ++w)
          for (uint32_t x = m[w]; x; x &= x - 1) allowed.push_back(w * 32 + __builtin_ctz(x));
        const bool eos_ok = (m[eos >> 5] >> (eos & 31)) & 1;
        // Short tokens half the time, so documents finish like a model's (structure is short tokens).
        std::vector<int32_t> shortl;
        if (rng() % 2)
          for (int32_t id : allowed)
            if (id != eos && vocab->bytes(id).size() <= 2) shortl.push_back(id);
        const auto& pick = shortl.empty() ? allowed : shortl;
        const int32_t id = eos_ok ? eos : pick[rng() % pick.size()];
        ms[size_t(r)].accept_token(id);
        if (ms[size_t(r)].finished()) {
          ++docs;
          ms[size_t(r)] = grammar::Matcher(g);
        }
      }
    }
    std::vector<double> sorted = step_ms;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double x : step_ms) sum += x;
    std::printf(
        "%s: %d rows x %d steps: mask/step mean %.3f ms, p50 %.3f, p90 %.3f, p99 %.3f, max %.3f ms; "
        "%llu trie walks, %zu states, %d documents\n",
        pass == 0 ? "cold" : "warm", rows, steps, sum / steps, sorted[sorted.size() / 2],
        sorted[sorted.size() * 9 / 10], sorted[sorted.size() * 99 / 100], sorted.back(),
        (unsigned long long)(g->mask_walks() - walks0), g->num_states(), docs);
  }
  // One walk of the most permissive state (inside a string).
  {
    auto g2 = std::make_shared<grammar::CompiledGrammar>(grammar::json_schema_grammar(schema), vocab);
    grammar::Matcher m(g2);
    m.accept_bytes(R"({"title": "ab)");
    auto t = Clock::now();
    m.fill_mask(masks.data());
    const double cold = ms_since(t);
    t = Clock::now();
    m.fill_mask(masks.data());
    std::printf("inside a string: first mask %.3f ms (trie walk), cached %.4f ms\n", cold, ms_since(t));
  }
  return 0;
}
