#include "grammar/constraint.h"

namespace m3::grammar {

Constraint::Constraint(std::shared_ptr<const ConstraintSpec> spec) : spec_(std::move(spec)), m_(spec_->grammar) {
  switch (spec_->start) {
    case ConstraintSpec::Start::Answer:
      phase_ = Phase::Grammar;
      break;
    case ConstraintSpec::Start::InReasoning:
      phase_ = Phase::Reasoning;
      break;
    case ConstraintSpec::Start::Adaptive:
      phase_ = Phase::Open;
      break;
  }
}

void Constraint::fill_mask(uint32_t* out) const {
  m_.fill_mask(out);
  if (phase_ == Phase::Open)
    for (int32_t id : {spec_->think_begin_id, spec_->think_end_id})
      if (id >= 0 && id < spec_->grammar->vocab().size()) out[id >> 5] |= 1u << (id & 31);
}

bool Constraint::accept(int32_t id) {
  const TokenVocab& v = spec_->grammar->vocab();
  switch (phase_) {
    case Phase::Open:
      if (id >= 0 && id == spec_->think_begin_id) {
        phase_ = Phase::Reasoning;
        return true;
      }
      if (id >= 0 && id == spec_->think_end_id) {
        phase_ = Phase::Grammar;
        return true;
      }
      phase_ = Phase::Grammar;
      return m_.accept_token(id);
    case Phase::Grammar:
      return m_.accept_token(id);
    case Phase::Reasoning: {
      if (id >= 0 && id == spec_->think_end_id) {
        phase_ = Phase::Grammar;
        tail_.clear();
        return true;
      }
      if (id < 0 || size_t(id) >= v.num_tokens()) return true;
      tail_ += v.bytes(id);
      const std::string& end = spec_->think_end;
      if (const size_t at = tail_.find(end); at != std::string::npos) {
        phase_ = Phase::Grammar;
        // Text after the marker in the same token: the grammar's first bytes (dropped when it refuses them).
        m_.accept_bytes(std::string_view(tail_).substr(at + end.size()));
        tail_.clear();
      } else if (tail_.size() >= end.size()) {
        tail_.erase(0, tail_.size() - (end.size() - 1));
      }
      return true;
    }
  }
  return true;
}

}  // namespace m3::grammar
