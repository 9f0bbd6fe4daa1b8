#include "scheduler/output_constraint.h"

#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "text/bounded_json.h"

namespace conveyor::scheduler {
namespace {

// A schema is a small document: far below the request body's own bounds.
constexpr JsonLimits kSchemaJsonLimits{.max_depth = 64, .max_values = 1 << 16};
// What the workers would take on: the grammar is text in every NewSequence.
constexpr size_t kMaxGrammarBytes = 1 << 20;
constexpr size_t kMaxCachedConstraints = 512;

absl::StatusOr<std::string> GrammarText(const v1::OutputConstraint& c) {
  switch (c.kind_case()) {
    case v1::OutputConstraint::kJsonSchema: {
      ASSIGN_OR_RETURN(const nlohmann::ordered_json schema,
                       ParseBoundedJson(c.json_schema(), kSchemaJsonLimits, "json_schema"));
      return grammar::JsonSchemaToGrammar(schema);
    }
    case v1::OutputConstraint::kJsonObject:
      if (!c.json_object()) {
        return absl::InvalidArgumentError("json_object is false; leave the constraint unset");
      }
      return grammar::AnyJsonObjectGrammar();
    case v1::OutputConstraint::kRegex:
      return grammar::RegexToGrammar(c.regex());
    case v1::OutputConstraint::kGrammar:
      return c.grammar();
    case v1::OutputConstraint::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "constraint has no kind; set json_schema, json_object, regex or grammar");
}

absl::StatusOr<std::shared_ptr<const std::string>> Compile(const v1::OutputConstraint& c) {
  ASSIGN_OR_RETURN(std::string text, GrammarText(c));
  if (text.size() > kMaxGrammarBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the constraint compiles to a grammar of ", text.size(), " bytes, above the limit of ",
        kMaxGrammarBytes, "; simplify the schema (fewer properties, smaller bounds)"));
  }
  if (absl::StatusOr<grammar::Grammar> parsed = grammar::Grammar::Parse(text); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("grammar: ", parsed.status().message()));
  }
  return std::make_shared<const std::string>(std::move(text));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const std::string>> CompileConstraint(
    const v1::OutputConstraint& constraint) {
  static std::mutex mutex;
  static auto* cache = new absl::flat_hash_map<std::string, std::shared_ptr<const std::string>>();
  const std::string key = constraint.SerializeAsString();
  {
    std::lock_guard lock(mutex);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const std::string> grammar, Compile(constraint));
  std::lock_guard lock(mutex);
  if (cache->size() >= kMaxCachedConstraints) cache->clear();
  cache->emplace(key, grammar);
  return grammar;
}

}  // namespace conveyor::scheduler
