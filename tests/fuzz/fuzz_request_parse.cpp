// m3-fuzz-libs: m3_server
// libFuzzer target for the server's validation layer: arbitrary bytes as a /v1/chat/completions or
// /v1/completions body. The parser must either return a request whose every field is in range or throw an
// ApiError with a 4xx status whose error body is valid JSON — never crash, hang or throw anything else.
// A second mode checks the stop-string matcher: without a match, everything pushed comes back out, in order.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/choice_stream.h"
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char mode = char(data[0] % 3);
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 2) {
    fuzz_stop_matcher(body);
    return 0;
  }
  ApiLimits lim;
  lim.model_name = "m3";
  lim.max_model_len = 4096;
  lim.vocab_size = 1000;
  try {
    ParsedRequest r = mode == 0 ? parse_chat_request(body, lim) : parse_completion_request(body, lim);
    check_request(r, lim);
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 500);
    auto j = nlohmann::json::parse(error_body(e));
    check(j["error"]["message"].is_string());
  }
  return 0;
}
