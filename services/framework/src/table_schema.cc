#include "table_schema.h"

#include <cmath>
#include <set>

#include "threading_table_schema.h"  // generated: kThreadingTableSchema (the schema file's text)

namespace musku::detail {

namespace {

using nlohmann::json;

const std::set<std::string> kKnown = {
    "type",    "const",   "enum",  "required",     "properties", "additionalProperties",
    "items",   "minItems", "minLength", "minimum", "maximum",    "$ref",
    "$defs",   "$schema", "$id",   "title",        "description", "default",
    "x-increasing"};

std::string Join(const std::string& at, const std::string& key) {
  return at.empty() ? key : at + "." + key;
}

bool HasType(const json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return false;
}

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  std::string Check(const json& v, const json& s, const std::string& at) const {
    const std::string where = at.empty() ? "table" : at;
    for (const auto& [key, _] : s.items())
      if (!kKnown.count(key)) return "schema keyword '" + key + "' is not supported";
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"].get<std::string>();
      const std::string prefix = "#/$defs/";
      if (ref.rfind(prefix, 0) != 0 || !root_.contains("$defs") ||
          !root_["$defs"].contains(ref.substr(prefix.size())))
        return "schema reference '" + ref + "' is not resolvable";
      if (auto why = Check(v, root_["$defs"][ref.substr(prefix.size())], at); !why.empty())
        return why;
    }
    if (s.contains("type") && !HasType(v, s["type"].get<std::string>()))
      return where + ": must be " + (s["type"] == "integer" ? "an " : "a ") +
             s["type"].get<std::string>() + ", not " + v.dump();
    if (s.contains("const") && v != s["const"])
      return where + ": must be " + s["const"].dump() + ", not " + v.dump();
    if (s.contains("enum")) {
      bool found = false;
      for (const auto& e : s["enum"]) found = found || e == v;
      if (!found) return where + ": must be one of " + s["enum"].dump() + ", not " + v.dump();
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (!std::isfinite(x)) return where + ": must be finite";
      if (s.contains("minimum") && x < s["minimum"].get<double>())
        return where + ": must be at least " + s["minimum"].dump() + ", not " + v.dump();
      if (s.contains("maximum") && x > s["maximum"].get<double>())
        return where + ": must be at most " + s["maximum"].dump() + ", not " + v.dump();
    }
    if (v.is_string() && s.contains("minLength") &&
        v.get<std::string>().size() < s["minLength"].get<size_t>())
      return where + ": must not be empty";
    if (v.is_object()) {
      if (s.contains("required"))
        for (const auto& k : s["required"])
          if (!v.contains(k.get<std::string>()))
            return Join(at, k.get<std::string>()) + ": missing";
      const json props = s.value("properties", json::object());
      for (const auto& [k, item] : v.items()) {
        if (props.contains(k)) {
          if (auto why = Check(item, props[k], Join(at, k)); !why.empty()) return why;
        } else if (s.contains("additionalProperties") && s["additionalProperties"] == false) {
          return Join(at, k) + ": unknown key";
        }
      }
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>())
        return where + ": needs at least " + s["minItems"].dump() + " item(s)";
      if (s.contains("items"))
        for (size_t i = 0; i < v.size(); ++i)
          if (auto why = Check(v[i], s["items"], at + "[" + std::to_string(i) + "]");
              !why.empty())
            return why;
      if (s.contains("x-increasing")) {
        const std::string f = s["x-increasing"].get<std::string>();
        for (size_t i = 1; i < v.size(); ++i)
          if (!(v[i].at(f).get<double>() > v[i - 1].at(f).get<double>()))
            return at + "[" + std::to_string(i) + "]." + f + ": must be greater than " + at +
                   "[" + std::to_string(i - 1) + "]." + f;
      }
    }
    return "";
  }

 private:
  const json& root_;
};

}  // namespace

const nlohmann::json& ThreadingTableSchema() {
  static const json schema = json::parse(kThreadingTableSchema);
  return schema;
}

std::string ValidateSchema(const nlohmann::json& doc, const nlohmann::json& schema) {
  return Validator(schema).Check(doc, schema, "");
}

}  // namespace musku::detail
