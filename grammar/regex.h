// Regular expressions to the grammar form (grammar.h): what the API's `regex` response
// option and JSON Schema's `pattern` keyword compile to (docs/structured-output.md).
//
// The syntax is the ECMA-262 subset JSON Schema patterns use: literals; escapes \d \w \s
// \D \W \S, \t \n \r \f \v \0 \cX \xHH \uHHHH (a surrogate pair makes one character) and
// any escaped punctuation; `.` (any character but the line terminators \n \r U+2028
// U+2029, as ECMA-262 says); classes `[...]` with ranges, negation and class escapes
// (\b is backspace there); groups `(...)`, `(?:...)`, `(?<name>...)`; alternation;
// quantifiers ? * + {m} {m,} {m,n}, lazy forms read as greedy (a grammar has no match
// preference, only a language); `{` that starts no quantifier is a literal, as Annex B
// reads it. \d \w \s are ECMA-262's: ASCII digits, ASCII word characters, and
// ECMA-262's whitespace set. Characters are Unicode code points (never surrogates).
//
// Anchors: `^` may open and `$` may close a top-level alternative, nowhere else. Refused
// as INVALID_ARGUMENT naming the construct and its position (in characters from 0):
// backreferences, lookaround, \b \B, anchors elsewhere, Unicode property escapes, unknown
// escapes, and patterns past RegexLimits (bytes, group nesting, repeat counts). The parser
// recurses only as deep as groups nest, and that depth is checked first.
//
// Two ways to match (RegexMatch): the whole text matches the pattern (the `regex` option),
// or, as JSON Schema says of `pattern`, the text contains a match (a search): an
// alternative not opened by `^` may be preceded by any characters, one not closed by `$`
// followed by any. Two encodings (RegexEncoding): the text itself, or the content of a JSON
// string whose decoded value is that text: characters JSON must escape (", \ and controls
// below U+0020) are generated escaped (\" \\ \b \f \n \r \t, else \u00XX in lower-case
// hex), every other character raw. Other spellings of the same value (\/, \u0041) are not
// generated; the grammar constrains the decoded string either way.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace conveyor::grammar {

struct RegexLimits {
  size_t max_pattern_bytes = 4096;
  int max_nesting = 32;   // Groups inside groups.
  int max_repeat = 1000;  // m and n of {m,n}.
};

enum class RegexMatch {
  kWhole,   // The text is one match (anchors change nothing).
  kSearch,  // The text contains a match, unless anchors pin it (JSON Schema `pattern`).
};

enum class RegexEncoding {
  kRaw,                // The text as it is.
  kJsonStringContent,  // Between the quotes of a JSON string.
};

// Grammar text whose `root` derives exactly the texts `pattern` matches as a whole.
absl::StatusOr<std::string> RegexToGrammar(std::string_view pattern,
                                           const RegexLimits& limits = {});

// Rules, one per line, named `name` (the one that matches) and `name_K` for helpers, to be
// appended to a larger grammar. `name` must be a grammar rule name ([A-Za-z0-9_-]+) that
// that no other rule of the larger grammar starts with.
absl::StatusOr<std::string> RegexToRules(std::string_view pattern, std::string_view name,
                                         RegexMatch match, RegexEncoding encoding,
                                         const RegexLimits& limits = {});

}  // namespace conveyor::grammar
