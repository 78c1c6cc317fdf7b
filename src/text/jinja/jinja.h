// A Jinja2 subset renderer for chat templates.
//
// Goal: byte-identical output with Python jinja2 configured the way HuggingFace's apply_chat_template
// configures it (ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, loopcontrols,
// the `tojson` override with ensure_ascii=False, and the raise_exception / strftime_now globals).
// Values are JSON documents (nlohmann::ordered_json, so object key order survives like Python dicts)
// plus the few runtime-only kinds Jinja needs (undefined, namespace, macro, loop).
//
// Anything outside the supported subset ({% extends %}, {% include %}, unknown filters/tests, ...) is
// rejected at parse time with an m3::Error "name:line:col: message". Runtime failures (undefined
// attribute access, type errors, raise_exception) throw m3::Error too; bad templates never crash.
// Docs: docs/TEXT_TEMPLATES.md.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace m3::jinja {

using Json = nlohmann::ordered_json;

struct Options {
  bool trim_blocks = true;              // drop the first newline after a block/comment tag
  bool lstrip_blocks = true;            // strip spaces/tabs before a block/comment tag at line start
  bool keep_trailing_newline = false;   // jinja2 default: one trailing newline of the source is dropped
  std::size_t max_output_bytes = std::size_t{1} << 30;  // guards against `'a' * 10**12` style blow-ups
  int max_call_depth = 256;             // macro recursion limit (stack safety)
  // Convert stray library exceptions (renderer bugs) into m3::Error. The fuzz target turns it off so
  // such bugs crash loudly instead.
  bool wrap_internal_errors = true;
};

struct Program;  // parsed AST, defined in jinja_internal.h

class Template {
 public:
  // Throws m3::Error "name:line:col: ..." on syntax errors and unsupported constructs.
  static Template parse(std::string source, std::string name = "template", Options opts = {});

  // Renders with `context` (a JSON object) as the global variables.
  std::string render(const Json& context) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const Program> prog_;
};

}  // namespace m3::jinja
