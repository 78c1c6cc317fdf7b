// Jinja parser: tokens -> AST. Follows jinja2/parser.py's grammar and operator precedence:
//   condexpr(a if c else b) < or < and < not < compare(== != < <= > >= in, not in) < + - < ~
//   < * / // % < ** < unary - + < primary/postfix(. [] ()) with filters |f and tests `is` bound
//   to the unary operand.
// Unknown filters/tests and unsupported tags are rejected here, with the template line, so a bad
// template fails when the server loads it rather than on the first request.
#include <set>

#include "text/jinja/jinja_internal.h"

namespace m3::jinja {

// Defined in jinja_eval.cpp: the names the evaluator implements.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

namespace {

constexpr int kMaxNesting = 200;  // expression/statement nesting limit (stack safety on hostile input)

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const std::string& name) : t_(toks), name_(name) {}

  Body parse_all() {
    Body b = parse_statements({});
    if (cur().type != Tok::Eof) fail_here("unexpected token");
    return b;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }

  [[noreturn]] void fail_at(const Token& t, const std::string& msg) const {
    fail("{}:{}:{}: {}", name_, t.line, t.col, msg);
  }
  [[noreturn]] void fail_here(const std::string& msg) const { fail_at(cur(), msg + " " + describe(cur())); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Data: return "(template data)";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "'}}'";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::Name: return "'" + t.text + "'";
      case Tok::String: return "string literal";
      case Tok::Int:
      case Tok::Float: return "number '" + t.text + "'";
      case Tok::Op: return "'" + t.text + "'";
      case Tok::Eof: return "end of template";
    }
    return "?";
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_here(fmt::format("expected '{}', got", op));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail_here("expected a name, got");
    std::string s = cur().text;
    next();
    return s;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail_here("expected end of statement block, got");
    next();
  }

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* pp) : p(pp) {
      if (++p->depth_ > kMaxNesting) p->fail_here("template nesting too deep near");
    }
    ~DepthGuard() { --p->depth_; }
  };

  ExprPtr make(EK k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---------------------------------------------------------------------------- statements

  // Parses until a block tag whose name is in `ends` (left unconsumed: cur() is that name token).
  Body parse_statements(std::initializer_list<const char*> ends) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (ends.size() == 0) return body;
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
        fail_at(tk, "unexpected end of template; looking for " + want);
      }
      if (tk.type == Tok::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Data;
        s->line = tk.line;
        s->text = tk.text;
        body.push_back(std::move(s));
        next();
        continue;
      }
      if (tk.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Output;
        s->line = tk.line;
        s->expr = parse_tuple(false, true, {});
        if (cur().type != Tok::VarEnd) fail_here("expected end of print statement, got");
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (tk.type == Tok::BlockBegin) {
        const Token& nm = peek();
        if (nm.type != Tok::Name) {
          next();
          fail_here("expected a statement name, got");
        }
        for (const char* e : ends)
          if (nm.text == e) {
            next();  // leave cur() at the name
            return body;
          }
        next();
        body.push_back(parse_statement());
        continue;
      }
      fail_here("unexpected");
    }
  }

  StmtPtr parse_statement() {
    DepthGuard g(this);
    const Token& nt = cur();
    const std::string tag = nt.text;
    const int line = nt.line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    next();
    if (tag == "if") {
      s->kind = SK::If;
      s->conds.push_back(parse_tuple(false, true, {}));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_statements({"elif", "else", "endif"}));
        std::string which = cur().text;
        next();
        if (which == "elif") {
          s->conds.push_back(parse_tuple(false, true, {}));
          expect_block_end();
          continue;
        }
        if (which == "else") {
          expect_block_end();
          s->else_body = parse_statements({"endif"});
          next();
        }
        expect_block_end();
        break;
      }
      return s;
    }
    if (tag == "for") {
      s->kind = SK::For;
      parse_targets(*s, false);
      if (!is_name("in")) fail_here("expected 'in', got");
      next();
      s->expr = parse_tuple(false, false, {"recursive"});
      if (is_name("if")) {
        next();
        s->cond = parse_expression(true);
      }
      if (is_name("recursive")) fail_at(cur(), "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_statements({"endfor", "else"});
      --loop_depth_;
      if (cur().text == "else") {
        next();
        expect_block_end();
        s->else_body = parse_statements({"endfor"});
      }
      next();
      expect_block_end();
      return s;
    }
    if (tag == "set") {
      parse_targets(*s, true);
      if (is_op("=")) {
        next();
        s->kind = SK::Set;
        s->expr = parse_tuple(false, true, {});
        expect_block_end();
        return s;
      }
      if (s->tuple_target || !s->attr.empty()) fail_here("block set needs a single name target; got");
      s->kind = SK::SetBlock;
      if (is_op("|")) s->expr = parse_filter(nullptr, false);
      expect_block_end();
      s->body = parse_statements({"endset"});
      next();
      expect_block_end();
      return s;
    }
    if (tag == "macro") {
      s->kind = SK::Macro;
      s->text = expect_name();
      parse_params(*s);
      expect_block_end();
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_statements({"endmacro"});
      loop_depth_ = saved;
      next();
      expect_block_end();
      return s;
    }
    if (tag == "call") {
      s->kind = SK::CallBlock;
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != EK::Call) fail_at(nt, "expected a call expression in {% call %}");
      expect_block_end();
      s->body = parse_statements({"endcall"});
      next();
      expect_block_end();
      return s;
    }
    if (tag == "filter") {
      s->kind = SK::FilterBlock;
      s->expr = parse_filter(nullptr, true);
      expect_block_end();
      s->body = parse_statements({"endfilter"});
      next();
      expect_block_end();
      return s;
    }
    if (tag == "with") {
      s->kind = SK::With;
      while (cur().type != Tok::BlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_name());
        expect_op("=");
        s->values.push_back(parse_expression(true));
      }
      expect_block_end();
      s->body = parse_statements({"endwith"});
      next();
      expect_block_end();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(nt, "'" + tag + "' outside of a for loop");
      s->kind = tag == "break" ? SK::Break : SK::Continue;
      expect_block_end();
      return s;
    }
    if (tag == "generation") {
      // transformers' AssistantTracker extension: marks assistant spans; renders its body verbatim.
      expect_block_end();
      s->kind = SK::With;
      s->body = parse_statements({"endgeneration"});
      next();
      expect_block_end();
      return s;
    }
    static const std::set<std::string> unsupported = {"extends", "block",      "include", "import", "from",
                                                      "autoescape", "do",     "trans",   "raw",    "print"};
    if (unsupported.count(tag)) fail_at(nt, "unsupported template tag '" + tag + "'");
    fail_at(nt, "unknown template tag '" + tag + "'");
  }

  void parse_targets(Stmt& s, bool allow_ns) {
    bool paren = false;
    if (is_op("(")) {
      paren = true;
      next();
    }
    s.targets.push_back(expect_name());
    if (allow_ns && !paren && is_op(".")) {
      next();
      s.attr = expect_name();
      return;
    }
    while (is_op(",")) {
      next();
      s.tuple_target = true;
      if (paren && is_op(")")) break;
      if (cur().type != Tok::Name) break;
      s.targets.push_back(expect_name());
    }
    if (paren) {
      s.tuple_target = true;
      expect_op(")");
    }
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (is_op("=")) {
        next();
        p.def = parse_expression(true);
      } else {
        for (auto& q : s.params)
          if (q.def) fail_here("non-default argument follows default argument near");
      }
      s.params.push_back(std::move(p));
    }
    next();
  }

  // ---------------------------------------------------------------------------- expressions

  bool tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& c = cur();
    if (c.type == Tok::VarEnd || c.type == Tok::BlockEnd || c.type == Tok::Eof) return true;
    if (c.type == Tok::Op && c.text == ")") return true;
    if (c.type == Tok::Name)
      for (auto& e : extra_end)
        if (c.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool explicit_parens, bool with_condexpr, const std::vector<std::string>& extra_end) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      args.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail_here("expected an expression, got");
    }
    auto e = make(EK::Tuple, line);
    e->items = std::move(args);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = cur().line;
      next();
      ExprPtr c = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        next();
        other = parse_expression(true);
      }
      auto n = make(EK::Cond, line);
      n->items.push_back(std::move(e));
      n->items.push_back(std::move(c));
      if (other) n->items.push_back(std::move(other));
      e = std::move(n);
    }
    return e;
  }

  ExprPtr bin(EK k, ExprPtr a, ExprPtr b, int line, std::string op = {}) {
    auto n = make(k, line);
    n->a = std::move(a);
    n->b = std::move(b);
    n->name = std::move(op);
    return n;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      next();
      l = bin(EK::Or, std::move(l), parse_and(), line);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      next();
      l = bin(EK::And, std::move(l), parse_not(), line);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(this);
      int line = cur().line;
      next();
      auto n = make(EK::Not, line);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        ops.push_back(cur().text);
        next();
      } else if (is_name("in")) {
        ops.push_back("in");
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return e;
    auto n = make(EK::Compare, line);
    n->a = std::move(e);
    n->ops = std::move(ops);
    n->items = std::move(rest);
    return n;
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      l = bin(EK::Binary, std::move(l), parse_concat(), line, op);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      next();
      l = bin(EK::Binary, std::move(l), parse_math2(), line, "~");
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      next();
      l = bin(EK::Binary, std::move(l), parse_pow(), line, op);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      next();
      l = bin(EK::Binary, std::move(l), parse_unary(true), line, "**");
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(this);
    int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      EK k = is_op("-") ? EK::Neg : EK::Pos;
      next();
      node = make(k, line);
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == Tok::Name) {
      const std::string& n = tk.text;
      auto e = make(EK::Literal, line);
      if (n == "true" || n == "True") {
        e->lit = true;
      } else if (n == "false" || n == "False") {
        e->lit = false;
      } else if (n == "none" || n == "None") {
        e->lit = nullptr;
      } else {
        e->kind = EK::Name;
        e->name = n;
      }
      next();
      return e;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) {
        s += cur().text;
        next();
      }
      auto e = make(EK::Literal, line);
      e->lit = std::move(s);
      return e;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      auto e = make(EK::Literal, line);
      if (tk.type == Tok::Int)
        e->lit = tk.ival;
      else
        e->lit = tk.fval;
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, true, {});
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(EK::List, line);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(EK::Dict, line);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    fail_here("unexpected");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& tk = cur();
    int line = tk.line;
    if (is_op(".")) {
      next();
      if (cur().type == Tok::Name) {
        auto e = make(EK::GetAttr, line);
        e->a = std::move(node);
        e->name = cur().text;
        next();
        return e;
      }
      if (cur().type == Tok::Int) {
        auto e = make(EK::GetItem, line);
        e->a = std::move(node);
        e->b = make(EK::Literal, line);
        e->b->lit = cur().ival;
        next();
        return e;
      }
      fail_here("expected name or number after '.', got");
    }
    next();  // '['
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    next();
    if (args.size() != 1) fail_at(tk, "tuple subscripts are not supported");
    if (args[0]->kind == EK::Slice) {
      args[0]->a = std::move(node);
      return std::move(args[0]);
    }
    auto e = make(EK::GetItem, line);
    e->a = std::move(node);
    e->b = std::move(args[0]);
    return e;
  }

  // One subscript: an expression or a slice [start:stop:step].
  ExprPtr parse_subscribed() {
    int line = cur().line;
    ExprPtr start;
    if (is_op(":")) {
      next();
    } else {
      start = parse_expression(true);
      if (!is_op(":")) return start;
      next();
    }
    auto sl = make(EK::Slice, line);
    sl->items.resize(3);
    sl->items[0] = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) sl->items[1] = parse_expression(true);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) sl->items[2] = parse_expression(true);
    }
    return sl;
  }

  void parse_call_args(CallArgs& args) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail_here("*args / **kwargs call syntax is not supported:");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = cur().text;
        next();
        next();
        args.kw.emplace_back(k, parse_expression(true));
      } else {
        if (!args.kw.empty()) fail_here("positional argument after keyword argument near");
        args.pos.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(EK::Call, cur().line);
    e->a = std::move(node);
    parse_call_args(e->args);
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& nt = cur();
      std::string name = expect_name();
      while (is_op(".")) {
        next();
        name += "." + expect_name();
      }
      if (!has_filter(name)) fail_at(nt, "no filter named '" + name + "' (unsupported or unknown)");
      auto e = make(EK::Filter, nt.line);
      e->a = std::move(node);
      e->name = name;
      if (is_op("(")) parse_call_args(e->args);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = cur().line;
    next();  // 'is'
    bool negated = false;
    if (is_name("not")) {
      negated = true;
      next();
    }
    const Token& nt = cur();
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    if (!has_test(name)) fail_at(nt, "no test named '" + name + "' (unsupported or unknown)");
    auto e = make(EK::Test, line);
    e->a = std::move(node);
    e->name = name;
    e->negated = negated;
    if (is_op("(")) {
      parse_call_args(e->args);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                cur().type == Tok::Float || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail_here("you cannot chain multiple tests with 'is':");
      ExprPtr arg = parse_postfix(parse_primary());
      e->args.pos.push_back(std::move(arg));
    }
    return e;
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_program(const std::vector<Token>& toks, const std::string& name) {
  Parser p(toks, name);
  return p.parse_all();
}

}  // namespace m3::jinja
