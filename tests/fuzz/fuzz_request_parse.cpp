// m3-fuzz-libs: m3_server
// libFuzzer target for the server's input side. The first byte picks a mode:
//   0/1  arbitrary bytes as a /v1/chat/completions or /v1/completions body. The parser must either return a
//        request whose every field is in range or throw an ApiError with a 4xx status whose error body is valid
//        JSON — never crash, hang or throw anything else.
//   2    the stop-string matcher: without a match, everything pushed comes back out, in order.
//   3    HTTP framing: the bytes as what a client sent on one connection (pipelined requests), framed with the
//        server's own parser limits and RFC 9112 checks (server/http_framing.h); every complete request's
//        body then goes through mode 0 or 1 by its target.
//   4    deep nesting: a short input expands to a body nested thousands of levels deep at a chosen spot; it
//        must be refused with a 400 when deeper than the limit, never overflow the stack.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/json_depth.h"
#include "server/choice_stream.h"
#include "server/http_framing.h"
#include "server/request_parse.h"

using namespace m3::server;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_request(const ParsedRequest& r, const ApiLimits& lim) {
  const auto& s = r.gen.sampling;
  check(s.temperature >= 0 && s.temperature <= 2);
  check(s.top_p > 0 && s.top_p <= 1);
  check(s.top_k >= -1);
  check(s.min_p >= 0 && s.min_p <= 1);
  check(r.gen.presence_penalty >= -2 && r.gen.presence_penalty <= 2);
  check(r.gen.frequency_penalty >= -2 && r.gen.frequency_penalty <= 2);
  check(r.gen.repetition_penalty > 0 && r.gen.repetition_penalty <= 2);
  check(r.n >= 1 && r.n <= lim.max_n);
  check(!r.max_tokens || (*r.max_tokens >= 1 && *r.max_tokens <= lim.max_model_len));
  check(r.gen.min_tokens >= 0);
  check(r.gen.top_logprobs >= -1 && r.gen.top_logprobs <= lim.max_top_logprobs);
  for (int32_t id : r.gen.stop_token_ids) check(id >= 0 && id < lim.vocab_size);
  for (const auto& [id, bias] : r.gen.logit_bias) check(id >= 0 && id < lim.vocab_size && bias >= -100 && bias <= 100);
  for (const auto& st : r.stop) check(!st.empty());
  if (r.kind == ApiKind::Chat) {
    check(r.messages.is_array() && !r.messages.empty());
    for (const auto& m : r.messages) check(m.is_object() && m.contains("role"));
    (void)r.messages.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } else {
    check(!r.prompts.empty());
    for (const auto& p : r.prompts)
      if (const auto* ids = std::get_if<std::vector<int32_t>>(&p))
        for (int32_t id : *ids) check(id >= 0 && id < lim.vocab_size);
  }
  // The context check must either pass with a usable max_tokens or throw a 400.
  try {
    int mt = resolve_max_tokens(r, 10, lim.max_model_len);
    check(mt >= 1 && 10 + mt <= lim.max_model_len);
  } catch (const ApiError& e) {
    check(e.status == 400);
  }
}

void fuzz_stop_matcher(std::string_view data) {
  // Layout: <stop strings separated by \x01> \x00 <text pieces separated by \x01>
  size_t split = data.find('\0');
  if (split == std::string_view::npos) return;
  std::vector<std::string> stops;
  std::string_view spec = data.substr(0, split);
  for (size_t pos = 0; pos <= spec.size();) {
    size_t end = spec.find('\x01', pos);
    if (end == std::string_view::npos) end = spec.size();
    if (end > pos) stops.emplace_back(spec.substr(pos, end - pos));
    pos = end + 1;
  }
  std::string_view text = data.substr(split + 1);
  StopMatcher m(stops, false);
  std::string out, whole;
  for (size_t pos = 0; pos <= text.size() && !m.matched();) {
    size_t end = text.find('\x01', pos);
    if (end == std::string_view::npos) end = text.size();
    whole.append(text.substr(pos, end - pos));
    out += m.push(text.substr(pos, end - pos));
    check(m.held() < 1 + [&] {
      size_t mx = 0;
      for (const auto& s : stops) mx = std::max(mx, s.size());
      return mx;
    }());
    pos = end + 1;
  }
  if (!m.matched()) {
    out += m.flush();
    check(out == whole);
  } else {
    check(whole.compare(0, out.size(), out) == 0);  // output is a prefix of the input
    check(whole.find(m.matched_stop()) == out.size() ||
          whole.substr(0, out.size() + m.matched_stop().size()).find(m.matched_stop()) != std::string::npos);
  }
}

ApiLimits limits() {
  ApiLimits lim;
  lim.model_name = "m3";
  lim.max_model_len = 4096;
  lim.vocab_size = 1000;
  return lim;
}

// Returns the status of the ApiError thrown, or 0 when the body was accepted.
int fuzz_body(bool chat, std::string_view body) {
  const ApiLimits lim = limits();
  try {
    ParsedRequest r = chat ? parse_chat_request(body, lim) : parse_completion_request(body, lim);
    check_request(r, lim);
    return 0;
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 500);
    auto j = nlohmann::json::parse(error_body(e));
    check(j["error"]["message"].is_string());
    return e.status;
  }
}

void fuzz_framing(std::string_view wire) {
  constexpr size_t kMaxBody = 2048;
  for (int n = 0; !wire.empty() && n < 64; ++n) {
    FramedRequest r = frame_request(wire, kMaxBody);
    if (r.state == FramedRequest::State::Incomplete) return;
    if (r.state == FramedRequest::State::Error) {
      // The connection answers this and closes: nothing after it is read.
      check(r.error_status == 400 || r.error_status == 413 || r.error_status == 431 || r.error_status == 501);
      return;
    }
    check(r.consumed > 0 && r.consumed <= wire.size());
    check(r.body.size() <= kMaxBody);
    // Same bytes, same framing: the request boundary is a function of the bytes alone.
    check(frame_request(wire.substr(0, r.consumed), kMaxBody).consumed == r.consumed);
    if (r.method == "POST") fuzz_body(r.target.find("chat") != std::string::npos, r.body);
    wire.remove_prefix(r.consumed);
  }
}

void fuzz_deep_nesting(std::string_view data) {
  // Layout: depth (2 bytes) | opener kind (1 byte) | body template, where '@' marks where the nesting goes.
  if (data.size() < 3) return;
  const size_t depth = (size_t(uint8_t(data[0])) << 8 | uint8_t(data[1])) % 20000;
  static const char* kOpen[] = {"[", "{\"a\":", "[1,", "{\"a\":[", "[\"x\",{\"b\":"};
  static const char* kClose[] = {"]", "}", "]", "]}", "}]"};
  const size_t k = uint8_t(data[2]) % 5;
  std::string_view tmpl = data.substr(3);
  const size_t at = tmpl.find('@');
  std::string body;
  body.reserve(tmpl.size() + depth * 12);
  body.append(tmpl.substr(0, at == std::string_view::npos ? tmpl.size() : at));
  for (size_t i = 0; i < depth; ++i) body += kOpen[k];
  body += "0";
  for (size_t i = 0; i < depth; ++i) body += kClose[k];
  if (at != std::string_view::npos) body.append(tmpl.substr(at + 1));
  const int status = fuzz_body(depth % 2 == 0, body);
  // Brackets outside strings nested past the limit: refused before parsing, never recursed into.
  if (m3::json_too_deep(body)) check(status == 400);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 5;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode) {
    case 2:
      fuzz_stop_matcher(body);
      break;
    case 3:
      fuzz_framing(body);
      break;
    case 4:
      fuzz_deep_nesting(body);
      break;
    default:
      fuzz_body(mode == 0, body);
  }
  return 0;
}
