// libFuzzer target for the Jinja renderer: any byte string is a template; parsing and rendering must
// either succeed or throw m3::Error (never crash, hang, or throw anything else). Rendering runs
// against a small chat-like context so loops, attribute access and filters see real data.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "text/jinja/jinja.h"

namespace {

const m3::jinja::Json& context() {
  static const m3::jinja::Json ctx = m3::jinja::Json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "hi é"}, {"type": "image"}]},
      {"role": "assistant", "content": null, "reasoning_content": "r",
       "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, true]}}}]},
      {"role": "tool", "content": "{\"ok\": 1}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "thinking_mode": "enabled",
    "n": 3, "f": -1.5, "s": "a,b,c"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  m3::jinja::Options opts;
  opts.trim_blocks = data[0] & 1;
  opts.lstrip_blocks = data[0] & 2;
  opts.keep_trailing_newline = data[0] & 4;
  opts.max_output_bytes = 1 << 20;  // keep each run small and fast
  opts.max_call_depth = 64;
  opts.wrap_internal_errors = false;
  std::string src(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    auto t = m3::jinja::Template::parse(src, "fuzz", opts);
    (void)t.render(context());
  } catch (const m3::Error&) {
    // Expected for invalid or unsupported templates. Any other exception escapes and crashes the
    // fuzzer: wrap_internal_errors is off, so library exceptions are not disguised as m3::Error.
  }
  return 0;
}
