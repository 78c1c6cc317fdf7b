#include "text/parsers/m3_output_parser.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "base/rng.h"

namespace m3 {
namespace {

constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kInvokeOpen = "<invoke";
constexpr std::string_view kInvokeClose = "</invoke>";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

size_t skip_ws(std::string_view b, size_t i) {
  while (i < b.size() && is_ws(b[i])) ++i;
  return i;
}

// Whitespace tolerated inside a marker ("NS <tag>", "<tool_call>\n NS<invoke"). Bounded so that the
// held-back text, and the rescanning of it on every push, stay small.
constexpr size_t kMaxTagGap = 64;

size_t skip_gap(std::string_view b, size_t i) {
  size_t limit = std::min(b.size(), i + kMaxTagGap);
  while (i < limit && is_ws(b[i])) ++i;
  return i;
}

bool all_ws(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return is_ws(c); });
}

// Per-parser seed for call ids. random_device may be unavailable in odd sandboxes; a clock-based
// seed is then good enough (ids only need to differ between requests, not be secret).
uint64_t random_seed() {
  static std::atomic<uint64_t> counter{0};
  uint64_t salt = splitmix64(counter.fetch_add(1, std::memory_order_relaxed));
  try {
    std::random_device rd;
    return ((uint64_t{rd()} << 32) ^ rd()) ^ salt;
  } catch (...) {
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^ salt;
  }
}

}  // namespace

void ParsedMessage::append(const ParsedDelta& d) {
  reasoning += d.reasoning;
  content += d.content;
  for (const auto& tc : d.tool_calls) {
    if (tc.index < 0) continue;
    if (static_cast<size_t>(tc.index) >= tool_calls.size()) tool_calls.resize(tc.index + 1);
    ToolCall& c = tool_calls[tc.index];
    if (!tc.id.empty()) c.id = tc.id;
    if (!tc.name.empty()) c.name = tc.name;
    c.arguments_json += tc.arguments;
  }
}

M3OutputParser::M3OutputParser(bool starts_in_reasoning, const nlohmann::json& tools, bool parse_tools,
                               std::optional<uint64_t> call_id_seed)
    : tools_(tools),
      parse_tools_(parse_tools),
      id_seed_(call_id_seed ? *call_id_seed : random_seed()),
      phase_(starts_in_reasoning ? Phase::kReasoning : Phase::kBeforeThink) {}

ParsedMessage M3OutputParser::parse_full(std::string_view text, bool starts_in_reasoning,
                                         const nlohmann::json& tools, bool parse_tools,
                                         std::optional<uint64_t> call_id_seed) {
  M3OutputParser p(starts_in_reasoning, tools, parse_tools, call_id_seed);
  ParsedMessage msg;
  msg.append(p.push(text));
  msg.append(p.finish());
  return msg;
}

ParsedDelta M3OutputParser::push(std::string_view text) {
  ParsedDelta out;
  buf_.append(text);
  run(out, /*at_end=*/false);
  return out;
}

ParsedDelta M3OutputParser::finish() {
  ParsedDelta out;
  run(out, /*at_end=*/true);
  // run() at end of stream resolves every partial match; anything left is flushed defensively.
  if (!buf_.empty() || !pending_raw_.empty()) {
    std::string rest = pending_raw_ + buf_;
    pending_raw_.clear();
    buf_.clear();
    mode_ = Mode::kText;
    emit_text(out, rest);
  }
  return out;
}

std::string M3OutputParser::make_call_id(int index) const {
  return fmt::format("call_{:016x}", splitmix64(id_seed_ + 0x632be59bd9b4e019ULL * static_cast<uint64_t>(index)));
}

void M3OutputParser::run(ParsedDelta& out, bool at_end) {
  // Each step returns true when it changed mode (there may be more to do), false when it needs
  // more text. Every true return consumes input or changes mode without rescanning, so this ends.
  for (;;) {
    bool more = false;
    switch (mode_) {
      case Mode::kText: more = step_text(out, at_end); break;
      case Mode::kBlock: more = step_block(out, at_end); break;
      case Mode::kInvoke: more = step_invoke(out, at_end); break;
    }
    if (!more) return;
  }
}

void M3OutputParser::emit_text(ParsedDelta& out, std::string_view s) {
  if (s.empty()) return;
  if (phase_ == Phase::kReasoning) {
    out.reasoning.append(s);
    if (!all_ws(s)) reasoning_has_text_ = true;
  } else {
    out.content.append(s);
  }
}

namespace {

using Match = int;  // mirrors M3OutputParser::Match without exposing it: 0 none, 1 partial, 2 full
constexpr Match kNone = 0, kPartial = 1, kFull = 2;

// Does b[i..] start with lit? Partial when b ends inside a prefix of lit (and more text may come).
Match match_literal(std::string_view b, size_t i, std::string_view lit, bool at_end) {
  size_t n = std::min(b.size() - i, lit.size());
  if (b.compare(i, n, lit.substr(0, n)) != 0) return kNone;
  if (n == lit.size()) return kFull;
  return at_end ? kNone : kPartial;
}

// NS, optional whitespace, then lit (tags may be written "NS <tag>"). *end = one past lit.
Match match_ns_tag(std::string_view b, size_t i, std::string_view lit, bool at_end, size_t* end) {
  Match m = match_literal(b, i, kM3Namespace, at_end);
  if (m != kFull) return m;
  size_t j = skip_gap(b, i + kM3Namespace.size());
  m = match_literal(b, j, lit, at_end);
  if (m == kFull) *end = j + lit.size();
  return m;
}

// `<invoke` must be followed by whitespace (`<invoke name=…`); `<invoke>` would be a parameter tag.
Match match_invoke_open(std::string_view b, size_t i, bool at_end, size_t* end) {
  Match m = match_ns_tag(b, i, kInvokeOpen, at_end, end);
  if (m != kFull) return m;
  if (*end == b.size()) return at_end ? kNone : kPartial;
  return is_ws(b[*end]) ? kFull : kNone;
}

// NS<tool_call>, or the tolerated degenerate opener (docs/SERVING_FORMAT.md §3.4): a bare <tool_call> followed by
// a prefixed invoke. *len = the opener's length (the lookahead is not consumed).
Match match_tool_open(std::string_view b, size_t i, bool at_end, size_t* len) {
  size_t end = 0;
  if (b[i] == ']') {
    Match m = match_ns_tag(b, i, kToolCallOpen, at_end, &end);
    if (m == kFull) *len = end - i;
    return m;
  }
  Match m = match_literal(b, i, kToolCallOpen, at_end);
  if (m != kFull) return m;
  size_t j = skip_gap(b, i + kToolCallOpen.size());
  Match la = match_invoke_open(b, j, at_end, &end);
  if (la == kFull) *len = kToolCallOpen.size();
  return la;
}

}  // namespace

bool M3OutputParser::step_text(ParsedDelta& out, bool at_end) {
  std::string_view b = buf_;
  size_t i = 0;
  while (i < b.size()) {
    char c = b[i];
    if (c != '<' && c != ']') {
      ++i;
      continue;
    }
    bool partial = false;
    // Think tags: meaningful only before or inside the think block.
    if (c == '<' && phase_ != Phase::kAfterThink) {
      Match close = match_literal(b, i, kThinkClose, at_end);
      if (close == kFull) {
        emit_text(out, b.substr(0, i));
        // Inside: the block ends. Before: a stray leading closer (the template closes earlier
        // non-thinking turns with a bare </mm:think>) is dropped; either way think tags are text now.
        phase_ = Phase::kAfterThink;
        buf_.erase(0, i + kThinkClose.size());
        b = buf_;
        i = 0;
        continue;
      }
      partial |= close == kPartial;
      bool open_is_tag = phase_ == Phase::kBeforeThink ||
                         (!reasoning_has_text_ && all_ws(b.substr(0, i)));  // repeated opener at the start
      if (open_is_tag) {
        Match open = match_literal(b, i, kThinkOpen, at_end);
        if (open == kFull) {
          emit_text(out, b.substr(0, i));
          phase_ = Phase::kReasoning;
          buf_.erase(0, i + kThinkOpen.size());
          b = buf_;
          i = 0;
          continue;
        }
        partial |= open == kPartial;
      }
    }
    if (parse_tools_) {
      size_t len = 0;
      Match m = match_tool_open(b, i, at_end, &len);
      if (m == kFull) {
        emit_text(out, b.substr(0, i));
        pending_raw_.assign(b.substr(i, len));
        block_from_reasoning_ = phase_ == Phase::kReasoning;
        // Tool markup inside reasoning ends the reasoning implicitly (docs/SERVING_FORMAT.md §3.4); if the block
        // fails without a committed call, abandon_block() puts it back into reasoning.
        if (block_from_reasoning_) phase_ = Phase::kBeforeThink;
        block_commits_ = 0;
        buf_.erase(0, i + len);
        mode_ = Mode::kBlock;
        return true;
      }
      partial |= m == kPartial;
    }
    if (partial) break;  // hold b[i..] until it is disambiguated
    ++i;
  }
  emit_text(out, b.substr(0, i));
  buf_.erase(0, i);
  return false;
}

void M3OutputParser::abandon_block(ParsedDelta& out, size_t upto) {
  std::string text = pending_raw_;
  text.append(buf_, 0, upto);
  pending_raw_.clear();
  buf_.erase(0, upto);
  mode_ = Mode::kText;
  if (block_commits_ == 0 && block_from_reasoning_) phase_ = Phase::kReasoning;
  emit_text(out, text);
}

bool M3OutputParser::step_block(ParsedDelta& out, bool at_end) {
  // Between invokes only whitespace, another invoke, or the block's closer may appear.
  size_t i = skip_ws(buf_, 0);
  pending_raw_.append(buf_, 0, i);
  buf_.erase(0, i);
  if (buf_.empty()) {
    if (!at_end) return false;
    abandon_block(out, 0);
    return true;
  }
  std::string_view b = buf_;
  size_t end = 0;
  Match inv = kNone, close = kNone;
  if (b[0] == ']') {
    inv = match_invoke_open(b, 0, at_end, &end);
    if (inv == kFull) {
      mode_ = Mode::kInvoke;
      invoke_scan_ = end;
      return true;
    }
    close = match_ns_tag(b, 0, kToolCallClose, at_end, &end);
  } else if (b[0] == '<') {
    close = match_literal(b, 0, kToolCallClose, at_end);  // lenient: unprefixed closer
    if (close == kFull) end = kToolCallClose.size();
  }
  if (close == kFull) {
    if (block_commits_ == 0) {
      // Nothing valid inside: the whole block, closer included, goes back as text.
      abandon_block(out, end);
    } else {
      pending_raw_.clear();
      buf_.erase(0, end);
      mode_ = Mode::kText;
    }
    return true;
  }
  if (inv == kPartial || close == kPartial) return false;
  abandon_block(out, 0);
  return true;
}

bool M3OutputParser::step_invoke(ParsedDelta& out, bool at_end) {
  // buf_ starts with the invoke's opening NS<invoke. Find the first NS that ends it.
  size_t from = invoke_scan_;
  for (;;) {
    size_t p = buf_.find(kM3Namespace, from);
    invoke_scanned_ += (p == std::string::npos ? buf_.size() : p + 1) - std::min(from, buf_.size());
    if (p == std::string::npos) {
      if (at_end) {
        abandon_block(out, buf_.size());
        return true;
      }
      // A marker may straddle the end of the buffer: rescan its possible start next time.
      size_t keep = kM3Namespace.size() - 1;
      invoke_scan_ = std::max(from, buf_.size() > keep ? buf_.size() - keep : size_t{0});
      return false;
    }
    std::string_view b = buf_;
    size_t e_close = 0, e_inv = 0, e_blk = 0;
    Match close = match_ns_tag(b, p, kInvokeClose, at_end, &e_close);
    if (close == kFull) {
      std::optional<ParsedInvoke> parsed = parse_m3_invoke(b.substr(0, e_close), tools_);
      if (!parsed) {
        abandon_block(out, e_close);  // unknown tool or malformed: raw text back
        return true;
      }
      int index = num_calls_++;
      out.tool_calls.push_back(ToolCallDelta{index, make_call_id(index), parsed->name, ""});
      out.tool_calls.push_back(ToolCallDelta{index, "", "", std::move(parsed->arguments_json)});
      ++block_commits_;
      pending_raw_.clear();
      buf_.erase(0, e_close);
      mode_ = Mode::kBlock;
      return true;
    }
    Match inv = match_invoke_open(b, p, at_end, &e_inv);
    Match blk = match_ns_tag(b, p, kToolCallClose, at_end, &e_blk);
    if (inv == kFull || blk == kFull) {
      // A new invoke or the block's end before this invoke closed: malformed. The text so far goes
      // back, and scanning resumes (as plain text) at the marker.
      abandon_block(out, p);
      return true;
    }
    if (close == kPartial || inv == kPartial || blk == kPartial) {
      invoke_scan_ = p;
      return false;
    }
    from = p + 1;
  }
}

}  // namespace m3
