// Constrained decoding through the Engine on the tiny random model (CPU executor): a json_schema request always
// ends with EOS in a document the reference validator accepts, whatever the (random) model prefers.
#include <gtest/gtest.h>

#include <mutex>

#include "../grammar/reference_validator.h"
#include "engine/engine.h"
#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "test_model_util.h"

namespace m3 {
namespace {

using json = nlohmann::ordered_json;

// 97 ids: 0 = EOS (special), then JSON's characters and a few multi-byte pieces.
std::shared_ptr<const grammar::TokenVocab> tiny_vocab(int size) {
  std::vector<std::string> b{"<eos>"};
  for (char ch : std::string("{}[]\":, \n0123456789-.+eEabcdefghijklmnopqrstuvwxyz")) b.push_back(std::string(1, ch));
  for (const char* f :
       {"true",  "false", "null", "{\"", "\":",      "\", \"", "\"}",  "\\n",  "\\u00e9", "\xc3\xa9", "bb\"",
        "\"a\"", ", ",    "  ",   "12",  "\"id\": ", "\"ok\"", "kind", "tags", "[\"",     "\"]"})
    b.push_back(f);
  while (int(b.size()) < size) b.push_back("zz");
  std::vector<uint8_t> usable(b.size(), 1);
  usable[0] = 0;
  return std::make_shared<const grammar::TokenVocab>(std::move(b), std::move(usable), 0, size);
}

TEST(EngineGrammar, JsonSchemaRequestsAlwaysReturnSchemaValidJson) {
  M3Config c = test::tiny_config();
  c.eos_token_id = 0;
  M3Model model(c, test::random_weights(c, 11));
  Engine e(model, EngineConfig{.num_pages = 64});
  const json schema = json::parse(R"({"type": "object", "properties": {
      "id": {"type": "integer"}, "ok": {"type": "boolean"}, "kind": {"enum": ["a", "bb"]},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
      "required": ["id", "ok", "kind"], "additionalProperties": false})");
  auto vocab = tiny_vocab(int(c.vocab_size));
  auto spec = std::make_shared<grammar::ConstraintSpec>();
  spec->grammar = std::make_shared<grammar::CompiledGrammar>(grammar::json_schema_grammar(schema), vocab);
  std::mutex mu;
  std::map<std::string, std::pair<std::vector<int32_t>, FinishReason>> out;
  const int n = 6;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt = test::random_ids(12, int(c.vocab_size), 50 + uint64_t(i));
    r.params.max_tokens = 1000;
    r.params.sampling.temperature = i == 0 ? 0.f : 1.5f;  // greedy and hot sampling alike
    r.params.sampling.seed = 1000 + uint64_t(i);
    r.constraint = spec;
    e.submit(std::move(r), [&, id = "r" + std::to_string(i)](const EngineOutput& o) {
      std::lock_guard<std::mutex> lk(mu);
      auto& [toks, fin] = out[id];
      toks.insert(toks.end(), o.tokens.begin(), o.tokens.end());
      fin = o.finish;
    });
  }
  while (e.step()) {
  }
  ASSERT_EQ(out.size(), size_t(n));
  EXPECT_GE(e.metrics().grammar_masks, uint64_t(n));  // counted for /metrics
  for (auto& [id, res] : out) {
    auto& [toks, fin] = res;
    EXPECT_EQ(fin, FinishReason::Stop) << id;
    ASSERT_FALSE(toks.empty());
    EXPECT_EQ(toks.back(), 0) << id << ": ends with EOS";
    std::string text;
    for (size_t k = 0; k + 1 < toks.size(); ++k) text += vocab->bytes(toks[k]);
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << id << ": " << text;
    EXPECT_TRUE(test::schema_valid(doc, schema, schema)) << id << ": " << text;
  }
  // Without the constraint the same model writes no JSON at all (the test can fail).
  EngineRequest free;
  free.id = "free";
  free.prompt = test::random_ids(12, int(c.vocab_size), 50);
  free.params.max_tokens = 40;
  free.params.sampling.temperature = 0.f;
  std::vector<int32_t> ft;
  e.submit(std::move(free), [&](const EngineOutput& o) { ft.insert(ft.end(), o.tokens.begin(), o.tokens.end()); });
  while (e.step()) {
  }
  std::string ftext;
  for (int32_t t : ft) ftext += vocab->bytes(t);
  EXPECT_TRUE(json::parse(ftext, nullptr, false).is_discarded()) << ftext;
}

TEST(EngineGrammar, AVocabularyThatCannotContinueTheDocumentEndsTheRequestWithAnErrorNotOffGrammarTokens) {
  // The key must be "a", but the vocabulary has '"' and no token starting with 'a': after '{"' no token continues.
  M3Config c = test::tiny_config();
  c.eos_token_id = 0;
  M3Model model(c, test::random_weights(c, 12));
  Engine e(model, EngineConfig{.num_pages = 64});
  std::vector<std::string> b{"<eos>", "{", "\"", "}", ":", "1"};
  while (int(b.size()) < int(c.vocab_size)) b.push_back("zz");
  std::vector<uint8_t> usable(b.size(), 1);
  usable[0] = 0;
  auto vocab = std::make_shared<const grammar::TokenVocab>(b, usable, 0, int(c.vocab_size));
  const json schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": false})");
  auto spec = std::make_shared<grammar::ConstraintSpec>();
  spec->grammar = std::make_shared<grammar::CompiledGrammar>(grammar::json_schema_grammar(schema), vocab);
  std::vector<int32_t> toks;
  FinishReason fin = FinishReason::None;
  std::string error;
  EngineRequest r;
  r.id = "dead";
  r.prompt = test::random_ids(8, int(c.vocab_size), 3);
  r.params.max_tokens = 50;
  r.params.sampling.temperature = 0.f;
  r.constraint = spec;
  e.submit(std::move(r), [&](const EngineOutput& o) {
    toks.insert(toks.end(), o.tokens.begin(), o.tokens.end());
    fin = o.finish, error = o.error;
  });
  while (e.step()) {
  }
  EXPECT_EQ(fin, FinishReason::Error);
  EXPECT_NE(error.find("no token of the vocabulary continues the grammar"), std::string::npos) << error;
  std::string text;
  for (int32_t t : toks) text += vocab->bytes(t);
  EXPECT_EQ(text, "{\"") << "only the tokens the grammar accepted were emitted";
  EXPECT_EQ(e.metrics().requests_error, 1u);
}

}  // namespace
}  // namespace m3
