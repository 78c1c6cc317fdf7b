// Jinja renderer vs Python jinja2 (Debian python3-jinja2, configured like transformers'
// apply_chat_template) on feature cases from tests/chat_template/jinja_cases.json, plus error
// reporting for unsupported constructs.
#include <unistd.h>

#include <gtest/gtest.h>

#include "../chat_template/reference.h"
#include "base/error.h"
#include "text/jinja/jinja.h"

namespace m3 {
namespace {

using OJson = nlohmann::ordered_json;

struct Outcome {
  bool ok = false;
  std::string text;  // output or error message
};

Outcome render_cpp(const std::string& src, const OJson& ctx, const std::string& name) {
  try {
    return {true, jinja::Template::parse(src, name).render(ctx)};
  } catch (const Error& e) {
    return {false, e.what()};
  }
}

TEST(JinjaReference, FeatureCasesMatchPythonJinja2ByteForByte) {
  OJson cases = OJson::parse(testref::slurp(testref::chat_template_dir() / "jinja_cases.json"))["cases"];
  ASSERT_GT(cases.size(), 40u);
  OJson jobs = OJson::array();
  for (auto& c : cases) jobs.push_back({{"template", c["template"]}, {"context", c["context"]}});
  OJson ref = testref::run_reference(jobs);
  ASSERT_EQ(ref.size(), cases.size());
  size_t compared_ok = 0, compared_err = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i]["name"].get<std::string>();
    Outcome got = render_cpp(cases[i]["template"].get<std::string>(), cases[i]["context"], name);
    const bool ref_ok = ref[i]["ok"].get<bool>();
    if (ref_ok) {
      const std::string want = ref[i]["out"].get<std::string>();
      EXPECT_TRUE(got.ok) << name << ": C++ failed (" << got.text << ") but jinja2 rendered:\n" << want;
      EXPECT_EQ(got.text, want) << "case " << name;
      ++compared_ok;
    } else {
      const std::string err = ref[i]["error"].get<std::string>();
      EXPECT_FALSE(got.ok) << name << ": jinja2 failed (" << err << ") but C++ rendered:\n" << got.text;
      // The same failure: jinja2's message (minus its exception type) ends C++'s, which prefixes
      // "template:line: ". Python's RecursionError has its own wording.
      std::string want = err.substr(err.find(": ") + 2);
      if (err.rfind("RecursionError", 0) == 0) want = "recursion depth exceeded";
      EXPECT_TRUE(got.text.size() >= want.size() &&
                  got.text.compare(got.text.size() - want.size(), want.size(), want) == 0)
          << name << "\n  jinja2: " << err << "\n  C++:    " << got.text;
      ++compared_err;
    }
  }
  // Both kinds of outcome must be exercised, or the suite is not testing what it claims.
  EXPECT_GT(compared_ok, 40u);
  EXPECT_GT(compared_err, 5u);
}

TEST(JinjaReference, RaiseExceptionCarriesTheTemplateMessage) {
  try {
    jinja::Template::parse("{{ raise_exception('roles must alternate') }}").render(OJson::object());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "roles must alternate");
  }
}

// Error messages must name the template and the line of the offending construct.
void expect_error(const std::string& src, const std::string& needle, bool at_parse = true) {
  try {
    auto t = jinja::Template::parse(src, "tmpl");
    if (at_parse) {
      ADD_FAILURE() << "parse accepted: " << src;
      return;
    }
    t.render(OJson{{"d", OJson::object()}});
    ADD_FAILURE() << "render accepted: " << src;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

TEST(JinjaErrors, UnsupportedConstructsNameTheLine) {
  expect_error("line1\nline2\n{% extends 'base.html' %}", "tmpl:3:");
  expect_error("{% extends 'base.html' %}", "unsupported template tag 'extends'");
  expect_error("a\n{% include 'x' %}", "tmpl:2:");
  expect_error("a\n\n\n  {{ x | frobnicate }}", "tmpl:4:");
  expect_error("{{ x | frobnicate }}", "no filter named 'frobnicate'");
  expect_error("\n{% if x is wobbly %}{% endif %}", "tmpl:2:");
  expect_error("{% for x in y recursive %}{% endfor %}", "recursive");
  expect_error("{% frobnicate %}", "unknown template tag 'frobnicate'");
  expect_error("x\n{% if true %}\nno end", "tmpl:3:");  // reported where the template ends
  expect_error("{{ 1 + }}", "tmpl:1:");
  expect_error("{% break %}", "outside of a for loop");
  expect_error("{# never closed", "Missing end of comment tag");
  expect_error("{{ 'a' }", "tmpl:1:");
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  expect_error("ok\n{{ d.missing.deeper }}", "tmpl:2: 'dict object' has no attribute 'missing'", false);
  expect_error("\n\n{{ nope.x }}", "tmpl:3: 'nope' is undefined", false);
  expect_error("{{ 'a' + 1 }}", "tmpl:1:", false);
  expect_error("{% set d.x = 1 %}", "non-namespace", false);
}

TEST(JinjaLimits, HostileTemplatesFailCleanly) {
  jinja::Options o;
  o.max_output_bytes = 1 << 20;
  EXPECT_THROW(jinja::Template::parse("{{ 'a' * 100000000 }}", "t", o).render(OJson::object()), Error);
  EXPECT_THROW(jinja::Template::parse("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").render(OJson::object()),
               Error);
  EXPECT_THROW(jinja::Template::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), Error);
  EXPECT_THROW(jinja::Template::parse("{{ range(1000000)|length }}").render(OJson::object()), Error);
  EXPECT_THROW(jinja::Template::parse("x").render(OJson::array()), Error);
}

TEST(JinjaValues, ObjectKeyOrderIsPreservedLikePythonDicts) {
  OJson ctx = OJson::parse(R"({"x": {"zeta": 1, "alpha": 2}})");
  EXPECT_EQ(jinja::Template::parse("{{ x|tojson }} {{ x }}").render(ctx), R"({"zeta": 1, "alpha": 2} {'zeta': 1, 'alpha': 2})");
}

}  // namespace
}  // namespace m3
