// JSON Schema to the grammar form (grammar.h): what `response_format` `json_schema` and
// the tools' parameter schemas are compiled to (docs/structured-output.md).
//
// Covered: `type` (one or a list), `properties`, `required`, `additionalProperties`
// (false, true or a schema; absent means true, as JSON Schema says), `items`,
// `prefixItems`, `minItems`/`maxItems`, `enum`, `const`, `anyOf`, `oneOf` (as anyOf:
// exclusivity cannot be enforced token by token), `$ref` to `#/$defs/…` or
// `#/definitions/…` (recursion allowed), `minLength`/`maxLength`, `nullable`; `pattern`
// (regex.h: a search, as JSON Schema says, over the decoded string; not with length
// bounds or `format`); `format` date, time, date-time, email, hostname, ipv4, ipv6, uri
// (absolute, with an authority), uuid (stricter subsets of the RFCs: seconds up to 59,
// years from 0001, labels of at most 62 characters, `Z` and `T` in upper case);
// `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` for integers (any range within
// 10^15, written digit by digit) and, for numbers, at 0 only (a sign); `allOf`, merged
// keyword by keyword into one schema (properties with each other's additionalProperties,
// items position by position, bounds tightened, enums intersected, sibling keywords pushed
// into anyOf options); two different `pattern`s, `format`s or `const`s, and what else
// cannot be merged so, are INVALID_ARGUMENT with the path. Annotations
// (`title`, `description`, `default`, `examples`, `$schema`, `$id`, `$comment`) are
// ignored. Any other keyword is INVALID_ARGUMENT naming it and its JSON path, never
// silently dropped. Properties come in the schema's order; optional ones may be left out.
// Whitespace: none inside the output but one optional space after ':' and ','. A \u escape
// is a Unicode scalar value or a surrogate pair, never a lone surrogate; numbers keep to 16
// digits before and after the point and two-digit exponents, so every JSON parser reads
// them (none overflows a double or a 64-bit integer). A grammar past
// SchemaLimits::max_grammar_bytes is INVALID_ARGUMENT ("compiles to too large a grammar").
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace conveyor::grammar {

struct SchemaLimits {
  int max_depth = 64;                  // Nested schemas, walked.
  int max_rules = 4096;                // Rules the grammar may get.
  int max_repeat = 1000;               // minItems/maxItems/minLength/maxLength used as bounds.
  size_t max_grammar_bytes = 1 << 20;  // The compiled grammar text (Grammar::Limits too).
};

// The grammar text (rule `root`) of the JSON values `schema` accepts.
// `schema` keeps its keys in document order (ordered_json): properties are generated in
// the order the schema lists them.
absl::StatusOr<std::string> JsonSchemaToGrammar(const nlohmann::ordered_json& schema,
                                                const SchemaLimits& limits = {});

// The grammar of any JSON object (`response_format` `json_object`).
std::string AnyJsonObjectGrammar();

}  // namespace conveyor::grammar
