// src/grammar: schema compiler units, masks against the step function and against a reference validator
// (reference_validator.h), the M3 tool-call grammar and the reasoning phases of a Constraint.
#include <gtest/gtest.h>

#include <random>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "reference_validator.h"

namespace m3::grammar {
namespace {

using json = nlohmann::ordered_json;

// Bytes 1..255 as single tokens, then multi-byte fragments like a BPE vocabulary's, then three specials.
struct TestVocab {
  std::shared_ptr<const TokenVocab> vocab;
  int32_t eos = -1, think_begin = -1, think_end = -1;
};
TestVocab make_vocab() {
  std::vector<std::string> b(256);
  for (int i = 1; i < 256; ++i) b[size_t(i)] = std::string(1, char(i));
  for (const char* f : {"{\"",
                        "\":",
                        "\": ",
                        "\", \"",
                        "\"}",
                        "\"]",
                        "true",
                        "false",
                        "null",
                        "12",
                        "3.5",
                        "\n  ",
                        " \"",
                        "},",
                        "}",
                        "]}",
                        "[{",
                        "\\u00",
                        "\\n",
                        "e+",
                        "\xc3\xa9",
                        "\xe4\xb8\xad",
                        "\xe4\xb8",
                        "\xad\"",
                        "\xf0\x9f\x98\x80",
                        "name",
                        "age",
                        "\"name\"",
                        "\": \"",
                        "\"a\": ",
                        ", ",
                        "0,",
                        "-1",
                        "]<]minimax[>[",
                        "<tool_call>",
                        "<invoke name=\"",
                        "get_weather",
                        "\">",
                        "</invoke>",
                        "</tool_call>",
                        "<city>",
                        "</city>",
                        "<days>",
                        "</days>",
                        "]<",
                        "Paris",
                        "\n",
                        "</mm:",
                        "think>",
                        "x</mm:think>{"})
    b.push_back(f);
  std::vector<uint8_t> usable(b.size(), 1);
  usable[0] = 0;
  TestVocab v;
  for (const char* sp : {"<eos>", "<mm:think>", "</mm:think>"}) {
    b.push_back(sp);
    usable.push_back(0);
  }
  v.eos = int32_t(b.size() - 3);
  v.think_begin = v.eos + 1;
  v.think_end = v.eos + 2;
  v.vocab = std::make_shared<const TokenVocab>(std::move(b), std::move(usable), v.eos, int32_t(v.eos + 8));
  return v;
}
const TestVocab& vocab() {
  static const TestVocab v = make_vocab();
  return v;
}

std::shared_ptr<CompiledGrammar> compile(const json& schema) {
  return std::make_shared<CompiledGrammar>(json_schema_grammar(schema), vocab().vocab);
}

// Whether the whole text is a complete document of the grammar.
bool complete(const std::shared_ptr<CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) && m.accepting();
}

const json kPerson = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 3},
    "email": {"type": ["string", "null"]},
    "home": {"$ref": "#/$defs/place"}
  },
  "required": ["name", "age", "tags"],
  "additionalProperties": false,
  "$defs": {"place": {"type": "object", "properties": {"city": {"const": "Paris"}, "zip": {"type": "number"}},
                      "required": ["city"]}}
})");

TEST(JsonSchemaGrammar, AcceptsValidDocumentsInSchemaOrder) {
  auto g = compile(kPerson);
  EXPECT_TRUE(complete(g, R"({"name": "Ann", "age": 3, "tags": ["a"]})"));
  EXPECT_TRUE(complete(g, R"({"name":"A\"n\\n\u00e9 \u4e2d","age":0,"tags":["b",3,"a"],"email":null})"));
  EXPECT_TRUE(complete(g,
                       "{\n  \"name\": \"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\",\n  \"age\": 12,\n  \"tags\": [3],"
                       "\n  \"home\": {\"city\": \"Paris\", \"zip\": -1.5e+10}\n}\n"));
}

TEST(JsonSchemaGrammar, RejectsInvalidDocuments) {
  auto g = compile(kPerson);
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3})"));                             // required tags missing
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": -3, "tags": ["a"]})"));             // minimum 0
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3.5, "tags": ["a"]})"));            // integer
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3, "tags": []})"));                 // minItems
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3, "tags": ["a","a","a","a"]})"));  // maxItems
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3, "tags": ["c"]})"));              // enum
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3, "tags": ["a"], "x": 1})"));      // additionalProperties
  EXPECT_FALSE(complete(g, R"({"name": "A\q", "age": 3, "tags": ["a"]})"));              // bad escape
  EXPECT_FALSE(complete(g, "{\"name\": \"a\nb\", \"age\": 3, \"tags\": [\"a\"]}"));      // raw control character
  EXPECT_FALSE(complete(g, "{\"name\": \"\xc3\", \"age\": 3, \"tags\": [\"a\"]}"));      // broken UTF-8
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 01, "tags": ["a"]})"));             // leading zero
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3, "tags": ["a"], "home": {"city": "Rome"}})"));  // const
  EXPECT_FALSE(complete(g, R"({"name": "Ann", "age": 3, "tags": ["a"])"));                             // unfinished
  EXPECT_FALSE(complete(g, std::string(R"({"name": "Ann", "age": 3, "tags": ["a"]})") + std::string(40, ' ')));
}

TEST(JsonSchemaGrammar, RecursiveRefAnyOfAndOptionalProperties) {
  const json tree = json::parse(R"({
    "$ref": "#/definitions/node",
    "definitions": {"node": {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
      "required": ["v"]}}})");
  auto g = compile(tree);
  EXPECT_TRUE(complete(g, R"({"v": 1, "kids": [{"v": true}, {"v": 2, "kids": [{"v": false, "kids": []}]}]})"));
  EXPECT_FALSE(complete(g, R"({"v": "s"})"));
  EXPECT_FALSE(complete(g, R"({"kids": []})"));
  // Only optional properties: the empty object and any subset in order; commas exactly between.
  auto o = compile(json::parse(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                   "c": {"type": "integer"}}})"));
  for (const char* ok : {"{}", R"({"a":1})", R"({"b":1})", R"({"c":1})", R"({"a":1,"c":2})", R"({"b":1,"c":2})",
                         R"({"a":1,"b":2,"c":3})"})
    EXPECT_TRUE(complete(o, ok)) << ok;
  for (const char* bad : {R"({,"a":1})", R"({"a":1,})", R"({"b":1,"a":2})", R"({"a":1 "b":2})"})
    EXPECT_FALSE(complete(o, bad)) << bad;
}

TEST(JsonSchemaGrammar, ManyOptionalPropertiesStayLinear) {
  json props = json::object();
  for (int i = 0; i < 400; ++i) props["p" + std::to_string(i)] = {{"type", "integer"}};
  const Grammar gr = json_schema_grammar(json{{"type", "object"}, {"properties", props}});
  EXPECT_LT(gr.num_nodes(), 20000u);
  auto g = std::make_shared<CompiledGrammar>(Grammar(gr), vocab().vocab);
  EXPECT_TRUE(complete(g, R"({"p399": 1})"));
  EXPECT_TRUE(complete(g, R"({"p3": 1, "p250": 2})"));
  EXPECT_FALSE(complete(g, R"({"p250": 2, "p3": 1})"));
}

TEST(JsonSchemaGrammar, IntegerRangesAreExact) {
  const std::pair<const char*, std::pair<int, int>> cases[] = {
      {R"({"type": "integer", "minimum": -30, "maximum": 250})", {-30, 250}},
      {R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", {1, 9}},
      {R"({"type": "integer", "minimum": 5})", {5, 1 << 30}},
      {R"({"type": "integer", "maximum": -3})", {-(1 << 30), -3}},
      {R"({"type": "integer", "minimum": 1.5, "maximum": 99.5})", {2, 99}},
      {R"({"type": "integer", "minimum": 100, "maximum": 100})", {100, 100}},
  };
  for (auto [schema, r] : cases) {
    auto g = compile(json::parse(schema));
    for (int v = -1200; v <= 1200; ++v)
      EXPECT_EQ(complete(g, std::to_string(v)), v >= r.first && v <= r.second) << schema << " " << v;
    EXPECT_FALSE(complete(g, "-0"));
    EXPECT_FALSE(complete(g, "007"));
  }
  auto big = compile(json::parse(R"({"type": "integer", "minimum": 10})"));
  EXPECT_TRUE(complete(big, "99999999999999999"));  // 17 digits, the most the grammar writes
  EXPECT_FALSE(complete(big, "100000000000000000"));
}

TEST(JsonSchemaGrammar, StringLengthsAndFreeObjects) {
  auto s = compile(json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  EXPECT_FALSE(complete(s, R"("a")"));
  EXPECT_TRUE(complete(s, "\"a\xc3\xa9\""));
  EXPECT_TRUE(complete(s, R"("a\nb")"));
  EXPECT_FALSE(complete(s, R"("abcd")"));
  auto m = compile(json::parse(R"({"type": "object", "additionalProperties": {"type": "boolean"}})"));
  EXPECT_TRUE(complete(m, R"({"x": true, "y": false})"));
  EXPECT_FALSE(complete(m, R"({"x": 1})"));
  auto any = std::make_shared<CompiledGrammar>(json_object_grammar(), vocab().vocab);
  EXPECT_TRUE(complete(any, R"({"a": [1, {"b": null}, "x", -0.5e-3], "c": {}})"));
  EXPECT_FALSE(complete(any, R"([1])"));
  EXPECT_FALSE(complete(any, R"({"a": tru})"));
}

TEST(JsonSchemaGrammar, RefusesUnsupportedKeywordsNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "string", "pattern": "^a$"})", "pattern"},
      {R"({"type": "string", "format": "date-time"})", "format"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", "allOf"},
      {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
      {R"({"type": "number", "minimum": 5})", "minimum"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "range"},
      {R"({"type": "number", "maximum": 5})", "maximum"},
      {R"({"$ref": "https://example.com/s.json"})", "$ref"},
      {R"({"$ref": "#/$defs/missing"})", "$ref"},
      {R"({"type": "object", "properties": {"a": {"not": {}}}})", "not"},
      {R"({"type": "object", "required": ["a"]})", "required"},
      {R"({"type": "array", "maxItems": 100000})", "maxItems"},
  };
  for (auto [schema, word] : cases) {
    try {
      json_schema_grammar(json::parse(schema));
      ADD_FAILURE() << "accepted " << schema;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(std::make_shared<CompiledGrammar>(
                   json_schema_grammar(json::parse(R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})")),
                   vocab().vocab),
               m3::Error);  // left recursion
}

// Every mask bit agrees with feeding that token to a copy of the matcher, along random walks.
TEST(TokenMask, EqualsTheStepFunctionOnEveryToken) {
  std::mt19937_64 rng(1);
  const auto& v = vocab();
  for (const json& schema : {kPerson, json::parse(R"({"type": "object"})")}) {
    auto g = compile(schema);
    std::vector<uint32_t> mask(size_t(v.vocab->words()));
    for (int walk = 0; walk < 20; ++walk) {
      Matcher m(g);
      for (int step = 0; step < 60 && !m.terminal(); ++step) {
        m.fill_mask(mask.data());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < v.vocab->size(); ++id) {
          const bool bit = (mask[size_t(id) >> 5] >> (id & 31)) & 1;
          Matcher copy = m;
          const bool ok = copy.accept_token(id);
          ASSERT_EQ(bit, ok) << "token " << id << " at step " << step;
          if (bit && id != v.eos) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
      }
    }
  }
}

// Random walks over the allowed tokens end in documents the reference validator accepts.
TEST(TokenMask, RandomWalksProduceSchemaValidJson) {
  std::mt19937_64 rng(2);
  const auto& v = vocab();
  const json schemas[] = {
      kPerson,
      json::parse(R"({"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string",
                     "maxLength": 4}, "n": {"type": "number"}}, "required": ["n"]}, "maxItems": 4})"),
      json::parse(R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}},
                      "required": ["a", "b"]}]})"),
      json::parse(R"({"type": "object"})"),
  };
  std::vector<uint32_t> mask(size_t(v.vocab->words()));
  for (const json& schema : schemas) {
    auto g = compile(schema);
    int finished = 0;
    for (int walk = 0; walk < 150; ++walk) {
      Matcher m(g);
      std::string text;
      for (int step = 0; step < 400; ++step) {
        m.fill_mask(mask.data());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < v.vocab->size(); ++id)
          if ((mask[size_t(id) >> 5] >> (id & 31)) & 1) allowed.push_back(id);
        ASSERT_FALSE(allowed.empty()) << text;
        const bool eos_ok = (mask[size_t(v.eos) >> 5] >> (v.eos & 31)) & 1;
        ASSERT_EQ(eos_ok, m.accepting());
        const int32_t id = eos_ok && rng() % 3 == 0 ? v.eos : allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(id));
        if (id == v.eos) break;
        text += v.vocab->bytes(id);
      }
      if (!m.finished()) continue;
      ++finished;
      const json doc = json::parse(text, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << text;
      EXPECT_TRUE(test::schema_valid(doc, schema, schema)) << schema.dump() << "\n" << text;
      // Mutations of the document: whatever the grammar still accepts as complete, the validator accepts too.
      static const std::string kBytes = "{}[]\",:0-.eE9a \\\n\xc3";
      for (int k = 0; k < 20; ++k) {
        std::string t = text;
        const size_t at = rng() % (t.size() + 1);
        const char b = kBytes[rng() % kBytes.size()];
        switch (rng() % 3) {
          case 0:
            if (at < t.size()) t[at] = b;
            break;
          case 1:
            if (at < t.size()) t.erase(at, 1);
            break;
          default:
            t.insert(at, 1, b);
        }
        if (!complete(g, t)) continue;
        const json mdoc = json::parse(t, nullptr, false);
        ASSERT_FALSE(mdoc.is_discarded()) << t;
        EXPECT_TRUE(test::schema_valid(mdoc, schema, schema)) << schema.dump() << "\n" << t;
      }
    }
    EXPECT_GT(finished, 50) << schema.dump();
  }
}

TEST(TokenMask, CachesOneMaskPerState) {
  auto g = compile(kPerson);
  Matcher m(g);
  ASSERT_TRUE(m.accept_bytes(R"({"name": "abc)"));
  std::vector<uint32_t> mask(size_t(vocab().vocab->words()));
  m.fill_mask(mask.data());
  const uint64_t walks = g->mask_walks();
  ASSERT_TRUE(m.accept_bytes("defgh"));  // same string state: no new walk
  m.fill_mask(mask.data());
  EXPECT_EQ(g->mask_walks(), walks);
  Matcher other(g);  // another request with the same grammar shares the cache
  ASSERT_TRUE(other.accept_bytes(R"({"name": "z)"));
  other.fill_mask(mask.data());
  EXPECT_EQ(g->mask_walks(), walks);
}

TEST(ToolCallGrammar, AcceptsM3InvokesWithTypedParameters) {
  const json params = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}, "units": {"enum": ["c", "f"]},
      "opts": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
      "list": {"type": "array", "items": {"type": "number"}}}, "required": ["city", "days"]})");
  auto g = std::make_shared<CompiledGrammar>(
      m3_tool_call_grammar({{"get_weather", params}, {"now", json()}}, /*parallel=*/true), vocab().vocab);
  const std::string ns = "]<]minimax[>[";
  auto call = [&](const std::string& body) { return ns + "<tool_call>\n" + body + "\n" + ns + "</tool_call>"; };
  const std::string weather = ns + "<invoke name=\"get_weather\">" + ns + "<city>Paris [x] a]b" + ns + "</city>" + ns +
                              "<days>3" + ns + "</days>";
  EXPECT_TRUE(complete(g, call(weather + ns + "</invoke>")));
  EXPECT_TRUE(
      complete(g, call(weather + ns + "<units>f" + ns + "</units>" + ns + "<opts>" + ns + "<x>true" + ns + "</x>" + ns +
                       "</opts>" + ns + "<list>" + ns + "<item>1.5" + ns + "</item>" + ns + "<item>2" + ns + "</item>" +
                       ns + "</list>" + ns + "</invoke>\n" + ns + "<invoke name=\"now\">" + ns + "</invoke>")));
  EXPECT_FALSE(complete(g, call(ns + "<invoke name=\"other\">" + ns + "</invoke>")));  // unknown tool
  EXPECT_FALSE(complete(g, call(ns + "<invoke name=\"get_weather\">" + ns + "<city>P" + ns + "</city>" + ns +
                                "</invoke>")));  // days required
  EXPECT_FALSE(complete(g, call(ns + "<invoke name=\"get_weather\">" + ns + "<city>P" + ns + "</city>" + ns +
                                "<days>three" + ns + "</days>" + ns + "</invoke>")));  // integer
  EXPECT_FALSE(complete(g, "Sure! " + call(weather + ns + "</invoke>")));              // text first
  // Keywords a tool's schema may carry that the compiler cannot express do not refuse the request: the type holds.
  const json loose = json::parse(R"({"type": "object", "properties": {"n": {"type": "integer", "maximum": 9,
      "format": "int32"}, "u": {"type": "string", "format": "uri", "pattern": "^h"}}, "required": ["n", "u"]})");
  auto lg = std::make_shared<CompiledGrammar>(m3_tool_call_grammar({{"f", loose}}, false), vocab().vocab);
  const std::string head = ns + "<tool_call>\n" + ns + "<invoke name=\"f\">" + ns + "<n>";
  EXPECT_TRUE(complete(lg, head + "7" + ns + "</n>" + ns + "<u>x" + ns + "</u>" + ns + "</invoke>\n" + ns +
                               "</tool_call>"));
  EXPECT_FALSE(complete(lg, head + "12" + ns + "</n>" + ns + "<u>x" + ns + "</u>" + ns + "</invoke>\n" + ns +
                                "</tool_call>"));  // integer bounds hold
  EXPECT_FALSE(complete(lg, head + "1.5" + ns + "</n>" + ns + "<u>x" + ns + "</u>" + ns + "</invoke>\n" + ns +
                                "</tool_call>"));
  auto single = std::make_shared<CompiledGrammar>(m3_tool_call_grammar({{"now", json()}}, false), vocab().vocab);
  const std::string now = ns + "<invoke name=\"now\">" + ns + "</invoke>";
  EXPECT_TRUE(complete(single, call(now)));
  EXPECT_FALSE(complete(single, call(now + "\n" + now)));  // parallel_tool_calls false: one call
}

TEST(Constraint, ReasoningIsFreeUntilTheEndMarkerEvenSplitAcrossTokens) {
  const auto& v = vocab();
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = compile(json::parse(R"({"type": "integer"})"));
  spec->start = ConstraintSpec::Start::InReasoning;
  spec->think_begin_id = v.think_begin;
  spec->think_end_id = v.think_end;
  auto id_of = [&](std::string_view s) {
    for (int32_t i = 0; i < int32_t(v.vocab->num_tokens()); ++i)
      if (v.vocab->bytes(i) == s) return i;
    return -1;
  };
  Constraint c(spec);
  EXPECT_FALSE(c.active());
  for (std::string_view piece : {"h", "m", "</mm:", "t", "h", "i", "n", "k"}) EXPECT_TRUE(c.accept(id_of(piece)));
  EXPECT_FALSE(c.active());
  EXPECT_TRUE(c.accept(id_of(">")));
  EXPECT_TRUE(c.active());
  EXPECT_FALSE(c.accept(id_of("a")));
  EXPECT_TRUE(c.accept(id_of("12")));
  EXPECT_TRUE(c.accept(v.eos));
  // Text after the marker inside the same token goes to the grammar: "x</mm:think>{" leaves "{", not an integer.
  Constraint d(spec);
  EXPECT_TRUE(d.accept(id_of("x</mm:think>{")));
  EXPECT_TRUE(d.active());
  // The special token ends reasoning too.
  Constraint e(spec);
  EXPECT_TRUE(e.accept(v.think_end));
  EXPECT_TRUE(e.active());
}

TEST(Constraint, AdaptiveStartAllowsTheThinkMarkersFirst) {
  const auto& v = vocab();
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = compile(json::parse(R"({"type": "boolean"})"));
  spec->start = ConstraintSpec::Start::Adaptive;
  spec->think_begin_id = v.think_begin;
  spec->think_end_id = v.think_end;
  std::vector<uint32_t> mask(size_t(v.vocab->words()));
  Constraint c(spec);
  ASSERT_TRUE(c.active());
  c.fill_mask(mask.data());
  EXPECT_TRUE((mask[size_t(v.think_begin) >> 5] >> (v.think_begin & 31)) & 1);
  EXPECT_TRUE((mask[size_t(v.think_end) >> 5] >> (v.think_end & 31)) & 1);
  EXPECT_TRUE(c.accept(v.think_begin));
  EXPECT_FALSE(c.active());
  EXPECT_TRUE(c.accept(v.think_end));
  ASSERT_TRUE(c.active());
  c.fill_mask(mask.data());
  EXPECT_FALSE((mask[size_t(v.think_end) >> 5] >> (v.think_end & 31)) & 1);  // only at the start
  Constraint d(spec);
  EXPECT_TRUE(d.accept(v.think_end));
  Matcher copy = d.matcher();
  EXPECT_TRUE(copy.accept_bytes("true"));
}

}  // namespace
}  // namespace m3::grammar
