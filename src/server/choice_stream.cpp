#include "server/choice_stream.h"

#include <algorithm>

namespace m3::server {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return {};
  if (stops_.empty()) return std::string(text);
  // Only a match that ends inside the new text is new: everything held before could not contain a whole stop
  // string. Search from where such a match could start.
  const size_t old = held_.size();
  held_.append(text);
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const auto& s : stops_) {
    size_t from = old >= s.size() ? old - s.size() + 1 : 0;
    size_t p = held_.find(s, from);
    if (p != std::string::npos && (p < best || (p == best && s.size() > best_stop->size()))) {
      best = p;
      best_stop = &s;
    }
  }
  if (best_stop) {
    matched_ = true;
    matched_stop_ = *best_stop;
    std::string out = held_.substr(0, best);
    if (include_stop_) out += *best_stop;
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

ChoiceStream::ChoiceStream(const Tokenizer& tok, const ChoiceOptions& opt)
    : opt_(opt), detok_(tok, opt.skip_special_tokens), stop_(opt.stop, opt.include_stop_str_in_output) {
  if (opt_.chat) parser_.emplace(opt_.starts_in_reasoning, opt_.tools, opt_.parse_tools);
}

void ChoiceStream::emit_raw(ChoiceDelta& d, const std::string& raw) {
  if (raw.empty()) return;
  if (!parser_) {
    d.text += raw;
    return;
  }
  d.parsed = [&] {
    ParsedDelta acc = std::move(d.parsed);
    ParsedDelta p = parser_->push(raw);
    acc.reasoning += p.reasoning;
    acc.content += p.content;
    for (auto& c : p.tool_calls) acc.tool_calls.push_back(std::move(c));
    return acc;
  }();
}

void ChoiceStream::finish_text(ChoiceDelta& d) {
  if (!parser_) return;
  ParsedDelta p = parser_->finish();
  d.parsed.reasoning += p.reasoning;
  d.parsed.content += p.content;
  for (auto& c : p.tool_calls) d.parsed.tool_calls.push_back(std::move(c));
}

ChoiceDelta ChoiceStream::on_output(const EngineOutput& out) {
  ChoiceDelta d;
  if (finished_) return d;
  prompt_tokens_ = out.prompt_tokens;
  cached_tokens_ = out.cached_tokens;
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    ++completion_tokens_;
    if (i < out.logprobs.size()) d.logprobs.push_back(out.logprobs[i]);
    emit_raw(d, stop_.push(detok_.push(out.tokens[i])));
    // A token counts as reasoning when the parser is still inside <mm:think> after it (approximate at the
    // closing tag, which is held back until complete).
    if (parser_ && parser_->in_reasoning()) ++reasoning_tokens_;
    if (stop_.matched()) {
      d.finished = true;
      d.finish_reason = "stop";
      d.needs_abort = out.finish == FinishReason::None;
      break;
    }
  }
  if (!d.finished && out.finish != FinishReason::None) {
    emit_raw(d, stop_.push(detok_.flush()));
    if (!stop_.matched()) emit_raw(d, stop_.flush());
    d.finished = true;
    switch (out.finish) {
      case FinishReason::Length:
        d.finish_reason = stop_.matched() ? "stop" : "length";
        break;
      case FinishReason::Abort:
        d.finish_reason = "abort";
        break;
      case FinishReason::Error:
        d.finish_reason = "error";
        d.error = out.error.empty() ? "engine error" : out.error;
        break;
      default:
        d.finish_reason = "stop";
    }
  }
  if (d.finished) {
    finished_ = true;
    finish_text(d);
  }
  if (parser_) {
    // parallel_tool_calls=false: only the first call is returned.
    auto& calls = d.parsed.tool_calls;
    if (!opt_.parallel_tool_calls)
      calls.erase(std::remove_if(calls.begin(), calls.end(), [](const ToolCallDelta& c) { return c.index > 0; }),
                  calls.end());
    for (const auto& c : calls)
      if (!c.name.empty()) ++tool_calls_;
    if (d.finished && d.finish_reason == "stop" && tool_calls_ > 0) d.finish_reason = "tool_calls";
  }
  return d;
}

}  // namespace m3::server
