#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grammar/regex.h"

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

// Rules compiled schemas may use, appended once each when used: `format`s and numbers
// with a sign bound. Strings of these formats never hold characters JSON escapes.
const std::map<std::string, std::string>& Fragments() {
  static const std::map<std::string, std::string> fragments = {
      {"fmt-date",
       R"(fmt-date ::= fmt-year "-" ( ( "0" [13578] | "1" [02] ) "-" fmt-day31 | ( "0" [469] | "11" ) "-" fmt-day30 | "02-" fmt-day28 ) | fmt-leap-year "-02-29"
fmt-year ::= [1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9]
fmt-leap-year ::= [0-9]{2} fmt-leap-end | fmt-leap-end "00"
fmt-leap-end ::= "0" [48] | [2468] [048] | [13579] [26]
fmt-day28 ::= "0" [1-9] | "1" [0-9] | "2" [0-8]
fmt-day30 ::= fmt-day28 | "29" | "30"
fmt-day31 ::= fmt-day30 | "31"
)"},
      {"fmt-time",
       R"(fmt-time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+\-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )
)"},
      {"fmt-date-time", "fmt-date-time ::= fmt-date \"T\" fmt-time\n"},
      {"fmt-hostname", R"(fmt-hostname ::= fmt-label ( "." fmt-label ){0,3}
fmt-label ::= [A-Za-z0-9] ( [A-Za-z0-9\-]{0,60} [A-Za-z0-9] )?
)"},
      {"fmt-email", R"(fmt-email ::= fmt-atom ( "." fmt-atom )* "@" fmt-label ( "." fmt-label ){1,3}
fmt-atom ::= [A-Za-z0-9_%+\-]+
)"},
      {"fmt-uuid",
       "fmt-uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
       "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n"},
      {"fmt-ipv4", R"(fmt-ipv4 ::= fmt-octet ( "." fmt-octet ){3}
fmt-octet ::= "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9]{2} | [1-9] [0-9] | [0-9]
)"},
      {"fmt-ipv6",
       R"(fmt-ipv6 ::= fmt-h16c{6} fmt-ls32 | "::" fmt-h16c{5} fmt-ls32 | fmt-h16? "::" fmt-h16c{4} fmt-ls32 | ( fmt-h16c{0,1} fmt-h16 )? "::" fmt-h16c{3} fmt-ls32 | ( fmt-h16c{0,2} fmt-h16 )? "::" fmt-h16c{2} fmt-ls32 | ( fmt-h16c{0,3} fmt-h16 )? "::" fmt-h16c fmt-ls32 | ( fmt-h16c{0,4} fmt-h16 )? "::" fmt-ls32 | ( fmt-h16c{0,5} fmt-h16 )? "::" fmt-h16 | ( fmt-h16c{0,6} fmt-h16 )? "::"
fmt-h16 ::= [0-9a-fA-F]{1,4}
fmt-h16c ::= fmt-h16 ":"
fmt-ls32 ::= fmt-h16 ":" fmt-h16 | fmt-ipv4
)"},
      {"fmt-uri",
       R"(fmt-uri ::= [A-Za-z] [A-Za-z0-9+.\-]* "://" fmt-host ( ":" [0-9]{1,5} )? ( "/" fmt-pchar* )* ( "?" fmt-qchar* )? ( "#" fmt-qchar* )?
fmt-host ::= fmt-hostname | fmt-ipv4 | "[" fmt-ipv6 "]"
fmt-pchar ::= [A-Za-z0-9\-._~!$&'()*+,;=:@] | "%" [0-9A-Fa-f]{2}
fmt-qchar ::= fmt-pchar | [/?]
)"},
      // Numbers with a sign bound, within json-number's digit limits.
      {"num-unsigned", R"(num-unsigned ::= ( "0" | [1-9] [0-9]{0,15} ) num-frac? num-exp?
num-frac ::= "." [0-9]{1,16}
num-exp ::= [eE] [-+]? [0-9]{1,2}
)"},
      {"num-positive",
       R"(num-positive ::= [1-9] [0-9]{0,15} num-frac? num-exp? | "0." num-nonzero-frac num-exp?
num-nonzero-frac ::= "0"{0,15} [1-9] [0-9]{0,15}
)"},
      {"num-zero", R"(num-zero ::= "0" ( "." "0"{1,16} )? num-exp?
)"},
  };
  return fragments;
}

// What each fragment uses.
const std::map<std::string, std::vector<std::string>>& FragmentDeps() {
  static const std::map<std::string, std::vector<std::string>> deps = {
      {"fmt-date-time", {"fmt-date", "fmt-time"}},
      {"fmt-email", {"fmt-hostname"}},
      {"fmt-ipv6", {"fmt-ipv4"}},
      {"fmt-uri", {"fmt-hostname", "fmt-ipv4", "fmt-ipv6"}},
      {"num-positive", {"num-unsigned"}},
      {"num-zero", {"num-unsigned"}},
  };
  return deps;
}

const std::set<std::string>& Annotations() {
  static const std::set<std::string> names = {"title",    "description", "default",
                                              "examples", "$schema",     "$id",
                                              "$comment", "$defs",       "definitions"};
  return names;
}

const std::set<std::string>& Supported() {
  static const std::set<std::string> names = {"type",
                                              "properties",
                                              "required",
                                              "additionalProperties",
                                              "items",
                                              "prefixItems",
                                              "minItems",
                                              "maxItems",
                                              "enum",
                                              "const",
                                              "anyOf",
                                              "oneOf",
                                              "$ref",
                                              "minLength",
                                              "maxLength",
                                              "nullable",
                                              "pattern",
                                              "format",
                                              "allOf",
                                              "minimum",
                                              "maximum",
                                              "exclusiveMinimum",
                                              "exclusiveMaximum"};
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
    for (const std::string& name : fragments_) absl::StrAppend(&out, Fragments().at(name));
    absl::StrAppend(&out, extra_text_);
    if (out.size() > limits_.max_grammar_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the JSON Schema compiles to too large a grammar (", out.size(),
                       " bytes, the limit is ", limits_.max_grammar_bytes, ")"));
    }
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
    if (static_cast<int>(rules_.size()) + extra_rules_ >= limits_.max_rules) {
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
    if (schema.contains("allOf")) {
      // The branches merged into one schema (nullable included), compiled instead.
      std::optional<json> merged = MergeAllOf(schema, path, depth);
      if (!merged.has_value()) return std::nullopt;
      return Compile(*merged, path, depth + 1);
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
    } else if (schema.contains("minLength") || schema.contains("maxLength") ||
               schema.contains("pattern") || schema.contains("format")) {
      types.emplace_back("string");
    } else if (schema.contains("minimum") || schema.contains("maximum") ||
               schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum")) {
      types.emplace_back("number");
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
    if (type == "number") return Number(schema, path);
    if (type == "integer") return Integer(schema, path);
    if (type == "boolean") return std::string("json-boolean");
    if (type == "null") return std::string("json-null");
    if (type == "string") {
      if (schema.contains("pattern") || schema.contains("format")) return Pattern(schema, path);
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

  // Adds fragment `name` (and what it uses) to the grammar.
  void UseFragment(const std::string& name) {
    if (!fragments_.insert(name).second) return;
    if (auto it = FragmentDeps().find(name); it != FragmentDeps().end()) {
      for (const std::string& dep : it->second) UseFragment(dep);
    }
  }

  // A string with `pattern` or `format` (not both, and no length bounds: the grammar form
  // cannot intersect two languages).
  std::optional<std::string> Pattern(const json& schema, const std::string& path) {
    for (const char* other : {"minLength", "maxLength", "format"}) {
      if (schema.contains("pattern") && schema.contains(other)) {
        return Fail(path, absl::StrCat("`pattern` cannot be combined with `", other, "`"));
      }
    }
    if (schema.contains("format")) {
      for (const char* other : {"minLength", "maxLength"}) {
        if (schema.contains(other)) {
          return Fail(path, absl::StrCat("`format` cannot be combined with `", other, "`"));
        }
      }
      const json& f = schema["format"];
      if (!f.is_string()) return Fail(path + ".format", "must be a string");
      const std::string name = "fmt-" + f.get<std::string>();
      if (!Fragments().contains(name)) {
        return Fail(path + ".format",
                    absl::StrCat("the format `", f.get<std::string>(),
                                 "` is not supported (supported: date, time, date-time, email, "
                                 "hostname, ipv4, ipv6, uri, uuid)"));
      }
      UseFragment(name);
      return Define(absl::StrCat("\"\\\"\" ", name, " \"\\\"\""), path);
    }
    const json& p = schema["pattern"];
    if (!p.is_string()) return Fail(path + ".pattern", "must be a string");
    const std::string name = absl::StrCat("p", extra_rules_);
    absl::StatusOr<std::string> rules = RegexToRules(
        p.get<std::string>(), name, RegexMatch::kSearch, RegexEncoding::kJsonStringContent);
    if (!rules.ok()) return Fail(path + ".pattern", std::string(rules.status().message()));
    extra_rules_ += static_cast<int>(std::count(rules->begin(), rules->end(), '\n'));
    absl::StrAppend(&extra_text_, *rules);
    return Define(absl::StrCat("\"\\\"\" ", name, " \"\\\"\""), path);
  }

  // A bound keyword's value, if present: a number. `exclusive` is set for Draft 4's boolean
  // exclusiveMinimum/exclusiveMaximum beside minimum/maximum.
  std::optional<double> Bound(const json& schema, const char* key, const std::string& path) {
    if (!schema.contains(key)) return std::nullopt;
    const json& v = schema[key];
    if (!v.is_number()) {
      Fail(absl::StrCat(path, ".", key), "must be a number");
      return std::nullopt;
    }
    return v.get<double>();
  }

  struct Bounds {
    std::optional<double> min, max;    // Inclusive.
    std::optional<double> xmin, xmax;  // Exclusive.
  };
  std::optional<Bounds> ReadBounds(const json& schema, const std::string& path) {
    Bounds b;
    b.min = Bound(schema, "minimum", path);
    b.max = Bound(schema, "maximum", path);
    for (const char* key : {"exclusiveMinimum", "exclusiveMaximum"}) {
      if (!schema.contains(key)) continue;
      const bool lower = std::string(key) == "exclusiveMinimum";
      const json& v = schema[key];
      std::optional<double>& inclusive = lower ? b.min : b.max;
      std::optional<double>& exclusive = lower ? b.xmin : b.xmax;
      if (v.is_boolean()) {  // Draft 4: makes minimum/maximum exclusive.
        if (v.get<bool>() && inclusive.has_value()) {
          exclusive = inclusive;
          inclusive.reset();
        }
      } else {
        exclusive = Bound(schema, key, path);
      }
    }
    if (!error_.ok()) return std::nullopt;
    return b;
  }

  std::optional<std::string> Integer(const json& schema, const std::string& path) {
    std::optional<Bounds> b = ReadBounds(schema, path);
    if (!b.has_value()) return std::nullopt;
    // json-integer's 16 digits bound every integer generated.
    constexpr int64_t kMax = 9'999'999'999'999'999;
    constexpr double kLimit = 1e15;
    for (const std::optional<double>* v : {&b->min, &b->max, &b->xmin, &b->xmax}) {
      if (v->has_value() && std::fabs(**v) > kLimit) {
        return Fail(path, "integer bounds beyond 10^15 in magnitude are not supported");
      }
    }
    int64_t lo = -kMax, hi = kMax;
    if (b->min) lo = std::max(lo, static_cast<int64_t>(std::ceil(*b->min)));
    if (b->xmin) lo = std::max(lo, static_cast<int64_t>(std::floor(*b->xmin)) + 1);
    if (b->max) hi = std::min(hi, static_cast<int64_t>(std::floor(*b->max)));
    if (b->xmax) hi = std::min(hi, static_cast<int64_t>(std::ceil(*b->xmax)) - 1);
    if (lo == -kMax && hi == kMax) return std::string("json-integer");
    if (lo > hi) return Fail(path, "no integer is within the bounds");
    std::vector<std::string> alts;
    if (hi >= 0) alts.push_back(Unsigned(std::max<int64_t>(lo, 0), hi));
    if (lo < 0) alts.push_back(absl::StrCat("\"-\" ", Unsigned(std::max<int64_t>(-hi, 1), -lo)));
    return Define(absl::StrJoin(alts, " | "), path);
  }

  // A group of the decimal numerals (no leading zeros) of [lo, hi], 0 <= lo <= hi.
  static std::string Unsigned(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    int64_t first = 0;  // The smallest numeral of the current length.
    for (int length = 1; length <= 16; ++length) {
      const int64_t last = first == 0 ? 9 : first * 10 - 1;
      const int64_t a = std::max(lo, first), z = std::min(hi, last);
      if (a <= z) alts.push_back(SameLength(std::to_string(a), std::to_string(z)));
      first = first == 0 ? 10 : first * 10;
      if (first > hi) break;
    }
    return absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
  }

  // The numerals from `a` to `z`, of one length: the classic digit-range construction
  // (depth at most 16).
  static std::string SameLength(const std::string& a, const std::string& z) {
    auto digits = [](char lo, char hi) {
      return lo == hi ? absl::StrCat("\"", std::string(1, lo), "\"")
                      : absl::StrCat("[", std::string(1, lo), "-", std::string(1, hi), "]");
    };
    const size_t n = a.size();
    if (n == 1) return digits(a[0], z[0]);
    const std::string a_rest = a.substr(1), z_rest = z.substr(1);
    if (a[0] == z[0]) return absl::StrCat(digits(a[0], a[0]), " ", SameLength(a_rest, z_rest));
    const bool a_zeros = a_rest == std::string(n - 1, '0');
    const bool z_nines = z_rest == std::string(n - 1, '9');
    const std::string any_rest = absl::StrCat("[0-9]{", n - 1, "}");
    std::vector<std::string> alts;
    char from = a[0], to = z[0];
    if (!a_zeros) {
      alts.push_back(absl::StrCat(digits(a[0], a[0]), " ( ",
                                  SameLength(a_rest, std::string(n - 1, '9')), " )"));
      ++from;
    }
    std::string high;
    if (!z_nines) {
      high = absl::StrCat(digits(z[0], z[0]), " ( ", SameLength(std::string(n - 1, '0'), z_rest),
                          " )");
      --to;
    }
    if (from <= to) alts.push_back(absl::StrCat(digits(from, to), " ", any_rest));
    if (!high.empty()) alts.push_back(high);
    return absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
  }

  // Numbers: only a sign can be required (bounds at 0).
  std::optional<std::string> Number(const json& schema, const std::string& path) {
    std::optional<Bounds> b = ReadBounds(schema, path);
    if (!b.has_value()) return std::nullopt;
    for (const std::optional<double>* v : {&b->min, &b->max, &b->xmin, &b->xmax}) {
      if (v->has_value() && **v != 0) {
        return Fail(path,
                    "bounds on a `number` are supported at 0 only (a sign); for other ranges "
                    "use `integer`");
      }
    }
    const bool lower = b->min.has_value(), above = b->xmin.has_value();
    const bool upper = b->max.has_value(), below = b->xmax.has_value();
    if (!lower && !above && !upper && !below) return std::string("json-number");
    if ((above && (upper || below)) || (lower && below)) {
      return Fail(path, "no number is within the bounds");
    }
    std::string body;
    if ((lower || above) && upper) {
      body = "num-zero";  // 0 <= x <= 0
    } else if (above) {
      body = "num-positive";
    } else if (lower) {
      body = "num-unsigned";
    } else if (below) {
      body = "\"-\" num-positive";
    } else {
      body = "\"-\" num-unsigned | num-zero";
    }
    for (const char* f : {"num-unsigned", "num-positive", "num-zero"}) {
      if (body.find(f) != std::string::npos) UseFragment(f);
    }
    return Define(body, path);
  }

  // Both schemas at once, where no keyword needs more: true is the identity, false absorbs.
  static json Both(const json& a, const json& b) {
    if (a.is_boolean() && a.get<bool>()) return b;
    if (b.is_boolean() && b.get<bool>()) return a;
    if ((a.is_boolean() && !a.get<bool>()) || (b.is_boolean() && !b.get<bool>())) return false;
    if (a == b) return a;
    return json{{"allOf", json::array({a, b})}};
  }

  // The definition `ref` names, or nullptr (error set).
  const json* Resolve(const json& ref, const std::string& path) {
    const std::string target = ref.is_string() ? ref.get<std::string>() : "";
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (target.rfind(p, 0) != 0) continue;
      const std::string section = p.substr(2, p.size() - 3), name = target.substr(p.size());
      if (root_.contains(section) && root_[section].contains(name)) return &root_[section][name];
    }
    Fail(path, absl::StrCat("`", ref.dump(), "` names no definition"));
    return nullptr;
  }

  // allOf: the schema without it and each branch, merged keyword by keyword into one schema
  // whose language is the intersection; what cannot be merged so is INVALID_ARGUMENT.
  std::optional<json> MergeAllOf(const json& schema, const std::string& path, int depth) {
    const json& branches = schema["allOf"];
    if (!branches.is_array() || branches.empty()) {
      return Fail(path + ".allOf", "must be a non-empty array");
    }
    json base = schema;
    base.erase("allOf");
    json acc = json::object();
    bool nullable = true;
    if (!MergeInto(&acc, base, path, depth, &nullable)) return std::nullopt;
    for (size_t i = 0; i < branches.size(); ++i) {
      if (!MergeInto(&acc, branches[i], absl::StrCat(path, ".allOf[", i, "]"), depth + 1,
                     &nullable)) {
        return std::nullopt;
      }
    }
    if (nullable) acc["nullable"] = true;
    if (acc.contains("const") && acc.contains("enum")) {
      const json& e = acc["enum"];
      if (std::find(e.begin(), e.end(), acc["const"]) == e.end()) {
        return Fail(path, "allOf: `const` is not among the `enum` values");
      }
      acc.erase("enum");
    }
    return acc;
  }

  bool MergeInto(json* acc, const json& branch, const std::string& path, int depth,
                 bool* nullable) {
    if (depth > limits_.max_depth) {
      Fail(path, absl::StrCat("schemas nest deeper than ", limits_.max_depth));
      return false;
    }
    if (branch.is_boolean()) {
      if (branch.get<bool>()) return true;
      Fail(path, "the schema `false` accepts no value");
      return false;
    }
    if (!branch.is_object()) {
      Fail(path, "a schema must be an object or a boolean");
      return false;
    }
    for (const auto& [key, value] : branch.items()) {
      if (!Supported().contains(key) && !Annotations().contains(key)) {
        Fail(path, absl::StrCat("the keyword `", key, "` is not supported"));
        return false;
      }
    }
    if (!branch.value("nullable", false)) *nullable = false;
    if (branch.contains("$ref")) {
      const json* target = Resolve(branch["$ref"], path + ".$ref");
      if (target == nullptr) return false;
      bool target_nullable = true;
      if (!MergeInto(acc, *target, path + ".$ref", depth + 1, &target_nullable)) return false;
      if (!target_nullable) *nullable = false;
    }
    if (branch.contains("allOf")) {
      const json& inner = branch["allOf"];
      if (!inner.is_array()) {
        Fail(path + ".allOf", "must be an array");
        return false;
      }
      for (size_t i = 0; i < inner.size(); ++i) {
        bool inner_nullable = true;
        if (!MergeInto(acc, inner[i], absl::StrCat(path, ".allOf[", i, "]"), depth + 1,
                       &inner_nullable)) {
          return false;
        }
        if (!inner_nullable) *nullable = false;
      }
    }
    json& a = *acc;
    if (branch.contains("properties") || branch.contains("additionalProperties") ||
        a.contains("properties") || a.contains("additionalProperties")) {
      if (!MergeObject(&a, branch, path)) return false;
    }
    if (branch.contains("items") || branch.contains("prefixItems")) MergeArray(&a, branch);
    for (const auto& [key, v] : branch.items()) {
      if (Annotations().contains(key) || key == "$ref" || key == "allOf" || key == "nullable" ||
          key == "properties" || key == "additionalProperties" || key == "items" ||
          key == "prefixItems") {
        continue;
      }
      if (!a.contains(key)) {
        a[key] = v;
        continue;
      }
      json& mine = a[key];
      if (key == "required") {
        for (const json& r : v) {
          if (std::find(mine.begin(), mine.end(), r) == mine.end()) mine.push_back(r);
        }
      } else if (key == "type") {
        json types = json::array();
        const json ta = mine.is_array() ? mine : json::array({mine});
        const json tb = v.is_array() ? v : json::array({v});
        for (const json& x : ta) {
          for (const json& y : tb) {
            json t = x == y                              ? x
                     : (x == "integer" && y == "number") ? json("integer")
                     : (x == "number" && y == "integer") ? json("integer")
                                                         : json();
            if (!t.is_null() && std::find(types.begin(), types.end(), t) == types.end()) {
              types.push_back(t);
            }
          }
        }
        if (types.empty()) {
          Fail(path, "allOf: the branches' types have nothing in common");
          return false;
        }
        mine = types.size() == 1 ? types[0] : types;
      } else if (key == "minItems" || key == "minLength" || key == "minimum" ||
                 key == "exclusiveMinimum") {
        if (v.is_number() && mine.is_number() && v.get<double>() > mine.get<double>()) mine = v;
      } else if (key == "maxItems" || key == "maxLength" || key == "maximum" ||
                 key == "exclusiveMaximum") {
        if (v.is_number() && mine.is_number() && v.get<double>() < mine.get<double>()) mine = v;
      } else if (key == "enum") {
        json both = json::array();
        for (const json& x : mine) {
          if (std::find(v.begin(), v.end(), x) != v.end()) both.push_back(x);
        }
        if (both.empty()) {
          Fail(path, "allOf: the branches' `enum`s have no value in common");
          return false;
        }
        mine = both;
      } else if (key == "anyOf" || key == "oneOf") {
        if (!v.is_array() || !mine.is_array() || mine.size() * v.size() > 64) {
          Fail(path, absl::StrCat("allOf: two `", key, "` lists too long to combine"));
          return false;
        }
        json product = json::array();
        for (const json& x : mine) {
          for (const json& y : v) product.push_back(Both(x, y));
        }
        mine = product;
      } else if (mine != v) {
        // const, pattern, format: only the same value twice is the intersection we can write.
        Fail(path, absl::StrCat("allOf: two different `", key, "` values cannot be combined"));
        return false;
      }
    }
    // Sibling keywords apply to each anyOf option (compiling an anyOf reads nothing else).
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!a.contains(key) || !a[key].is_array()) continue;
      json rest = a;
      rest.erase("anyOf");
      rest.erase("oneOf");
      if (rest.empty()) continue;
      json options = json::array();
      for (const json& o : a[key]) options.push_back(Both(o, rest));
      json only = json::object();
      only["anyOf"] = options;
      a = only;
      break;
    }
    return true;
  }

  // Properties of both: a name only one lists is checked by the other's
  // additionalProperties; additionalProperties of both.
  bool MergeObject(json* acc, const json& b, const std::string& path) {
    json& a = *acc;
    const json empty = json::object();
    const json& pa = a.contains("properties") ? a["properties"] : empty;
    const json& pb = b.contains("properties") ? b["properties"] : empty;
    const json xa = a.contains("additionalProperties") ? a["additionalProperties"] : json(true);
    const json xb = b.contains("additionalProperties") ? b["additionalProperties"] : json(true);
    if (!pa.is_object() || !pb.is_object()) {
      Fail(path + ".properties", "must be an object");
      return false;
    }
    json props = json::object();
    for (const json* side : {&pa, &pb}) {
      for (const auto& [key, unused] : side->items()) {
        if (props.contains(key)) continue;
        json merged = Both(pa.contains(key) ? pa[key] : xa, pb.contains(key) ? pb[key] : xb);
        if (merged.is_boolean() && !merged.get<bool>()) continue;  // Forbidden: left out.
        props[key] = merged;
      }
    }
    const json extra = Both(xa, xb);
    // A name left out is allowed again if additionalProperties allows names.
    for (const json* side : {&pa, &pb}) {
      for (const auto& [key, unused] : side->items()) {
        if (!props.contains(key) && !(extra.is_boolean() && !extra.get<bool>())) {
          Fail(path, absl::StrCat("allOf: the property `", key,
                                  "` is forbidden by one branch; that cannot be written"));
          return false;
        }
      }
    }
    a["properties"] = props;
    if (extra.is_boolean() && extra.get<bool>()) {
      a.erase("additionalProperties");
    } else {
      a["additionalProperties"] = extra;
    }
    return true;
  }

  // prefixItems and items of both, position by position.
  static void MergeArray(json* acc, const json& b) {
    json& a = *acc;
    const json none = json::array();
    const json& pa = a.contains("prefixItems") ? a["prefixItems"] : none;
    const json& pb = b.contains("prefixItems") ? b["prefixItems"] : none;
    const json ia = a.contains("items") ? a["items"] : json(true);
    const json ib = b.contains("items") ? b["items"] : json(true);
    json prefix = json::array();
    for (size_t i = 0; i < std::max(pa.size(), pb.size()); ++i) {
      prefix.push_back(Both(i < pa.size() ? pa[i] : ia, i < pb.size() ? pb[i] : ib));
    }
    if (!prefix.empty()) a["prefixItems"] = prefix;
    const json items = Both(ia, ib);
    if (items.is_boolean() && items.get<bool>()) {
      a.erase("items");
    } else {
      a["items"] = items;
    }
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
    // Required names the properties leave out take additionalProperties' schema.
    for (const std::string& key : required) {
      if (seen.contains(key)) continue;
      if (!extra.has_value()) {
        return Fail(path, absl::StrCat("the required property `", key,
                                       "` is not allowed by additionalProperties: false"));
      }
      members.push_back({key, *extra, true});
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
  std::set<std::string> fragments_;  // Of Fragments(), in use.
  std::string extra_text_;           // Rules of patterns.
  int extra_rules_ = 0;              // Their number.
  absl::Status error_;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGrammar(const json& schema, const SchemaLimits& limits) {
  return Compiler(schema, limits).Run();
}

std::string AnyJsonObjectGrammar() { return absl::StrCat("root ::= json-object\n", kJsonRules); }

}  // namespace conveyor::grammar
