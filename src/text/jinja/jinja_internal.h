// Internals of the Jinja renderer (jinja.h): tokens, AST, runtime values and Python-semantics helpers.
// Shared by jinja_lexer.cpp, jinja_parser.cpp, jinja_value.cpp and jinja_eval.cpp only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
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

// ---------------------------------------------------------------------------------------------------
// The evaluator (jinja_eval.cpp: globals, attributes, operators, expressions, statements; jinja_methods.cpp:
// Python str/dict/list methods and %-formatting; jinja_filters.cpp: filters and tests)

enum class Flow { Normal, Break, Continue };

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find(const std::string& n) {
    for (auto& [k, v] : vars)
      if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    if (Value* p = find(n))
      *p = std::move(v);
    else
      vars.emplace_back(n, std::move(v));
  }
};
using FramePtr = std::shared_ptr<Frame>;

// Python type name of a value, for error messages ("int", "str", "Undefined", ...).
std::string type_name(const Value& v);

// Shared by the methods and the filters / tests (jinja_methods.cpp).
std::string py_capitalize(std::string_view s);
std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count);
bool str_pred(const std::string& s, int which);  // str.isalpha() & co.; `which` indexes string_method's table
// Python printf-style formatting: fmt % args (`mapping` set for "%(name)s" forms).
std::string py_percent_format(Evaluator& ev, const std::string& fmt, const std::vector<Value>& args,
                              const Value* mapping, int line);

using FilterFn = Value (*)(Evaluator&, const Value&, CallValues&);
using TestFn = bool (*)(Evaluator&, const Value&, CallValues&);
const std::unordered_map<std::string, FilterFn>& filters();
const std::unordered_map<std::string, TestFn>& tests();

class Evaluator {
 public:
  Evaluator(const Program& p, const Json& ctx) : prog_(p) {
    // Non-owning (aliasing with an empty owner): the caller's context outlives the render.
    root_data_.kind = Value::Kind::Data;
    root_data_.data = std::shared_ptr<const Json>(std::shared_ptr<const Json>(), &ctx);
    root_ = std::make_shared<Frame>();
    install_globals();
  }

  std::string run() {
    std::string out;
    exec(prog_.body, root_, out);
    return out;
  }

  // ------------------------------------------------------------------------------------ errors
  [[noreturn]] void rt_fail(int line, const std::string& msg) const {
    fail("{}:{}: {}", prog_.name, line, msg);
  }
  void need(const Value& v, int line) const {
    if (v.is_undefined()) rt_fail(line, v.hint);
  }
  int line() const { return cur_line_; }

  // ------------------------------------------------------------------------------------ helpers
  static const Value* arg(CallValues& a, size_t idx, const char* name) {
    if (idx < a.pos.size()) return &a.pos[idx];
    for (auto& [k, v] : a.kw)
      if (k == name) return &v;
    return nullptr;
  }

  std::string as_string(const Value& v) const { return py_str(v); }

  Json to_json(const Value& v, int line) const {
    if (v.is_data()) return v.j();
    if (v.is_undefined()) return nullptr;
    rt_fail(line, "a " + type_name(v) + " value cannot be stored in a list or dict");
  }

  std::vector<Value> iterate(const Value& v, int line) const {
    std::vector<Value> r;
    if (v.is_undefined()) return r;
    if (!v.is_data()) rt_fail(line, "'" + type_name(v) + "' object is not iterable");
    const Json& j = v.j();
    if (j.is_array()) {
      r.reserve(j.size());
      for (const auto& e : j) {
        r.push_back(Value::child(v, &e));
        if (v.shape == 2) r.back().shape = 1;
      }
    } else if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) r.push_back(Value::of(it.key()));
    } else if (j.is_string()) {
      for (auto c : utf8_chars(v.str())) r.push_back(Value::of(std::string(c)));
    } else {
      rt_fail(line, "'" + type_name(v) + "' object is not iterable");
    }
    return r;
  }

  static Value list_value(const std::vector<Value>& items, const Evaluator& ev, int line) {
    Json arr = Json::array();
    bool all_tuples = !items.empty();
    for (auto& x : items) {
      arr.push_back(ev.to_json(x, line));
      all_tuples = all_tuples && x.shape == 1;
    }
    Value v = Value::of(std::move(arr));
    if (all_tuples) v.shape = 2;
    return v;
  }

  void check_size(size_t n, int line) const {
    if (n > prog_.opts.max_output_bytes) rt_fail(line, "template output exceeds the size limit");
  }

  // ------------------------------------------------------------------------------------ lookups
  Value lookup(const std::string& name, const FramePtr& f) {
    for (Frame* fr = f.get(); fr; fr = fr->parent.get())
      if (Value* v = fr->find(name)) return *v;
    const Json& ctx = root_data_.j();
    auto it = ctx.find(name);
    if (it != ctx.end()) return Value::child(root_data_, &*it);
    auto g = globals_.find(name);
    if (g != globals_.end()) return g->second;
    return Value::undefined("'" + name + "' is undefined");
  }

  Value bound(std::string name, std::function<Value(Evaluator&, CallValues&)> fn) {
    Value v;
    v.kind = Value::Kind::Callable;
    v.fn = std::make_shared<Callable>();
    v.fn->name = std::move(name);
    v.fn->fn = std::move(fn);
    return v;
  }

  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
  Value string_method(const Value& obj, const std::string& name);
  Value dict_method(const Value& obj, const std::string& name);
  Value list_method(const Value& obj, const std::string& name);
  Value loop_attr(const Value& obj, const std::string& name);

  // ------------------------------------------------------------------------------------ eval
  Value eval(const Expr& e, const FramePtr& f);
  Value call(const Value& callee, CallValues& args, int line) {
    if (callee.kind == Value::Kind::Callable) {
      args.line = line;
      int saved = cur_line_;
      cur_line_ = line;
      Value r = callee.fn->fn(*this, args);
      cur_line_ = saved;
      return r;
    }
    need(callee, line);
    rt_fail(line, "'" + type_name(callee) + "' object is not callable");
  }
  void eval_args(const CallArgs& a, const FramePtr& f, CallValues& out) {
    for (auto& p : a.pos) out.pos.push_back(eval(*p, f));
    for (auto& [k, v] : a.kw) out.kw.emplace_back(k, eval(*v, f));
  }
  Value apply_filter(const Expr& e, const Value& input, const FramePtr& f) {
    CallValues args;
    eval_args(e.args, f, args);
    args.line = e.line;
    int saved = cur_line_;
    cur_line_ = e.line;
    Value r = filters().at(e.name)(*this, input, args);
    cur_line_ = saved;
    return r;
  }
  // A filter chain whose innermost input is `input` (for {% filter %} and {% set x | f %}).
  Value apply_filter_chain(const Expr& e, const Value& input, const FramePtr& f) {
    Value in = e.a ? apply_filter_chain(*e.a, input, f) : input;
    return apply_filter(e, in, f);
  }
  bool run_test(const std::string& name, const Value& v, CallValues& args, int line) {
    args.line = line;
    int saved = cur_line_;
    cur_line_ = line;
    bool r = tests().at(name)(*this, v, args);
    cur_line_ = saved;
    return r;
  }
  Value binary(const std::string& op, const Value& l, const Value& r, int line);
  bool compare(const std::string& op, const Value& l, const Value& r, int line);
  bool contains(const Value& container, const Value& item, int line);
  Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line);

  // ------------------------------------------------------------------------------------ exec
  Flow exec(const Body& body, const FramePtr& f, std::string& out);
  void bind_targets(const Stmt& s, const Value& v, Frame& f);
  Value make_macro(const Stmt& s, const FramePtr& def_frame);
  Value invoke_macro(const Stmt& s, const std::vector<MacroParam>& params, const Body& body,
                     const FramePtr& def_frame, CallValues& args, const std::string& name);

  const Program& prog_;
  int depth_ = 0;
  int cur_line_ = 0;

 private:
  void install_globals();

  Value root_data_;
  FramePtr root_;
  std::unordered_map<std::string, Value> globals_;
};

}  // namespace m3::jinja
