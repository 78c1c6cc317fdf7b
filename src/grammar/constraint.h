// A request's output constraint as the engine drives it (issue 14 item 2): which part of M3's output the grammar
// covers, and the grammar's position. M3 writes `<mm:think>reasoning</mm:think>answer`; the constraint covers the
// answer only (docs/SERVING_FORMAT.md §3.2, docs/SERVER.md "Constrained decoding"):
//   Answer      — the prompt already closed reasoning (thinking disabled, or a non-M3 template): constrained from
//                 the first generated token;
//   InReasoning — the prompt opened reasoning (thinking enabled): free until the output contains `</mm:think>`
//                 (as the special token or as text), then constrained;
//   Adaptive    — the model may open reasoning itself: the first token is the grammar's or one of the two think
//                 markers; `<mm:think>` then behaves like InReasoning, `</mm:think>` like Answer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "grammar/grammar.h"

namespace m3::grammar {

struct ConstraintSpec {
  enum class Start { Answer, InReasoning, Adaptive };
  std::shared_ptr<CompiledGrammar> grammar;
  Start start = Start::Answer;
  std::string think_end = "</mm:think>";
  int32_t think_begin_id = -1, think_end_id = -1;  // the markers' special-token ids (−1: not in the vocabulary)
};

class Constraint {
 public:
  explicit Constraint(std::shared_ptr<const ConstraintSpec> spec);
  // Whether the next token is constrained (false while the model reasons).
  bool active() const { return phase_ != Phase::Reasoning; }
  // The packed mask [vocab words] of the next token (call only when active()).
  void fill_mask(uint32_t* out) const;
  // Advances with a sampled token. False when an active grammar refused it (the state is unchanged).
  bool accept(int32_t id);
  const Matcher& matcher() const { return m_; }
  int32_t words() const { return spec_->grammar->vocab().words(); }

 private:
  enum class Phase { Reasoning, Open, Grammar };
  std::shared_ptr<const ConstraintSpec> spec_;
  Matcher m_;
  Phase phase_ = Phase::Grammar;
  std::string tail_;  // reasoning text not yet ruled out as the start of think_end
};

}  // namespace m3::grammar
