#include "grammar/json_schema.h"

#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace conveyor::grammar {
namespace {

using json = nlohmann::ordered_json;

// JSON's own rules, which every compiled schema may use. Numbers stay within what every
// JSON parser reads: at most 16 digits before and after the point, exponents of 1-2 digits
// (so never past a double's range), integers within 64 bits.
constexpr const char* kJsonRules = R"(ws ::= "" | " "
json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] | "\\u" json-code-unit
json-code-unit ::= [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}
json-number ::= json-integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ( json-member ( "," ws json-member )* )? "}"
json-member ::= json-string ":" ws json-value
json-array ::= "[" ( json-value ( "," ws json-value )* )? "]"
)";

const std::set<std::string>& Annotations() {
  static const std::set<std::string> names = {"title",    "description", "default",
                                              "examples", "$schema",     "$id",
                                              "$comment", "$defs",       "definitions"};
  return names;
}

const std::set<std::string>& Supported() {
  static const std::set<std::string> names = {
      "type",  "properties",  "required",  "additionalProperties",
      "items", "prefixItems", "minItems",  "maxItems",
      "enum",  "const",       "anyOf",     "oneOf",
      "$ref",  "minLength",   "maxLength", "nullable"};
  return names;
}

// A grammar literal of `text`.
std::string Literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

class Compiler {
 public:
  Compiler(const json& root, const SchemaLimits& limits) : root_(root), limits_(limits) {}

  absl::StatusOr<std::string> Run() {
    std::optional<std::string> top = Compile(root_, "$", 0);
    if (!top.has_value()) return error_;
    std::string out = absl::StrCat("root ::= ", *top, "\n", kJsonRules);
    for (const std::string& rule : rules_) absl::StrAppend(&out, rule, "\n");
    return out;
  }

 private:
  std::nullopt_t Fail(const std::string& path, const std::string& what) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat("JSON Schema at ", path, ": ", what));
    }
    return std::nullopt;
  }

  // A new rule `body`, by name; nullopt past the rule limit.
  std::optional<std::string> Define(const std::string& body, const std::string& path) {
    if (static_cast<int>(rules_.size()) >= limits_.max_rules) {
      return Fail(path,
                  absl::StrCat("the schema needs more than ", limits_.max_rules, " grammar rules"));
    }
    const std::string name = absl::StrCat("s", rules_.size());
    rules_.push_back(absl::StrCat(name, " ::= ", body));
    return name;
  }

  std::optional<int> Count(const json& schema, const char* key, const std::string& path) {
    if (!schema.contains(key)) return std::nullopt;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      Fail(path + "." + key, "must be a non-negative integer");
      return -1;
    }
    if (v.get<int64_t>() > limits_.max_repeat) {
      Fail(path + "." + key, absl::StrCat("above the limit of ", limits_.max_repeat));
      return -1;
    }
    return static_cast<int>(v.get<int64_t>());
  }

  // An expression (a rule name or a literal) for the values `schema` accepts.
  std::optional<std::string> Compile(const json& schema, const std::string& path, int depth) {
    if (depth > limits_.max_depth) {
      return Fail(path, absl::StrCat("schemas nest deeper than ", limits_.max_depth));
    }
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return std::string("json-value");
      return Fail(path, "the schema `false` accepts no value");
    }
    if (!schema.is_object()) return Fail(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (!Supported().contains(key) && !Annotations().contains(key)) {
        return Fail(path, absl::StrCat("the keyword `", key, "` is not supported"));
      }
    }
    std::optional<std::string> expr = CompileNonNull(schema, path, depth);
    if (expr.has_value() && schema.value("nullable", false)) {
      return Define(absl::StrCat(*expr, " | json-null"), path);
    }
    return expr;
  }

  std::optional<std::string> CompileNonNull(const json& schema, const std::string& path,
                                            int depth) {
    if (schema.contains("$ref")) return Ref(schema["$ref"], path + ".$ref", depth);
    if (schema.contains("const")) return Literal(schema["const"].dump());
    if (schema.contains("enum")) {
      const json& values = schema["enum"];
      if (!values.is_array() || values.empty()) {
        return Fail(path + ".enum", "must be a non-empty array");
      }
      std::string body;
      for (const json& v : values)
        absl::StrAppend(&body, body.empty() ? "" : " | ", Literal(v.dump()));
      return Define(body, path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      const json& options = schema[key];
      if (!options.is_array() || options.empty()) {
        return Fail(absl::StrCat(path, ".", key), "must be a non-empty array");
      }
      std::string body;
      for (size_t i = 0; i < options.size(); ++i) {
        std::optional<std::string> e =
            Compile(options[i], absl::StrCat(path, ".", key, "[", i, "]"), depth + 1);
        if (!e.has_value()) return std::nullopt;
        absl::StrAppend(&body, body.empty() ? "" : " | ", *e);
      }
      return Define(body, path);
    }
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& one : t) {
          if (!one.is_string()) return Fail(path + ".type", "must be a string or strings");
          types.push_back(one.get<std::string>());
        }
      } else {
        return Fail(path + ".type", "must be a string or a non-empty array of strings");
      }
    } else if (schema.contains("properties") || schema.contains("required") ||
               schema.contains("additionalProperties")) {
      types.emplace_back("object");
    } else if (schema.contains("items") || schema.contains("prefixItems")) {
      types.emplace_back("array");
    } else if (schema.contains("minLength") || schema.contains("maxLength")) {
      types.emplace_back("string");
    } else {
      return std::string("json-value");
    }
    std::string body;
    for (const std::string& type : types) {
      std::optional<std::string> e = Typed(type, schema, path, depth);
      if (!e.has_value()) return std::nullopt;
      absl::StrAppend(&body, body.empty() ? "" : " | ", *e);
    }
    return types.size() == 1 ? std::optional<std::string>(body) : Define(body, path);
  }

  std::optional<std::string> Typed(const std::string& type, const json& schema,
                                   const std::string& path, int depth) {
    if (type == "number") return std::string("json-number");
    if (type == "integer") return std::string("json-integer");
    if (type == "boolean") return std::string("json-boolean");
    if (type == "null") return std::string("json-null");
    if (type == "string") {
      std::optional<int> min = Count(schema, "minLength", path);
      std::optional<int> max = Count(schema, "maxLength", path);
      if (!error_.ok()) return std::nullopt;
      if (!min.has_value() && !max.has_value()) return std::string("json-string");
      if (max.has_value() && *max < min.value_or(0)) {
        return Fail(path, "maxLength is below minLength");
      }
      return Define(absl::StrCat("\"\\\"\" json-char{", min.value_or(0), ",",
                                 max.has_value() ? absl::StrCat(*max) : "", "} \"\\\"\""),
                    path);
    }
    if (type == "object") return Object(schema, path, depth);
    if (type == "array") return Array(schema, path, depth);
    return Fail(path + ".type", absl::StrCat("unknown type `", type, "`"));
  }

  std::optional<std::string> Ref(const json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return Fail(path, "must be a string");
    const std::string target = ref.get<std::string>();
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (target.rfind(prefix, 0) == 0) {
        section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = target.substr(std::string(prefix).size());
      }
    }
    if (name.empty() || name.find('/') != std::string::npos) {
      return Fail(path, absl::StrCat("only references to #/$defs/NAME or #/definitions/NAME "
                                     "are supported, not `",
                                     target, "`"));
    }
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (!root_.contains(section) || !root_[section].contains(name)) {
      return Fail(path, absl::StrCat("`", target, "` names no definition"));
    }
    // Named before it is compiled, so that a recursive reference finds it.
    if (static_cast<int>(rules_.size()) >= limits_.max_rules) {
      return Fail(path, "the schema needs too many grammar rules");
    }
    const size_t slot = rules_.size();
    const std::string rule = absl::StrCat("s", slot);
    rules_.emplace_back();
    refs_[target] = rule;
    std::optional<std::string> body =
        Compile(root_[section][name], absl::StrCat("$.", section, ".", name), depth + 1);
    if (!body.has_value()) return std::nullopt;
    rules_[slot] = absl::StrCat(rule, " ::= ", *body);
    return rule;
  }

  std::optional<std::string> Object(const json& schema, const std::string& path, int depth) {
    struct Member {
      std::string key;
      std::string value;
      bool required = false;
    };
    std::vector<Member> members;
    std::set<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) return Fail(path + ".required", "must be an array");
      for (const json& r : schema["required"]) {
        if (!r.is_string()) return Fail(path + ".required", "must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    std::set<std::string> seen;
    if (schema.contains("properties")) {
      if (!schema["properties"].is_object()) return Fail(path + ".properties", "must be an object");
      for (const auto& [key, sub] : schema["properties"].items()) {
        std::optional<std::string> value =
            Compile(sub, absl::StrCat(path, ".properties.", key), depth + 1);
        if (!value.has_value()) return std::nullopt;
        members.push_back({key, *value, required.contains(key)});
        seen.insert(key);
      }
    }
    for (const std::string& key : required) {
      if (!seen.contains(key)) members.push_back({key, "json-value", true});
    }
    std::optional<std::string> extra = std::string("json-value");
    if (schema.contains("additionalProperties")) {
      const json& a = schema["additionalProperties"];
      if (a.is_boolean() && !a.get<bool>()) {
        extra.reset();
      } else {
        extra = Compile(a, path + ".additionalProperties", depth + 1);
        if (!extra.has_value()) return std::nullopt;
      }
    }
    // first_i: members i.. with no comma before; rest_i: the same after a member.
    std::string first, rest;
    if (extra.has_value()) {
      const std::string kv = absl::StrCat("json-string \":\" ws ", *extra);
      std::optional<std::string> r =
          Define(absl::StrCat("\"\" | \",\" ws ", kv, " ", "REST_SELF"), path);
      if (!r.has_value()) return std::nullopt;
      // A rule that repeats itself: patch its own name in.
      rules_.back().replace(rules_.back().find("REST_SELF"), 9, *r);
      rest = *r;
      std::optional<std::string> f = Define(absl::StrCat("\"\" | ", kv, " ", rest), path);
      if (!f.has_value()) return std::nullopt;
      first = *f;
    } else {
      first = rest = "\"\"";
    }
    for (size_t i = members.size(); i-- > 0;) {
      const Member& m = members[i];
      const std::string kv = absl::StrCat(Literal(json(m.key).dump()), " \":\" ws ", m.value);
      std::optional<std::string> f =
          Define(absl::StrCat(kv, " ", rest, m.required ? "" : " | " + first), path);
      std::optional<std::string> r =
          Define(absl::StrCat("\",\" ws ", kv, " ", rest, m.required ? "" : " | " + rest), path);
      if (!f.has_value() || !r.has_value()) return std::nullopt;
      first = *f;
      rest = *r;
    }
    return Define(absl::StrCat("\"{\" ", first, " \"}\""), path);
  }

  std::optional<std::string> Array(const json& schema, const std::string& path, int depth) {
    std::vector<std::string> prefix;
    if (schema.contains("prefixItems")) {
      const json& p = schema["prefixItems"];
      if (!p.is_array()) return Fail(path + ".prefixItems", "must be an array");
      for (size_t i = 0; i < p.size(); ++i) {
        std::optional<std::string> e =
            Compile(p[i], absl::StrCat(path, ".prefixItems[", i, "]"), depth + 1);
        if (!e.has_value()) return std::nullopt;
        prefix.push_back(*e);
      }
    }
    std::optional<std::string> item = std::string("json-value");
    if (schema.contains("items")) {
      const json& it = schema["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        item.reset();
      } else {
        item = Compile(it, path + ".items", depth + 1);
        if (!item.has_value()) return std::nullopt;
      }
    }
    const int min = Count(schema, "minItems", path).value_or(0);
    std::optional<int> max = Count(schema, "maxItems", path);
    if (!error_.ok()) return std::nullopt;
    if (max.has_value() && *max < min) return Fail(path, "maxItems is below minItems");
    const int k = static_cast<int>(prefix.size());
    // After the prefix: `item` between min_tail and max_tail times.
    const int min_tail = std::max(0, min - k);
    const std::optional<int> max_tail = !item.has_value() ? std::optional<int>(0)
                                        : max.has_value()
                                            ? std::optional<int>(std::max(0, *max - k))
                                            : std::nullopt;
    if (max_tail.has_value() && *max_tail < min_tail) {
      return Fail(path, "minItems asks for more items than the schema allows");
    }
    std::string first = "\"\"", rest = "\"\"";
    if (item.has_value() && (!max_tail.has_value() || *max_tail > 0)) {
      const std::string bound =
          absl::StrCat("{", std::max(0, min_tail - 1), ",",
                       max_tail.has_value() ? absl::StrCat(*max_tail - 1) : "", "}");
      const std::string tail = absl::StrCat(*item, " ( \",\" ws ", *item, " )", bound);
      std::optional<std::string> f =
          Define(min_tail > 0 ? tail : absl::StrCat("\"\" | ", tail), path);
      std::optional<std::string> r =
          Define(absl::StrCat("( \",\" ws ", *item, " ){", min_tail, ",",
                              max_tail.has_value() ? absl::StrCat(*max_tail) : "", "}"),
                 path);
      if (!f.has_value() || !r.has_value()) return std::nullopt;
      first = *f;
      rest = *r;
    }
    // Prefix items in order; from index `min` on, the array may stop.
    for (int i = k; i-- > 0;) {
      const bool optional = i >= min;
      std::optional<std::string> f =
          Define(absl::StrCat(prefix[i], " ", rest, optional ? " | \"\"" : ""), path);
      std::optional<std::string> r =
          Define(absl::StrCat("\",\" ws ", prefix[i], " ", rest, optional ? " | \"\"" : ""), path);
      if (!f.has_value() || !r.has_value()) return std::nullopt;
      first = *f;
      rest = *r;
    }
    return Define(absl::StrCat("\"[\" ", first, " \"]\""), path);
  }

  const json& root_;
  const SchemaLimits& limits_;
  std::vector<std::string> rules_;
  std::map<std::string, std::string> refs_;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGrammar(const json& schema, const SchemaLimits& limits) {
  return Compiler(schema, limits).Run();
}

std::string AnyJsonObjectGrammar() { return absl::StrCat("root ::= json-object\n", kJsonRules); }

}  // namespace conveyor::grammar
