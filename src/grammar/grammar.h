// Constrained decoding (issue 14 item 2): a byte-level context-free grammar, a matcher that walks it one byte at a
// time, and the token masks it allows over a tokenizer's vocabulary.
//
// Grammar: rules whose bodies are byte-level NFAs (Thompson-built from an expression, epsilons removed). An edge
// consumes a byte range or calls another rule (pushes a return frame). Recursion is allowed except on the left.
//
// Matcher state: a SET of stacks (the grammar may be ambiguous: anyOf of objects that start alike). Stacks are
// hash-consed frames (rule, node, parent frame) in a table of the CompiledGrammar, so a stack is one int and a state
// is a sorted vector of ints, itself interned: a state is one int too. Frame 0 is the empty stack (the root rule
// has completed: EOS is allowed). Every interned state keeps a 256-entry transition row filled on demand, so
// walking a byte is one array read once the state has been seen.
//
// Token masks: the vocabulary is a trie flattened in preorder (TokenVocab). The mask of a state is a walk of that
// trie that follows the transition rows and skips a whole subtree at the first dead byte; a token is allowed when
// the state after its last byte is alive. Masks are cached per state id (a JSON document revisits the same states
// over and over: every character of one string value is the same state), so most decode steps only copy a cached
// mask. Special / added tokens are never allowed by the grammar; EOS is allowed exactly in accepting states.
//
// Thread safety: a CompiledGrammar may be shared by many Matchers (all requests with one schema); its tables grow
// under a mutex. Matchers are used by one thread at a time (the engine thread).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace m3::grammar {

// ---- expressions: what the compilers build rules from ----------------------------------------------------------
struct Expr {
  enum Kind : uint8_t { Empty, Range, Ref, Seq, Alt, Star } kind = Empty;
  uint8_t lo = 0, hi = 0;  // Range: bytes [lo, hi]
  int32_t rule = -1;       // Ref
  std::vector<Expr> kids;  // Seq / Alt / Star (one kid)
};
Expr empty();
Expr range(uint8_t lo, uint8_t hi);
Expr byte(uint8_t b);
Expr lit(std::string_view bytes);                       // the bytes in order
Expr cls(std::string_view pairs, bool negate = false);  // "azAZ09": ranges as byte pairs; negate within 0..255
Expr ref(int32_t rule);
Expr seq(std::vector<Expr> kids);
Expr alt(std::vector<Expr> kids);
Expr star(Expr e);
Expr plus(Expr e);
Expr opt(Expr e);
Expr rep(const Expr& e, int min, int max);  // max < 0: unbounded

// ---- compiled rules -----------------------------------------------------------------------------------------------
struct Edge {
  uint8_t lo = 0, hi = 0;
  int32_t rule = -1;  // ≥ 0: a call of that rule (lo/hi unused)
  int32_t to = 0;
};
struct RuleNfa {
  std::string name;
  std::vector<std::vector<Edge>> edges;  // per node; node 0 is the start
  std::vector<uint8_t> final;            // per node
};

class Grammar {
 public:
  int32_t add_rule(std::string name);  // declares a rule (define it later; refs may point forward)
  void define(int32_t rule, const Expr& body);
  void set_root(int32_t rule) { root_ = rule; }
  int32_t root() const { return root_; }
  const std::vector<RuleNfa>& rules() const { return rules_; }
  int32_t find_rule(std::string_view name) const;  // −1 when absent
  // Throws m3::Error when a rule is undefined or left-recursive.
  void check() const;
  size_t num_nodes() const;

 private:
  std::vector<RuleNfa> rules_;
  std::vector<uint8_t> defined_;
  int32_t root_ = 0;
};

// ---- the vocabulary -----------------------------------------------------------------------------------------------
class TokenVocab {
 public:
  // bytes[id]: what the token decodes to; usable[id] = false for special / added tokens (never allowed by a
  // grammar) and for ids without a token. eos: allowed in accepting states (−1: none). size: the logits width
  // (≥ bytes.size(); ids past bytes.size() are never allowed).
  TokenVocab(std::vector<std::string> bytes, std::vector<uint8_t> usable, int32_t eos, int32_t size);
  int32_t size() const { return size_; }
  int32_t words() const { return (size_ + 31) / 32; }  // uint32 words of one packed mask row
  int32_t eos() const { return eos_; }
  size_t num_tokens() const { return bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool usable(int32_t id) const { return id >= 0 && size_t(id) < usable_.size() && usable_[size_t(id)]; }
  size_t trie_nodes() const { return tbyte_.size(); }

 private:
  friend class CompiledGrammar;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> usable_;
  int32_t eos_ = -1, size_ = 0;
  // The trie of the usable tokens, preorder: node i consumes tbyte_[i] at depth tdepth_[i] (1-based), its subtree
  // ends before tskip_[i], and the tokens that end exactly there are tfirst_[i], tnext_[tfirst_[i]], ... (−1 ends).
  std::vector<uint8_t> tbyte_;
  std::vector<uint16_t> tdepth_;
  std::vector<int32_t> tskip_, tfirst_, tnext_;
  int max_depth_ = 0;
};

// A grammar bound to a vocabulary, with its frame / state / mask tables. Shared (shared_ptr) by matchers.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar g, std::shared_ptr<const TokenVocab> vocab);
  const Grammar& grammar() const { return g_; }
  const TokenVocab& vocab() const { return *vocab_; }
  int32_t initial_state();
  // The state after byte b from state s; −1 when no stack survives (a dead state).
  int32_t step(int32_t s, uint8_t b);
  bool accepting(int32_t s);  // the root may end here
  bool terminal(int32_t s);   // the root has ended and nothing else may follow: only EOS
  // The packed mask [words] of state s: bit id set = token id allowed next. Cached per state.
  void mask(int32_t s, uint32_t* out);
  // Statistics, for tests and the benchmark.
  size_t num_states();
  // The state tables only grow (1 KB of transitions a state); past this many states a cache owner should start a
  // fresh CompiledGrammar for new requests (matchers of the old one keep it alive until they end).
  static constexpr size_t kMaxStates = 65536;
  bool oversized() { return num_states() > kMaxStates; }
  size_t cached_masks();
  uint64_t mask_walks() const { return walks_; }

 private:
  struct Frame {
    int32_t rule, node, parent;
    bool operator==(const Frame&) const = default;
  };
  struct FrameHash {
    size_t operator()(const Frame& f) const {
      return size_t(uint64_t(uint32_t(f.rule)) * 0x9E3779B97F4A7C15ull ^ uint64_t(uint32_t(f.node)) << 20 ^
                    uint64_t(uint32_t(f.parent)) * 0xC2B2AE3D27D4EB4Full);
    }
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : v) h = (h ^ uint32_t(x)) * 1099511628211ull;
      return size_t(h);
    }
  };
  int32_t frame(int32_t rule, int32_t node, int32_t parent);
  void expand(int32_t f, std::vector<int32_t>& out, std::vector<int32_t>& seen, int depth);
  int32_t intern(std::vector<int32_t> stacks);
  int32_t step_locked(int32_t s, uint8_t b);
  // The trie walk of state s into out; with `uncertain`, s is context-free (bottom kEscape) and the tokens of
  // subtrees that die after leaving the frame are appended there instead of being refused.
  void walk(int32_t s, uint32_t* out, std::vector<int32_t>* uncertain = nullptr);
  void mask_in_context(int32_t s, uint32_t* out);
  static constexpr int32_t kEscape = 1;  // frame id: the unknown caller of a context-free walk

  Grammar g_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::mutex mu_;
  std::vector<Frame> frames_;
  std::unordered_map<Frame, int32_t, FrameHash> frame_ids_;
  std::vector<std::vector<int32_t>> states_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> state_ids_;
  std::vector<int32_t> trans_;  // [state, 256]: −2 unknown, −1 dead
  // Cached masks: a bitmap [words] for states that allow many tokens, the sorted ids when that is smaller (most
  // states outside strings allow a handful). Bounded by kMaskCacheBytes (cleared when over).
  struct CachedMask {
    std::vector<uint32_t> bits;
    std::vector<int32_t> ids;
  };
  static constexpr size_t kMaskCacheBytes = size_t(64) << 20;
  std::unordered_map<int32_t, CachedMask> masks_;
  struct ContextFree {
    std::vector<uint32_t> bits;      // allowed whatever the caller
    std::vector<int32_t> uncertain;  // leave the frame before their last byte: check against the real stack
  };
  std::unordered_map<int32_t, ContextFree> free_;  // by the context-free state's id
  std::vector<uint8_t> escaped_;                   // per state: holds kEscape
  size_t mask_bytes_ = 0;
  int32_t initial_ = -1;
  uint64_t walks_ = 0;
};

// One request's position in its grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> g);
  // Feeds one sampled token; false (state unchanged) when the grammar does not allow it.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);  // false (state unchanged) when not a prefix of the language
  void fill_mask(uint32_t* out) const;        // [vocab().words()]
  bool accepting() const;
  bool terminal() const;                       // only EOS may follow
  bool finished() const { return finished_; }  // EOS was accepted
  CompiledGrammar& compiled() const { return *g_; }

 private:
  std::shared_ptr<CompiledGrammar> g_;
  int32_t state_ = 0;
  bool finished_ = false;
};

}  // namespace m3::grammar
