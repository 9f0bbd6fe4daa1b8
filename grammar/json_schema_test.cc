// JSON Schema to grammar: every sentence drawn from a compiled schema's grammar is JSON
// that Python's `jsonschema` validates against the schema (the independent reference),
// documents that break the schema are refused by the matcher, and unsupported or
// malformed schemas are refused naming the keyword and its path.
#include "grammar/json_schema.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/test_util.h"
#include "gtest/gtest.h"

namespace conveyor::grammar {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"},
        "maxItems": 3}}, "required": ["name"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"kind": {"enum": ["a", "b", 3, null]},
        "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
        "items": false, "minItems": 2}, "note": {"type": ["string", "null"]}},
        "required": ["kind", "point"]})",
    R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"], "additionalProperties": false}}, "$ref": "#/$defs/node"})",
    R"({"anyOf": [{"type": "boolean"}, {"const": {"x": [1, 2]}},
        {"type": "string", "minLength": 2, "maxLength": 4}], "title": "ignored"})",
    R"({"type": "object", "additionalProperties": {"type": "integer"},
        "properties": {"id": {"type": "string"}}, "required": ["id"]})",
    R"({"type": "array", "items": {"type": "object", "properties": {"ok": {"type": "boolean",
        "nullable": true}}, "required": ["ok"], "additionalProperties": false},
        "minItems": 1, "maxItems": 4})",
    R"({"type": "object", "properties": {"code": {"type": "string",
        "pattern": "^[A-Z]{2,3}-\\d{3}$"}, "note": {"type": "string", "pattern": "a[\"\\\\]+b|^x"},
        "day": {"format": "date"}, "at": {"type": "string", "format": "date-time"},
        "t": {"type": "string", "format": "time"}}, "required": ["code", "note", "day", "at", "t"],
        "additionalProperties": false})",
    R"({"type": "array", "prefixItems": [{"format": "email"}, {"format": "uuid"},
        {"format": "ipv4"}, {"format": "ipv6"}, {"format": "hostname"}, {"format": "uri"}],
        "items": false, "minItems": 6})",
    R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": -37,
        "exclusiveMaximum": 1205}, "m": {"type": "integer", "exclusiveMinimum": 99},
        "k": {"type": "integer", "maximum": -3}, "pos": {"type": "number", "exclusiveMinimum": 0},
        "nonneg": {"type": "number", "minimum": 0}, "neg": {"type": "number", "exclusiveMaximum": 0},
        "nonpos": {"maximum": 0}}, "required": ["n", "m", "k", "pos", "nonneg", "neg", "nonpos"],
        "additionalProperties": false})",
    R"({"$defs": {"named": {"type": "object", "properties": {"name": {"type": "string"}},
        "required": ["name"]}}, "allOf": [{"$ref": "#/$defs/named"},
        {"properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}},
         "required": ["age"]}, {"properties": {"name": {"maxLength": 5}, "age": true},
         "additionalProperties": false}, {"anyOf": [{"required": ["name"]},
         {"properties": {"age": {"maximum": 10}}}]}]})",
    R"({"allOf": [{"type": ["integer", "string"]}, {"type": "number", "minimum": 10},
        {"maximum": 20}]})",
};

TEST(JsonSchemaTest, EveryDrawnSentenceValidatesWithPythonJsonschema) {
  TestTempDir dir;
  const std::string lines_path = dir.path() + "/drawn.jsonl";
  std::ofstream lines(lines_path);
  std::mt19937 rng(11);
  int drawn = 0;
  for (size_t k = 0; k < std::size(kSchemas); ++k) {
    const json schema = json::parse(kSchemas[k]);
    absl::StatusOr<std::string> text = JsonSchemaToGrammar(schema);
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<Grammar> grammar = Grammar::Parse(*text);
    ASSERT_TRUE(grammar.ok()) << grammar.status() << "\n" << *text;
    int for_schema = 0;
    for (int i = 0; i < 400 && for_schema < 150; ++i) {
      std::optional<std::u32string> s = Draw(*grammar, rng, 200);
      if (!s.has_value()) continue;
      const std::string doc = Utf8(*s);
      json value = json::parse(doc, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(value.is_discarded()) << "not JSON: " << doc;
      lines << json{{"schema", schema}, {"instance", value}, {"text", doc}}.dump() << "\n";
      ++for_schema;
    }
    EXPECT_GT(for_schema, 50) << kSchemas[k];
    drawn += for_schema;
  }
  lines.close();
  const std::string script = dir.path() + "/validate.py";
  // `nullable` is OpenAPI's, not JSON Schema's: the reference reads it as anyOf with null.
  std::ofstream(script) << R"py(import datetime, json, re, sys, urllib.parse
import jsonschema

def openapi_nullable(s):
    if isinstance(s, dict):
        s = {k: openapi_nullable(v) for k, v in s.items()}
        if s.pop("nullable", False):
            return {"anyOf": [s, {"type": "null"}]}
    elif isinstance(s, list):
        s = [openapi_nullable(v) for v in s]
    return s

# jsonschema checks time, date-time, hostname and uri only with extra packages
# (rfc3339-validator, fqdn, rfc3987); the test venv has none, so these check them here.
formats = jsonschema.FormatChecker()
RFC3339_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
def check(name, test):
    if name not in jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers:
        formats.checks(name, raises=(ValueError,))(test)
check("time", lambda s: bool(re.fullmatch(RFC3339_TIME, s)) and bool(datetime.time.fromisoformat(s.upper().replace("Z", "+00:00"))))
check("date-time", lambda s: bool(re.fullmatch(r"\d{4}-\d\d-\d\d[Tt]" + RFC3339_TIME, s))
      and bool(datetime.datetime.fromisoformat(s)))
check("hostname", lambda s: len(s) <= 253 and all(
    re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", label) for label in s.split(".")))
check("uri", lambda s: bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:([A-Za-z0-9._~!$&'()*+,;=:@/?#\[\]-]|%[0-9A-Fa-f]{2})*", s))
      and bool(urllib.parse.urlsplit(s).scheme))

bad = 0
for line in open(sys.argv[1]):
    case = json.loads(line)
    schema = openapi_nullable(case["schema"])
    errors = list(jsonschema.Draft202012Validator(schema, format_checker=formats)
                  .iter_errors(case["instance"]))
    if errors:
        bad += 1
        if bad <= 10:
            print("invalid:", case["text"], "--", errors[0].message)
print("checked", sum(1 for _ in open(sys.argv[1])), "bad", bad)
sys.exit(1 if bad else 0)
)py";
  const std::string command =
      std::string(CONVEYOR_TEST_VENV "/bin/python ") + script + " " + lines_path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  EXPECT_EQ(pclose(pipe), 0) << command << "\n" << output;
  EXPECT_THAT(output, HasSubstr("bad 0")) << output;
  EXPECT_GT(drawn, 400);
}

bool Accepts(const std::string& schema, const std::string& doc) {
  absl::StatusOr<std::string> text = JsonSchemaToGrammar(json::parse(schema));
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<Grammar> grammar = Grammar::Parse(*text);
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  Matcher m(std::make_shared<const Grammar>(*std::move(grammar)));
  return m.Accept(doc) && m.CanEnd();
}

TEST(JsonSchemaTest, DocumentsThatBreakTheSchemaAreRefused) {
  const std::string person = kSchemas[0];
  EXPECT_TRUE(Accepts(person, R"({"name": "ann", "age": 3})"));
  EXPECT_TRUE(Accepts(person, R"({"name": "ann","tags": ["x"]})"));
  EXPECT_FALSE(Accepts(person, R"({"age": 3})"));                   // name is required
  EXPECT_FALSE(Accepts(person, R"({"name": "ann", "extra": 1})"));  // additionalProperties
  EXPECT_FALSE(Accepts(person, R"({"name": "123456789"})"));        // maxLength 8
  EXPECT_FALSE(Accepts(person, R"({"name": "a", "age": 1.5})"));    // integer
  EXPECT_FALSE(Accepts(person, R"({"name": "a", "tags": ["1","2","3","4"]})"));  // maxItems
  EXPECT_FALSE(Accepts(person, R"({"age": 1, "name": "a"})"));                   // schema order
  const std::string point = kSchemas[1];
  EXPECT_TRUE(Accepts(point, R"({"kind": null, "point": [1, 2.5]})"));
  EXPECT_FALSE(Accepts(point, R"({"kind": "c", "point": [1, 2]})"));   // enum
  EXPECT_FALSE(Accepts(point, R"({"kind": 3, "point": [1]})"));        // minItems 2
  EXPECT_FALSE(Accepts(point, R"({"kind": 3, "point": [1, 2, 3]})"));  // items false
  EXPECT_TRUE(Accepts(kSchemas[2], R"({"value": 1, "children": [{"value": 2, "children": []}]})"));
  EXPECT_FALSE(Accepts(kSchemas[2], R"({"value": 1, "children": [{"children": []}]})"));
  EXPECT_TRUE(Accepts(kSchemas[3], R"({"x":[1,2]})"));
  EXPECT_FALSE(Accepts(kSchemas[3], R"("a")"));  // minLength 2
}

TEST(JsonSchemaTest, RefusalsNameTheKeywordAndThePath) {
  const struct {
    const char* schema;
    const char* message;
  } cases[] = {
      {R"({"type": "object", "properties": {"code": {"type": "string", "uniqueItems": true}}})",
       "at $.properties.code: the keyword `uniqueItems` is not supported"},
      {R"({"type": "object", "minProperties": 1})", "the keyword `minProperties` is not supported"},
      {R"({"properties": {"a": {"pattern": "(a)\\1"}}})",
       "at $.properties.a.pattern: regex at position 3: backreferences (\\1) are not supported"},
      {R"({"pattern": "a", "maxLength": 3})", "`pattern` cannot be combined with `maxLength`"},
      {R"({"items": {"format": "color"}})",
       "at $.items.format: the format `color` is not supported"},
      {R"({"allOf": [{"type": "string"}, {"type": "integer"}]})",
       "allOf: the branches' types have nothing in common"},
      {R"({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})",
       "at $.allOf[1]: allOf: two different `pattern` values cannot be combined"},
      {R"({"allOf": [{"type": "object"}, {"minProperties": 2}]})",
       "at $.allOf[1]: the keyword `minProperties` is not supported"},
      {R"({"allOf": [{"properties": {"a": false}}, {"properties": {"b": {}}}]})",
       "the property `a` is forbidden by one branch"},
      {R"({"allOf": [{"enum": [1, 2]}, {"enum": [3]}]})", "no value in common"},
      {R"({"type": "number", "minimum": 1.5})", "bounds on a `number` are supported at 0 only"},
      {R"({"type": "number", "exclusiveMinimum": 0, "maximum": 0})", "no number is within"},
      {R"({"type": "integer", "minimum": 3, "exclusiveMaximum": 3})", "no integer is within"},
      {R"({"type": "integer", "maximum": 1e300})", "beyond 10^15"},
      {R"({"required": ["a"], "additionalProperties": false})",
       "the required property `a` is not allowed by additionalProperties"},
      {R"({"allOf": [{"required": ["a"]}, {"properties": {"b": {}}, "additionalProperties": false}]})",
       "the required property `a` is not allowed by additionalProperties"},
      {R"({"$ref": "#/$defs/missing"})", "`#/$defs/missing` names no definition"},
      {R"({"$ref": "https://example.com/s.json"})", "only references to #/$defs/NAME"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems is below minItems"},
      {R"({"type": "strin"})", "unknown type `strin`"},
      {R"({"type": "string", "maxLength": 100000})", "above the limit of 1000"},
      {R"({"type": "object", "properties": {"a": false}})", "accepts no value"},
      {R"({"enum": []})", "must be a non-empty array"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::string> text = JsonSchemaToGrammar(json::parse(c.schema));
    ASSERT_FALSE(text.ok()) << c.schema;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(text.status().message()), HasSubstr(c.message)) << c.schema;
  }
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += R"({"type": "array", "items": )";
  deep += "true";
  deep.append(100, '}');
  EXPECT_THAT(std::string(JsonSchemaToGrammar(json::parse(deep)).status().message()),
              HasSubstr("nest deeper than 64"));
}

// Integer bounds against arithmetic: every integer near each bound, drawn ones, and
// spellings JSON allows that the grammar must still refuse or accept (-0, leading zeros).
TEST(JsonSchemaTest, IntegerBoundsAcceptExactlyTheRange) {
  std::mt19937_64 rng(3);
  const int64_t edges[] = {0, 1, 9, 10, 99, 100, 101, 999, 1000, 1234, 99999, 100000, 4567890};
  for (int round = 0; round < 60; ++round) {
    auto draw = [&]() -> int64_t {
      const int64_t e = edges[rng() % std::size(edges)] + static_cast<int64_t>(rng() % 3) - 1;
      return rng() % 2 == 0 ? e : -e;
    };
    int64_t lo = draw(), hi = draw();
    if (lo > hi) std::swap(lo, hi);
    json schema = {{"type", "integer"}};
    const bool exclusive = round % 3 == 0;
    if (round % 5 != 1)
      schema[exclusive ? "exclusiveMinimum" : "minimum"] = exclusive ? lo - 1 : lo;
    if (round % 5 != 2)
      schema[exclusive ? "exclusiveMaximum" : "maximum"] = exclusive ? hi + 1 : hi;
    absl::StatusOr<std::string> text = JsonSchemaToGrammar(schema);
    ASSERT_TRUE(text.ok()) << text.status() << schema.dump();
    absl::StatusOr<Grammar> grammar = Grammar::Parse(*text);
    ASSERT_TRUE(grammar.ok()) << grammar.status() << "\n" << *text;
    auto shared = std::make_shared<const Grammar>(*std::move(grammar));
    auto accepts = [&](const std::string& doc) {
      Matcher m(shared);
      return m.Accept(doc) && m.CanEnd();
    };
    const bool has_lo = schema.contains("minimum") || schema.contains("exclusiveMinimum");
    const bool has_hi = schema.contains("maximum") || schema.contains("exclusiveMaximum");
    std::vector<int64_t> probes;
    for (int64_t d = -12; d <= 12; ++d) probes.insert(probes.end(), {lo + d, hi + d, d});
    for (int k = 0; k < 40; ++k) {
      probes.push_back(static_cast<int64_t>(rng() % 20000000) - 10000000);
    }
    for (int64_t v : probes) {
      const bool want = (!has_lo || v >= lo) && (!has_hi || v <= hi);
      EXPECT_EQ(accepts(std::to_string(v)), want) << v << " " << schema.dump();
    }
    EXPECT_FALSE(accepts("01")) << schema.dump();
    EXPECT_FALSE(accepts("1.0")) << schema.dump();
  }
}

TEST(JsonSchemaTest, GrammarSizeIsBounded) {
  std::string props;
  for (int i = 0; i < 50; ++i) {
    props += absl::StrCat(i == 0 ? "" : ", ", "\"p", i, "\": {\"pattern\": \"[^a]{100}x\"}");
  }
  const json schema = json::parse("{\"properties\": {" + props + "}}");
  ASSERT_TRUE(JsonSchemaToGrammar(schema).ok());
  SchemaLimits small;
  small.max_grammar_bytes = 20000;
  absl::StatusOr<std::string> text = JsonSchemaToGrammar(schema, small);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()),
              HasSubstr("the JSON Schema compiles to too large a grammar"));
}

TEST(JsonSchemaTest, AnyObjectGrammarAcceptsObjectsOnly) {
  absl::StatusOr<Grammar> g = Grammar::Parse(AnyJsonObjectGrammar());
  ASSERT_TRUE(g.ok()) << g.status();
  auto shared = std::make_shared<const Grammar>(*std::move(g));
  for (const char* doc : {R"({})", R"({"a": [1, {"b": null}], "c": "\u00e9"})"}) {
    Matcher m(shared);
    EXPECT_TRUE(m.Accept(doc) && m.CanEnd()) << doc;
  }
  for (const char* doc : {R"([])", R"("x")", R"({"a" 1})"}) {
    Matcher m(shared);
    EXPECT_FALSE(m.Accept(doc) && m.CanEnd()) << doc;
  }
}

}  // namespace
}  // namespace conveyor::grammar
