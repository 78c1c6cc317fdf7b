// A small JSON-schema validator for the subset src/grammar compiles (type, properties, required,
// additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf, $ref, minimum
// 0/1): the reference the grammar tests check generated documents against. Written independently of the compiler.
#pragma once

#include <nlohmann/json.hpp>

namespace m3::test {

inline size_t utf8_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline bool schema_valid(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s,
                         const nlohmann::ordered_json& root) {
  using json = nlohmann::ordered_json;
  if (s.is_boolean()) return s.get<bool>();
  if (auto r = s.find("$ref"); r != s.end()) {
    const std::string p = r->get<std::string>();
    return schema_valid(v, p == "#" ? root : root.at(json::json_pointer(p.substr(1))), root);
  }
  if (auto c = s.find("const"); c != s.end() && v != *c) return false;
  if (auto e = s.find("enum"); e != s.end()) {
    bool any = false;
    for (const json& x : *e) any = any || x == v;
    if (!any) return false;
  }
  if (auto a = s.find("anyOf"); a != s.end()) {
    bool any = false;
    for (const json& x : *a) any = any || schema_valid(v, x, root);
    if (!any) return false;
  }
  if (auto a = s.find("oneOf"); a != s.end()) {
    bool any = false;
    for (const json& x : *a) any = any || schema_valid(v, x, root);
    if (!any) return false;
  }
  if (auto t = s.find("type"); t != s.end()) {
    std::vector<std::string> ts;
    if (t->is_string())
      ts.push_back(*t);
    else
      for (const json& x : *t) ts.push_back(x);
    bool ok = false;
    for (const std::string& x : ts) {
      if (x == "object") ok = ok || v.is_object();
      if (x == "array") ok = ok || v.is_array();
      if (x == "string") ok = ok || v.is_string();
      if (x == "integer") ok = ok || v.is_number_integer();
      if (x == "number") ok = ok || v.is_number();
      if (x == "boolean") ok = ok || v.is_boolean();
      if (x == "null") ok = ok || v.is_null();
    }
    if (!ok) return false;
  }
  if (v.is_number() && s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) return false;
  if (v.is_number() && s.contains("maximum") && v.get<double>() > s["maximum"].get<double>()) return false;
  if (v.is_number() && s.contains("exclusiveMinimum") && v.get<double>() <= s["exclusiveMinimum"].get<double>())
    return false;
  if (v.is_number() && s.contains("exclusiveMaximum") && v.get<double>() >= s["exclusiveMaximum"].get<double>())
    return false;
  if (v.is_string()) {
    const size_t n = utf8_chars(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (auto it = s.find("items"); it != s.end())
      for (const json& x : v)
        if (!schema_valid(x, *it, root)) return false;
  }
  if (v.is_object()) {
    if (auto r = s.find("required"); r != s.end())
      for (const json& k : *r)
        if (!v.contains(k.get<std::string>())) return false;
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props && props->contains(it.key())) {
        if (!schema_valid(*it, (*props)[it.key()], root)) return false;
      } else if (auto a = s.find("additionalProperties"); a != s.end()) {
        if (!schema_valid(*it, *a, root)) return false;
      }
    }
  }
  return true;
}

}  // namespace m3::test
