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
      case Mode::kInvoke: more = call_open_ ? step_invoke(out, at_end) : step_invoke_header(out, at_end); break;
      case Mode::kFailedInvoke: more = step_failed(out, at_end); break;
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
      call_open_ = false;
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

// The opening tag NS<invoke name="f"> is complete once its '>' arrives. A known tool opens the call at once (its
// header goes out, and arguments stream as parameters close); anything else fails the invoke.
bool M3OutputParser::step_invoke_header(ParsedDelta& out, bool at_end) {
  // An opening tag is short; one whose '>' does not come within this many bytes is not one.
  constexpr size_t kMaxOpenTag = 1024;
  size_t gt = buf_.find('>', invoke_scan_);
  if (gt == std::string::npos) {
    if (at_end) {
      abandon_block(out, buf_.size());
      return true;
    }
    if (buf_.size() <= kMaxOpenTag) {
      invoke_scan_ = buf_.size();
      return false;
    }
    fail_invoke(out, 0);
    return true;
  }
  const size_t ns = buf_.find(kM3Namespace, 1);
  if (ns == std::string::npos && !at_end) {
    // The marker itself contains a '>': when the buffer ends with the first bytes of a marker that starts at or
    // before gt, that '>' may be the marker's, not the tag's. Wait for the marker to complete (the one-shot parse
    // sees it whole and fails the invoke at the marker, keeping it).
    for (size_t k = std::min(kM3Namespace.size() - 1, buf_.size() - 1); k > 0; --k) {
      const size_t start = buf_.size() - k;
      if (buf_.compare(start, k, kM3Namespace.substr(0, k)) == 0) {
        if (start <= gt) return false;
        break;
      }
    }
  }
  if (ns < gt) {  // another marker before the tag's end: not a tag
    fail_invoke(out, ns);
    return true;
  }
  std::string open = buf_.substr(0, gt + 1);
  std::optional<ParsedInvoke> header = parse_m3_invoke(open + std::string(kM3Namespace) + "</invoke>", tools_);
  if (!header) {  // unknown tool or a malformed opening tag
    fail_invoke(out, gt + 1);
    return true;
  }
  call_index_ = num_calls_++;
  out.tool_calls.push_back(ToolCallDelta{call_index_, make_call_id(call_index_), header->name, ""});
  ++block_commits_;
  pending_raw_.clear();
  invoke_open_ = std::move(open);
  buf_.erase(0, gt + 1);
  call_open_ = true;
  args_started_ = false;
  depth_ = 0;
  group_end_ = 0;
  group_tag_.clear();
  invoke_scan_ = 0;
  return true;
}

void M3OutputParser::flush_group(ParsedDelta& out) {
  if (group_end_ == 0) return;
  // Every element of the group parsed on its own; together (one key, repeated) they parse too.
  std::optional<ParsedInvoke> p =
      parse_m3_invoke(invoke_open_ + buf_.substr(0, group_end_) + std::string(kM3Namespace) + "</invoke>", tools_);
  if (p && p->arguments_json.size() > 2) {
    std::string frag = args_started_ ? "," : "{";
    frag.append(p->arguments_json, 1, p->arguments_json.size() - 2);  // the members, without the braces
    args_started_ = true;
    out.tool_calls.push_back(ToolCallDelta{call_index_, "", "", std::move(frag)});
  }
  buf_.erase(0, group_end_);
  invoke_scan_ -= std::min(invoke_scan_, group_end_);
  elem_start_ -= std::min(elem_start_, group_end_);
  group_end_ = 0;
  group_tag_.clear();
}

void M3OutputParser::close_call(ParsedDelta& out) {
  flush_group(out);
  out.tool_calls.push_back(ToolCallDelta{call_index_, "", "", args_started_ ? "}" : "{}"});
  call_open_ = false;
  args_started_ = false;
  depth_ = 0;
}

// Text of a failed invoke goes out as text: as content once a call of this block committed, else where the block
// began (reasoning or content), like abandon_block.
void M3OutputParser::emit_failed(ParsedDelta& out, size_t upto) {
  std::string text = std::move(pending_raw_);
  pending_raw_.clear();
  text.append(buf_, 0, upto);
  buf_.erase(0, upto);
  invoke_scan_ -= std::min(invoke_scan_, upto);
  const Phase saved = phase_;
  if (block_commits_ == 0 && block_from_reasoning_) phase_ = Phase::kReasoning;
  emit_text(out, text);
  phase_ = saved;
}

// The invoke cannot be a valid call: a call already streaming is closed with the parameters that parsed, and the
// rest of the invoke (from buf_'s start) goes out as text until its end, after which the block goes on, so the
// next well-formed invoke is still parsed. resume_scan: where the search for the invoke's end starts.
void M3OutputParser::fail_invoke(ParsedDelta& out, size_t resume_scan) {
  if (call_open_) {
    const size_t before = buf_.size();
    close_call(out);
    resume_scan -= std::min(resume_scan, before - buf_.size());
  }
  mode_ = Mode::kFailedInvoke;
  invoke_scan_ = resume_scan;
}

bool M3OutputParser::step_failed(ParsedDelta& out, bool at_end) {
  size_t from = invoke_scan_;
  for (;;) {
    size_t p = buf_.find(kM3Namespace, from);
    invoke_scanned_ += (p == std::string::npos ? buf_.size() : p + 1) - std::min(from, buf_.size());
    if (p == std::string::npos) {
      if (at_end) {
        emit_failed(out, buf_.size());
        mode_ = Mode::kText;
        return true;
      }
      // Text that cannot start a marker is released now.
      size_t keep = kM3Namespace.size() - 1;
      size_t upto = std::max(from, buf_.size() > keep ? buf_.size() - keep : size_t{0});
      emit_failed(out, upto);
      return false;
    }
    std::string_view b = buf_;
    size_t e = 0;
    Match close = match_ns_tag(b, p, kInvokeClose, at_end, &e);
    if (close == kFull) {
      emit_failed(out, e);
      mode_ = Mode::kBlock;
      return true;
    }
    Match inv = match_invoke_open(b, p, at_end, &e);
    Match blk = match_ns_tag(b, p, kToolCallClose, at_end, &e);
    if (inv == kFull || blk == kFull) {  // the block goes on (or ends) at the marker
      emit_failed(out, p);
      mode_ = Mode::kBlock;
      return true;
    }
    if (close == kPartial || inv == kPartial || blk == kPartial) {
      emit_failed(out, p);
      return false;
    }
    from = p + 1;
  }
}

// A call is open: buf_ holds its parameters after the opening tag. Parameters are top-level elements; each closed
// one is parsed on its own (with the tool's schema) and goes out as an argument fragment — `{"city":"Paris"` then
// `,"days":3`, and `}` at NS</invoke> — once the next parameter opens with another tag (so a repeated tag still
// merges into one array) or the invoke ends. Concatenated, the fragments are the arguments object.
bool M3OutputParser::step_invoke(ParsedDelta& out, bool at_end) {
  size_t from = invoke_scan_;
  for (;;) {
    size_t p = buf_.find(kM3Namespace, from);
    invoke_scanned_ += (p == std::string::npos ? buf_.size() : p + 1) - std::min(from, buf_.size());
    const size_t gap_start = depth_ == 0 ? group_end_ : 0;
    if (p == std::string::npos) {
      // A tail that may still become NS is not text (yet).
      size_t tail = 0;
      if (!at_end)
        for (size_t n = std::min(buf_.size() - gap_start, kM3Namespace.size() - 1); n > 0 && tail == 0; --n)
          if (buf_.compare(buf_.size() - n, n, kM3Namespace, 0, n) == 0) tail = n;
      if (depth_ == 0 && !all_ws(std::string_view(buf_).substr(gap_start, buf_.size() - gap_start - tail))) {
        fail_invoke(out, buf_.size() - tail);  // text between parameters; a possible marker start is rescanned
        return true;
      }
      if (at_end) {
        fail_invoke(out, buf_.size());  // cut off: the parameters that closed are kept
        return true;
      }
      size_t keep = kM3Namespace.size() - 1;
      invoke_scan_ = std::max(from, buf_.size() > keep ? buf_.size() - keep : size_t{0});
      return false;
    }
    std::string_view b = buf_;
    if (depth_ == 0 && !all_ws(b.substr(gap_start, p - gap_start))) {
      fail_invoke(out, p);
      return true;
    }
    size_t e_close = 0, e_inv = 0, e_blk = 0;
    Match close = depth_ == 0 ? match_ns_tag(b, p, kInvokeClose, at_end, &e_close) : kNone;
    if (close == kFull) {
      close_call(out);  // flushes the group: offsets shift by its size
      size_t shift = b.size() - buf_.size();
      buf_.erase(0, e_close - shift);
      mode_ = Mode::kBlock;
      return true;
    }
    Match inv = match_invoke_open(b, p, at_end, &e_inv);
    Match blk = match_ns_tag(b, p, kToolCallClose, at_end, &e_blk);
    if (inv == kFull || blk == kFull) {
      // The invoke ends without its NS</invoke>: between parameters the model just forgot it (the call is
      // complete); inside a parameter the parameter is lost.
      if (depth_ == 0) {
        close_call(out);
        mode_ = Mode::kBlock;
      } else {
        fail_invoke(out, p);
      }
      return true;
    }
    if (close == kPartial || inv == kPartial || blk == kPartial) {
      invoke_scan_ = p;
      return false;
    }
    // An element tag: NS (gap) <name> or NS (gap) </name>.
    size_t lt = skip_gap(b, p + kM3Namespace.size());
    if (lt == b.size() && !at_end) {
      invoke_scan_ = p;
      return false;
    }
    size_t gt = lt < b.size() && b[lt] == '<' ? b.find('>', lt) : std::string::npos;
    if (lt < b.size() && b[lt] == '<' && gt == std::string::npos && !at_end && b.size() - lt < 256) {
      invoke_scan_ = p;
      return false;
    }
    const bool is_tag = gt != std::string::npos && gt - lt < 256;
    const bool closing = is_tag && gt > lt + 1 && b[lt + 1] == '/';
    if (depth_ == 0) {
      if (!is_tag || closing) {  // not a parameter
        fail_invoke(out, p);
        return true;
      }
      std::string tag(b.substr(lt + 1, gt - lt - 1));
      if (group_end_ != 0 && tag != group_tag_) {
        flush_group(out);
        p -= b.size() - buf_.size();
        gt -= b.size() - buf_.size();
        b = buf_;
      }
      group_tag_ = tag;
      elem_start_ = p;
      depth_ = 1;
      from = gt + 1;
      continue;
    }
    if (is_tag) depth_ += closing ? -1 : 1;
    if (depth_ > 0) {
      from = is_tag ? gt + 1 : p + 1;
      continue;
    }
    // The parameter element closed: it must parse on its own.
    const size_t elem_end = gt + 1;
    std::optional<ParsedInvoke> one = parse_m3_invoke(
        invoke_open_ + buf_.substr(elem_start_, elem_end - elem_start_) + std::string(kM3Namespace) + "</invoke>",
        tools_);
    if (!one) {
      fail_invoke(out, elem_end);  // the group before it is kept; this element goes out as text
      // fail_invoke flushed the group: the failed text starts at the element's (whitespace-led) gap.
      return true;
    }
    group_end_ = elem_end;
    from = elem_end;
  }
}

}  // namespace m3
