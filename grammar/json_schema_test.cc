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
  std::ofstream(script) << R"(import json, sys
import jsonschema

def openapi_nullable(s):
    if isinstance(s, dict):
        s = {k: openapi_nullable(v) for k, v in s.items()}
        if s.pop("nullable", False):
            return {"anyOf": [s, {"type": "null"}]}
    elif isinstance(s, list):
        s = [openapi_nullable(v) for v in s]
    return s

bad = 0
for line in open(sys.argv[1]):
    case = json.loads(line)
    schema = openapi_nullable(case["schema"])
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(case["instance"]))
    if errors:
        bad += 1
        if bad <= 10:
            print("invalid:", case["text"], "--", errors[0].message)
print("checked", sum(1 for _ in open(sys.argv[1])), "bad", bad)
sys.exit(1 if bad else 0)
)";
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
      {R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^a"}}})",
       "at $.properties.code: the keyword `pattern` is not supported"},
      {R"({"allOf": [{"type": "string"}]})", "at $: the keyword `allOf` is not supported"},
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
