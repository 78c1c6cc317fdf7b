#include "grammar/grammar.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>

#include "base/error.h"

namespace m3::grammar {

// ---- expressions --------------------------------------------------------------------------------------------------
Expr empty() { return Expr{}; }
Expr range(uint8_t lo, uint8_t hi) {
  Expr e;
  e.kind = Expr::Range;
  e.lo = lo;
  e.hi = hi;
  return e;
}
Expr byte(uint8_t b) { return range(b, b); }
Expr lit(std::string_view bytes) {
  std::vector<Expr> k;
  for (char c : bytes) k.push_back(byte(uint8_t(c)));
  return seq(std::move(k));
}
Expr cls(std::string_view pairs, bool negate) {
  M3_CHECK(pairs.size() % 2 == 0, "grammar: character class needs byte pairs");
  std::vector<uint8_t> in(256, 0);
  for (size_t i = 0; i < pairs.size(); i += 2)
    for (int b = uint8_t(pairs[i]); b <= uint8_t(pairs[i + 1]); ++b) in[size_t(b)] = 1;
  std::vector<Expr> k;
  for (int b = 0; b < 256;) {
    if (bool(in[size_t(b)]) == negate) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && bool(in[size_t(e + 1)]) != negate) ++e;
    k.push_back(range(uint8_t(b), uint8_t(e)));
    b = e + 1;
  }
  return k.size() == 1 ? k[0] : alt(std::move(k));
}
Expr ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Ref;
  e.rule = rule;
  return e;
}
Expr seq(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Expr::Seq;
  e.kids = std::move(kids);
  return e;
}
Expr alt(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Expr::Alt;
  e.kids = std::move(kids);
  return e;
}
Expr star(Expr x) {
  Expr e;
  e.kind = Expr::Star;
  e.kids.push_back(std::move(x));
  return e;
}
Expr plus(Expr x) {
  Expr s = star(x);
  return seq({std::move(x), std::move(s)});
}
Expr opt(Expr x) { return alt({std::move(x), empty()}); }
Expr rep(const Expr& x, int min, int max) {
  M3_CHECK(min >= 0 && (max < 0 || max >= min), "grammar: bad repetition {{{},{}}}", min, max);
  std::vector<Expr> k(size_t(min), x);
  if (max < 0) {
    k.push_back(star(x));
  } else {
    // Nested optionals: x (x (x)?)?)? — no ambiguity about which copy is which.
    Expr tail = empty();
    for (int i = min; i < max; ++i) tail = opt(tail.kind == Expr::Empty ? x : seq({x, tail}));
    k.push_back(std::move(tail));
  }
  return seq(std::move(k));
}

// ---- Grammar ------------------------------------------------------------------------------------------------------
int32_t Grammar::add_rule(std::string name) {
  rules_.push_back(RuleNfa{std::move(name), {}, {}});
  defined_.push_back(0);
  return int32_t(rules_.size() - 1);
}

int32_t Grammar::find_rule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return int32_t(i);
  return -1;
}

size_t Grammar::num_nodes() const {
  size_t n = 0;
  for (const auto& r : rules_) n += r.edges.size();
  return n;
}

namespace {

struct Thompson {
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<int32_t>> eps;
  int32_t add() {
    edges.emplace_back();
    eps.emplace_back();
    return int32_t(edges.size() - 1);
  }
  int32_t build(const Expr& e, int32_t from) {
    switch (e.kind) {
      case Expr::Empty:
        return from;
      case Expr::Range: {
        const int32_t n = add();
        edges[size_t(from)].push_back(Edge{e.lo, e.hi, -1, n});
        return n;
      }
      case Expr::Ref: {
        const int32_t n = add();
        edges[size_t(from)].push_back(Edge{0, 0, e.rule, n});
        return n;
      }
      case Expr::Seq: {
        int32_t cur = from;
        for (const Expr& k : e.kids) cur = build(k, cur);
        return cur;
      }
      case Expr::Alt: {
        const int32_t end = add();
        for (const Expr& k : e.kids) {
          const int32_t s = add();
          eps[size_t(from)].push_back(s);
          const int32_t ke = build(k, s);
          eps[size_t(ke)].push_back(end);
        }
        return end;
      }
      case Expr::Star: {
        const int32_t s = add();
        eps[size_t(from)].push_back(s);
        const int32_t ke = build(e.kids[0], s);
        eps[size_t(ke)].push_back(s);
        return s;
      }
    }
    return from;
  }
};

bool edge_less(const Edge& a, const Edge& b) {
  return std::tie(a.rule, a.lo, a.hi, a.to) < std::tie(b.rule, b.lo, b.hi, b.to);
}
bool edge_eq(const Edge& a, const Edge& b) { return a.rule == b.rule && a.lo == b.lo && a.hi == b.hi && a.to == b.to; }

}  // namespace

void Grammar::define(int32_t rule, const Expr& body) {
  M3_CHECK(rule >= 0 && size_t(rule) < rules_.size(), "grammar: no rule {}", rule);
  Thompson t;
  t.add();
  const int32_t end = t.build(body, 0);
  const size_t n = t.edges.size();
  // Remove epsilons: a node gets the byte / call edges of its ε-closure and is final when the closure holds `end`.
  std::vector<std::vector<Edge>> edges(n);
  std::vector<uint8_t> fin(n, 0);
  std::vector<int32_t> mark(n, -1), work;
  for (size_t i = 0; i < n; ++i) {
    work.assign(1, int32_t(i));
    mark[i] = int32_t(i);
    while (!work.empty()) {
      const int32_t c = work.back();
      work.pop_back();
      if (c == end) fin[i] = 1;
      edges[i].insert(edges[i].end(), t.edges[size_t(c)].begin(), t.edges[size_t(c)].end());
      for (int32_t d : t.eps[size_t(c)])
        if (mark[size_t(d)] != int32_t(i)) mark[size_t(d)] = int32_t(i), work.push_back(d);
    }
    std::sort(edges[i].begin(), edges[i].end(), edge_less);
    edges[i].erase(std::unique(edges[i].begin(), edges[i].end(), edge_eq), edges[i].end());
  }
  // Keep the nodes reachable from the start, renumbered in discovery order.
  std::vector<int32_t> id(n, -1);
  std::vector<int32_t> order{0};
  id[0] = 0;
  for (size_t k = 0; k < order.size(); ++k)
    for (const Edge& e : edges[size_t(order[k])])
      if (id[size_t(e.to)] < 0) id[size_t(e.to)] = int32_t(order.size()), order.push_back(e.to);
  const size_t m = order.size();
  std::vector<std::vector<Edge>> ren(m);
  std::vector<uint8_t> rfin(m);
  for (size_t k = 0; k < m; ++k) {
    for (Edge e : edges[size_t(order[k])]) {
      e.to = id[size_t(e.to)];
      ren[k].push_back(e);
    }
    rfin[k] = fin[size_t(order[k])];
  }
  // Merge nodes that behave alike (same finality, same edges to the same classes; partition refinement to a
  // fixpoint): e.g. the end nodes of a string's character alternatives all loop back the same way. Fewer nodes
  // means fewer distinct matcher states, so fewer mask walks.
  std::vector<int32_t> cls(m);
  for (size_t k = 0; k < m; ++k) cls[k] = rfin[k];
  size_t count = 0;
  for (;;) {
    std::map<std::pair<int32_t, std::vector<std::tuple<int, int, int32_t, int32_t>>>, int32_t> sig_ids;
    std::vector<int32_t> next(m);
    for (size_t k = 0; k < m; ++k) {
      std::vector<std::tuple<int, int, int32_t, int32_t>> sig;
      for (const Edge& e : ren[k]) sig.emplace_back(e.lo, e.hi, e.rule, cls[size_t(e.to)]);
      std::sort(sig.begin(), sig.end());
      sig.erase(std::unique(sig.begin(), sig.end()), sig.end());
      auto key = std::make_pair(cls[k], std::move(sig));  // the previous class keeps the refinement monotone
      auto it = sig_ids.find(key);
      if (it == sig_ids.end()) it = sig_ids.emplace(std::move(key), int32_t(sig_ids.size())).first;
      next[k] = it->second;
    }
    const size_t n_cls = sig_ids.size();
    cls.swap(next);
    if (n_cls == count) break;
    count = n_cls;
  }
  // Renumber the classes with the start's first.
  std::vector<int32_t> cid(count, -1);
  int32_t n_new = 0;
  cid[size_t(cls[0])] = n_new++;
  for (size_t k = 0; k < m; ++k)
    if (cid[size_t(cls[k])] < 0) cid[size_t(cls[k])] = n_new++;
  RuleNfa& r = rules_[size_t(rule)];
  r.edges.assign(size_t(n_new), {});
  r.final.assign(size_t(n_new), 0);
  std::vector<uint8_t> done(size_t(n_new), 0);
  for (size_t k = 0; k < m; ++k) {
    const int32_t c = cid[size_t(cls[k])];
    if (done[size_t(c)]) continue;
    done[size_t(c)] = 1;
    for (Edge e : ren[k]) {
      e.to = cid[size_t(cls[size_t(e.to)])];
      r.edges[size_t(c)].push_back(e);
    }
    std::sort(r.edges[size_t(c)].begin(), r.edges[size_t(c)].end(), edge_less);
    r.edges[size_t(c)].erase(std::unique(r.edges[size_t(c)].begin(), r.edges[size_t(c)].end(), edge_eq),
                             r.edges[size_t(c)].end());
    r.final[size_t(c)] = rfin[k];
  }
  defined_[size_t(rule)] = 1;
}

void Grammar::check() const {
  M3_CHECK(root_ >= 0 && size_t(root_) < rules_.size(), "grammar: no root rule");
  for (size_t i = 0; i < rules_.size(); ++i) {
    M3_CHECK(defined_[i], "grammar: rule '{}' is used but never defined", rules_[i].name);
    for (const auto& node : rules_[i].edges)
      for (const Edge& e : node)
        M3_CHECK(e.rule < int32_t(rules_.size()), "grammar: rule '{}' calls an unknown rule", rules_[i].name);
  }
}

// ---- TokenVocab ---------------------------------------------------------------------------------------------------
TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<uint8_t> usable, int32_t eos, int32_t size)
    : bytes_(std::move(bytes)), usable_(std::move(usable)), eos_(eos), size_(size) {
  M3_CHECK(usable_.size() == bytes_.size(), "vocab: {} usable flags for {} tokens", usable_.size(), bytes_.size());
  M3_CHECK(size_ >= int32_t(bytes_.size()), "vocab: size {} below {} tokens", size_, bytes_.size());
  M3_CHECK(eos_ < size_, "vocab: eos {} outside [0, {})", eos_, size_);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (bytes_[i].empty()) usable_[i] = 0;
    if (usable_[i]) ids.push_back(int32_t(i));
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  tnext_.assign(bytes_.size(), -1);
  std::vector<int32_t> path;  // trie node per depth − 1
  std::vector<int32_t> last;  // last token id per node, to chain equal-byte tokens in id order
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& w = bytes_[size_t(id)];
    size_t l = 0;
    if (prev)
      while (l < prev->size() && l < w.size() && (*prev)[l] == w[l]) ++l;
    while (path.size() > l) {
      tskip_[size_t(path.back())] = int32_t(tbyte_.size());
      path.pop_back();
    }
    for (size_t j = l; j < w.size(); ++j) {
      path.push_back(int32_t(tbyte_.size()));
      tbyte_.push_back(uint8_t(w[j]));
      M3_CHECK(j + 1 < 65536, "vocab: token {} is too long", id);
      tdepth_.push_back(uint16_t(j + 1));
      tskip_.push_back(0);
      tfirst_.push_back(-1);
      last.push_back(-1);
    }
    const int32_t node = path.back();
    if (tfirst_[size_t(node)] < 0)
      tfirst_[size_t(node)] = id;
    else
      tnext_[size_t(last[size_t(node)])] = id;
    last[size_t(node)] = id;
    max_depth_ = std::max(max_depth_, int(w.size()));
    prev = &w;
  }
  while (!path.empty()) {
    tskip_[size_t(path.back())] = int32_t(tbyte_.size());
    path.pop_back();
  }
}

// ---- CompiledGrammar ----------------------------------------------------------------------------------------------
CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const TokenVocab> vocab)
    : g_(std::move(g)), vocab_(std::move(vocab)) {
  g_.check();
  frames_.push_back(Frame{-1, -1, -1});  // 0: the empty stack
  frames_.push_back(Frame{-2, -2, -2});  // 1: "the caller, unknown" (the bottom of context-free walks)
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int32_t> out, seen;
  expand(frame(g_.root(), 0, 0), out, seen, 0);
  M3_CHECK(!out.empty(), "grammar: the root rule accepts nothing");
  initial_ = intern(std::move(out));
}

int32_t CompiledGrammar::frame(int32_t rule, int32_t node, int32_t parent) {
  const Frame f{rule, node, parent};
  auto it = frame_ids_.find(f);
  if (it != frame_ids_.end()) return it->second;
  frames_.push_back(f);
  const int32_t id = int32_t(frames_.size() - 1);
  frame_ids_.emplace(f, id);
  return id;
}

// Adds to `out` the stacks reachable from frame f without consuming a byte whose top can consume one (or 0 when the
// root can complete): calls push the callee's start, final nodes pop to the caller's return node.
void CompiledGrammar::expand(int32_t f, std::vector<int32_t>& out, std::vector<int32_t>& seen, int depth) {
  M3_CHECK(depth < 4096, "grammar: left recursion (a rule calls itself before consuming a byte)");
  if (std::find(seen.begin(), seen.end(), f) != seen.end()) return;
  seen.push_back(f);
  if (f == 0 || f == kEscape) {
    out.push_back(f);
    return;
  }
  const Frame fr = frames_[size_t(f)];
  const RuleNfa& r = g_.rules()[size_t(fr.rule)];
  bool bytes = false;
  for (const Edge& e : r.edges[size_t(fr.node)]) {
    if (e.rule < 0) {
      bytes = true;
      continue;
    }
    const int32_t ret = frame(fr.rule, e.to, fr.parent);
    expand(frame(e.rule, 0, ret), out, seen, depth + 1);
  }
  if (bytes) out.push_back(f);
  if (r.final[size_t(fr.node)]) expand(fr.parent, out, seen, depth + 1);
}

int32_t CompiledGrammar::intern(std::vector<int32_t> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  auto it = state_ids_.find(stacks);
  if (it != state_ids_.end()) return it->second;
  const int32_t id = int32_t(states_.size());
  escaped_.push_back(std::binary_search(stacks.begin(), stacks.end(), kEscape));
  states_.push_back(stacks);
  state_ids_.emplace(std::move(stacks), id);
  trans_.resize(trans_.size() + 256, -2);
  return id;
}

int32_t CompiledGrammar::step_locked(int32_t s, uint8_t b) {
  const int32_t known = trans_[size_t(s) * 256 + b];
  if (known != -2) return known;
  std::vector<int32_t> out, seen;
  const std::vector<int32_t> stacks = states_[size_t(s)];  // a copy: interning may grow states_
  for (int32_t f : stacks) {
    if (f == 0 || f == kEscape) continue;
    const Frame fr = frames_[size_t(f)];
    for (const Edge& e : g_.rules()[size_t(fr.rule)].edges[size_t(fr.node)])
      if (e.rule < 0 && e.lo <= b && b <= e.hi) expand(frame(fr.rule, e.to, fr.parent), out, seen, 0);
  }
  const int32_t next = out.empty() ? -1 : intern(std::move(out));
  trans_[size_t(s) * 256 + b] = next;
  return next;
}

int32_t CompiledGrammar::initial_state() { return initial_; }

int32_t CompiledGrammar::step(int32_t s, uint8_t b) {
  std::lock_guard<std::mutex> lk(mu_);
  return step_locked(s, b);
}

bool CompiledGrammar::accepting(int32_t s) {
  std::lock_guard<std::mutex> lk(mu_);
  return !states_[size_t(s)].empty() && states_[size_t(s)][0] == 0;
}

bool CompiledGrammar::terminal(int32_t s) {
  std::lock_guard<std::mutex> lk(mu_);
  return states_[size_t(s)].size() == 1 && states_[size_t(s)][0] == 0;
}

size_t CompiledGrammar::num_states() {
  std::lock_guard<std::mutex> lk(mu_);
  return states_.size();
}

size_t CompiledGrammar::cached_masks() {
  std::lock_guard<std::mutex> lk(mu_);
  return masks_.size();
}

// The trie walk: one transition-row read per visited trie node; a dead byte skips the node's whole subtree.
void CompiledGrammar::walk(int32_t s, uint32_t* out, std::vector<int32_t>* uncertain) {
  const TokenVocab& v = *vocab_;
  std::memset(out, 0, size_t(v.words()) * 4);
  ++walks_;
  std::vector<int32_t> st(size_t(v.max_depth_) + 1);
  // esc[d]: a state on the path to depth d (inclusive) has left the frame (context-free walks only): a dead
  // continuation below it may still live in the real caller, so its tokens are uncertain, not refused.
  std::vector<uint8_t> esc(size_t(v.max_depth_) + 1, 0);
  st[0] = s;
  esc[0] = escaped_[size_t(s)];
  const size_t n = v.tbyte_.size();
  const uint8_t* tb = v.tbyte_.data();
  const uint16_t* td = v.tdepth_.data();
  const int32_t* tf = v.tfirst_.data();
  for (size_t i = 0; i < n;) {
    const int d = td[i];
    const int32_t ps = st[size_t(d - 1)];
    int32_t ns = trans_[size_t(ps) * 256 + tb[i]];
    if (ns == -2) ns = step_locked(ps, tb[i]);
    if (ns < 0) {
      if (uncertain && esc[size_t(d - 1)])
        for (size_t j = i; j < size_t(v.tskip_[i]); ++j)
          for (int32_t t = tf[j]; t >= 0; t = v.tnext_[size_t(t)]) uncertain->push_back(t);
      i = size_t(v.tskip_[i]);
      continue;
    }
    st[size_t(d)] = ns;
    esc[size_t(d)] = esc[size_t(d - 1)] | escaped_[size_t(ns)];
    for (int32_t t = tf[i]; t >= 0; t = v.tnext_[size_t(t)]) out[t >> 5] |= 1u << (t & 31);
    ++i;
  }
  if (v.eos_ >= 0 && states_[size_t(s)][0] == 0) out[v.eos_ >> 5] |= 1u << (v.eos_ & 31);
}

// A state that is one stack whose top frame (rule, node) cannot end is masked in two parts: what the frame allows
// whatever its caller (one context-free walk per (rule, node), shared by every stack with that top: all the string
// values of a document share the string rule's), plus the few tokens that leave the frame before their last
// byte, checked against the real stack one by one.
void CompiledGrammar::mask_in_context(int32_t s, uint32_t* out) {
  const std::vector<int32_t>& stacks = states_[size_t(s)];
  const Frame top = frames_[size_t(stacks[0])];
  std::vector<int32_t> cf, seen;
  expand(frame(top.rule, top.node, kEscape), cf, seen, 0);
  const int32_t key = intern(std::move(cf));
  auto it = free_.find(key);
  if (it == free_.end()) {
    ContextFree c;
    c.bits.resize(size_t(vocab_->words()));
    walk(key, c.bits.data(), &c.uncertain);
    mask_bytes_ += (c.bits.size() + c.uncertain.size()) * 4;
    it = free_.emplace(key, std::move(c)).first;
  }
  const ContextFree& c = it->second;
  std::memcpy(out, c.bits.data(), c.bits.size() * 4);
  for (int32_t t : c.uncertain) {
    int32_t x = s;
    for (char b : vocab_->bytes(t))
      if ((x = step_locked(x, uint8_t(b))) < 0) break;
    if (x >= 0) out[t >> 5] |= 1u << (t & 31);
  }
}

void CompiledGrammar::mask(int32_t s, uint32_t* out) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t words = size_t(vocab_->words());
  auto it = masks_.find(s);
  if (it == masks_.end()) {
    CachedMask c;
    c.bits.resize(words);
    const std::vector<int32_t>& st = states_[size_t(s)];
    bool context_free = false;
    if (st.size() == 1 && st[0] > kEscape) {
      const Frame f = frames_[size_t(st[0])];
      context_free = !g_.rules()[size_t(f.rule)].final[size_t(f.node)] && f.parent != kEscape;
    }
    if (context_free)
      mask_in_context(s, c.bits.data());
    else
      walk(s, c.bits.data());
    size_t n = 0;
    for (uint32_t w : c.bits) n += size_t(__builtin_popcount(w));
    if (n < words) {  // the id list is smaller than the bitmap
      c.ids.reserve(n);
      for (size_t w = 0; w < words; ++w)
        for (uint32_t x = c.bits[w]; x; x &= x - 1) c.ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(x))));
      c.bits = {};
    }
    const size_t bytes = (c.bits.size() + c.ids.size()) * 4 + 64;
    if (mask_bytes_ + bytes > kMaskCacheBytes) {
      masks_.clear();
      free_.clear();
      mask_bytes_ = 0;
    }
    mask_bytes_ += bytes;
    it = masks_.emplace(s, std::move(c)).first;
  }
  const CachedMask& c = it->second;
  if (!c.bits.empty()) {
    std::memcpy(out, c.bits.data(), words * 4);
  } else {
    std::memset(out, 0, words * 4);
    for (int32_t id : c.ids) out[id >> 5] |= 1u << (id & 31);
  }
}

// ---- Matcher ------------------------------------------------------------------------------------------------------
Matcher::Matcher(std::shared_ptr<CompiledGrammar> g) : g_(std::move(g)), state_(g_->initial_state()) {}

bool Matcher::accept_token(int32_t id) {
  if (finished_) return false;
  const TokenVocab& v = g_->vocab();
  if (id == v.eos() && id >= 0) {
    if (!g_->accepting(state_)) return false;
    finished_ = true;
    return true;
  }
  if (!v.usable(id)) return false;
  return accept_bytes(v.bytes(id));
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  int32_t s = state_;
  for (char c : bytes) {
    s = g_->step(s, uint8_t(c));
    if (s < 0) return false;
  }
  state_ = s;
  return true;
}

void Matcher::fill_mask(uint32_t* out) const {
  if (finished_) {
    std::memset(out, 0, size_t(g_->vocab().words()) * 4);
    return;
  }
  g_->mask(state_, out);
}

bool Matcher::accepting() const { return !finished_ && g_->accepting(state_); }
bool Matcher::terminal() const { return !finished_ && g_->terminal(state_); }

}  // namespace m3::grammar
