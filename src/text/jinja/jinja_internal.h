// Internals of the Jinja renderer (jinja.h): tokens, AST, runtime values and Python-semantics helpers.
// Shared by jinja_lexer.cpp, jinja_parser.cpp, jinja_value.cpp and jinja_eval.cpp only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "text/jinja/jinja.h"

namespace m3::jinja {

// ---------------------------------------------------------------------------------------------------
// Lexer

enum class Tok : uint8_t {
  Data,        // literal template text (already whitespace-controlled)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // text = decoded value
  Int,
  Float,
  Op,          // text = operator spelling
  Eof,
};

struct Token {
  Tok type = Tok::Eof;
  std::string text;
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
  int col = 1;
};

// Normalises newlines, applies trim/lstrip rules, drops comments, turns {% raw %} into data.
std::vector<Token> lex(const std::string& source, const std::string& name, const Options& opts);

// ---------------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct CallArgs {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
};

enum class EK : uint8_t {
  Literal,   // lit
  Name,      // name
  List,      // items
  Tuple,     // items
  Dict,      // items (key, value, key, value...)
  GetAttr,   // a . name
  GetItem,   // a [ b ]
  Slice,     // a [ items[0] : items[1] : items[2] ] (null entries = omitted)
  Call,      // a ( args )
  Filter,    // a | name ( args )   (a may be null inside {% filter %})
  Test,      // a is [not] name ( args )
  Neg, Pos, Not,
  Binary,    // op: + - * / // % ** ~
  And, Or,
  Compare,   // a op b op c ...  (ops + items)
  Cond,      // items: then, cond, else(optional)
};

struct Expr {
  EK kind;
  int line = 0;
  Json lit;
  std::string name;              // Name / GetAttr attr / Filter / Test name / Binary op
  bool negated = false;          // Test
  ExprPtr a, b;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;  // Compare
  CallArgs args;                 // Call / Filter / Test
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class SK : uint8_t {
  Data,      // text
  Output,    // {{ expr }}
  If,        // conds[i] -> bodies[i]; else_body
  For,       // targets in expr [if cond]; body; else_body
  Set,       // targets (or ns attr) = expr
  SetBlock,  // {% set x %}body{% endset %} (optional filter expr applied)
  Macro,     // name(params) body
  CallBlock, // {% call(params) expr %} body
  FilterBlock,
  With,      // set_targets/values then body
  Break,
  Continue,
};

struct MacroParam {
  std::string name;
  ExprPtr def;  // may be null
};

struct Stmt {
  SK kind;
  int line = 0;
  std::string text;                    // Data text; Macro name; Set ns name
  std::string attr;                    // Set: ns attribute when assigning ns.attr
  ExprPtr expr;                        // Output/For iterable/Set value/CallBlock call/FilterBlock filter/SetBlock filter
  ExprPtr cond;                        // For filter condition
  std::vector<std::string> targets;    // For/Set targets; With names
  std::vector<ExprPtr> values;         // With values
  std::vector<ExprPtr> conds;          // If conditions (if + elifs)
  std::vector<Body> bodies;            // If bodies
  Body body, else_body;
  std::vector<MacroParam> params;      // Macro / CallBlock
  bool tuple_target = false;           // For/Set target written as a tuple
};

struct Program {
  std::string name;
  Options opts;
  Body body;
};

Body parse_program(const std::vector<Token>& toks, const std::string& name);

// ---------------------------------------------------------------------------------------------------
// Runtime values

struct Namespace;
struct Callable;
struct LoopInfo;

struct Value {
  enum class Kind : uint8_t { Undefined, Data, Namespace, Callable, Loop };
  Kind kind = Kind::Undefined;
  std::shared_ptr<const Json> data;  // Data: may alias into a larger document
  std::shared_ptr<Namespace> ns;
  std::shared_ptr<Callable> fn;
  std::shared_ptr<LoopInfo> loop;
  std::string hint;  // Undefined: the jinja2-style message used when the value is misused
  // Python tuples print as (a, b). JSON has no tuples, so the shape of a Data array is tracked on the
  // value: 1 = a tuple, 2 = a list of tuples (dict.items()). Lost once stored inside another container.
  uint8_t shape = 0;

  static Value undefined(std::string hint) {
    Value v;
    v.hint = std::move(hint);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::Data;
    v.data = std::make_shared<const Json>(std::move(j));
    return v;
  }
  // A child of `parent`'s document, sharing ownership (no copy).
  static Value child(const Value& parent, const Json* node) {
    Value v;
    v.kind = Kind::Data;
    v.data = std::shared_ptr<const Json>(parent.data, node);
    return v;
  }
  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_data() const { return kind == Kind::Data; }
  const Json& j() const { return *data; }
  bool is_string() const { return is_data() && data->is_string(); }
  bool is_none() const { return is_data() && data->is_null(); }
  bool is_list() const { return is_data() && data->is_array(); }
  bool is_dict() const { return is_data() && data->is_object(); }
  bool is_bool() const { return is_data() && data->is_boolean(); }
  bool is_int() const { return is_data() && (data->is_number_integer()); }
  bool is_float() const { return is_data() && data->is_number_float(); }
  // Python numbers: bool is an int subclass.
  bool is_number() const { return is_data() && (data->is_number() || data->is_boolean()); }
  const std::string& str() const { return data->get_ref<const std::string&>(); }
};

struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(const std::string& k) {
    for (auto& [n, v] : attrs)
      if (n == k) return &v;
    return nullptr;
  }
};

struct CallValues {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
};

class Evaluator;
struct Callable {
  std::string name;
  std::function<Value(Evaluator&, CallValues&)> fn;
};

struct LoopInfo {
  std::shared_ptr<std::vector<Value>> items;
  int64_t index0 = 0;
  int depth0 = 0;
};

// ---------------------------------------------------------------------------------------------------
// Python semantics (jinja_value.cpp)

bool py_truthy(const Value& v);
std::string py_str(const Value& v);         // str(x)
std::string py_repr_json(const Json& j);    // repr(x) for data
std::string py_float_repr(double d);
bool py_eq(const Value& a, const Value& b);
bool py_eq_json(const Json& a, const Json& b);
// Python `<`; returns false and sets ok=false if the types are not orderable.
bool py_less_json(const Json& a, const Json& b, bool& ok);
double num_as_double(const Json& j);
int64_t num_as_int(const Json& j);  // ints and bools

// Python json.dumps(x, ensure_ascii=False, indent=?, separators=?, sort_keys=?)
struct DumpOpts {
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string py_json_dumps(const Json& j, const DumpOpts& o);

// UTF-8 helpers: Python strings index by code point.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);
bool py_isspace_cp(uint32_t cp);
uint32_t utf8_decode_at(std::string_view s, size_t& i);  // advances i
void utf8_append(std::string& out, uint32_t cp);
std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s);

}  // namespace m3::jinja
