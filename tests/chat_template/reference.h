// Test helper: runs tests/chat_template/reference_render.py (Python jinja2 configured like
// transformers) on a batch of jobs and returns its results. Used by tests/text/jinja_test.cpp and
// tests/text/chat_template_test.cpp. Paths are resolved from this header's location, so the test
// binaries work from any working directory.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace m3::testref {

// From the build's source-dir definition, not __FILE__: a compiler launcher such as ccache with a base dir makes
// __FILE__ relative to the build directory, which the test's working directory is not.
inline std::filesystem::path chat_template_dir() {
#ifdef M3_SOURCE_DIR
  return std::filesystem::path(M3_SOURCE_DIR) / "tests" / "chat_template";
#else
  return std::filesystem::path(__FILE__).lexically_normal().parent_path();
#endif
}
inline std::filesystem::path repo_root() { return chat_template_dir().parent_path().parent_path(); }

// m3serve's own M3-format test template (tests/chat_template/m3_format_synthetic.jinja).
inline std::filesystem::path synthetic_m3_template_path() { return chat_template_dir() / "m3_format_synthetic.jinja"; }

// MiniMax's released MiniMax-M3 chat_template.jinja, when a developer has put a copy at .gl/minimax_m3_official.jinja
// (ignored by git: the file is under the MiniMax Community License and never committed; docs/TEXT_TEMPLATES.md says
// how to get it) or names one in $M3_OFFICIAL_M3_TEMPLATE. Empty path when there is none: tests then skip.
inline std::filesystem::path official_m3_template_path() {
  std::filesystem::path p = repo_root() / ".gl" / "minimax_m3_official.jinja";
  if (const char* env = std::getenv("M3_OFFICIAL_M3_TEMPLATE"); env && *env) p = env;
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// jobs: array of {"template", "context"} or {"template", "inputs", "bos_token", "eos_token"}.
// Returns an array of {"ok": bool, "out"|"error": string}; throws std::runtime_error if Python fails.
inline nlohmann::ordered_json run_reference(const nlohmann::ordered_json& jobs) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("m3_jinja_ref_" + std::to_string(::getpid()) + "_" +
                                              std::to_string(reinterpret_cast<uintptr_t>(&jobs)));
  fs::create_directories(dir);
  fs::path in = dir / "jobs.json", out = dir / "out.json";
  {
    std::ofstream f(in, std::ios::binary);
    f << nlohmann::ordered_json{{"jobs", jobs}}.dump();
  }
  std::string cmd = "/usr/bin/python3 '" + (chat_template_dir() / "reference_render.py").string() + "' '" +
                    in.string() + "' '" + out.string() + "'";
  int rc = std::system(cmd.c_str());
  if (rc != 0) throw std::runtime_error("reference renderer failed (is python3-jinja2 installed?): " + cmd);
  auto res = nlohmann::ordered_json::parse(slurp(out));
  fs::remove_all(dir);
  return res;
}

}  // namespace m3::testref
