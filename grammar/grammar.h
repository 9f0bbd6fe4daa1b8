// The grammar form structured output compiles to (docs/structured-output.md): a
// context-free grammar over Unicode code points, written in a small EBNF in the style of
// llama.cpp's GBNF:
//
//   root   ::= object
//   object ::= "{" ws ( member ( "," ws member )* )? "}"
//   member ::= string ws ":" ws value      # comments run to the end of the line
//   digit  ::= [0-9]  hex ::= [0-9a-fA-F]  other ::= [^"\\\x00-\x1f]
//
// Alternatives `|`, sequences, groups `( )`, repetition `?` `*` `+` `{m}` `{m,}` `{m,n}`,
// string literals and character classes (ranges, `^` negation) with the escapes \n \r \t
// \\ \" \] \- \xHH \uHHHH \UHHHHHHHH, and references to rules by name (recursion allowed,
// left recursion refused: a matcher that reads left to right could not finish expanding
// it). `root` is where sentences start.
//
// Parse turns the text into rules whose alternatives are sequences of two kinds of element:
// a set of code points, or a rule reference. Groups and repetitions become rules of their
// own, so the matcher knows nothing but those two. Every size is bounded (Limits) before
// anything recursive runs: this is client input, compiled from a request's JSON Schema.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::grammar {

// Inclusive range of code points.
struct CharRange {
  char32_t lo = 0;
  char32_t hi = 0;
};

struct Element {
  enum class Kind { kChars, kRule };
  Kind kind = Kind::kChars;
  // kChars: the code points it matches, sorted, disjoint, not adjacent.
  std::vector<CharRange> chars;
  // kRule: the referenced rule's index.
  int rule = -1;

  bool Matches(char32_t c) const;
  // Whether some code point in [lo, hi] matches (a character whose first bytes only are
  // known).
  bool MatchesAnyOf(char32_t lo, char32_t hi) const;
};

// One alternative: elements in order; empty matches the empty string.
using Sequence = std::vector<Element>;

struct Rule {
  std::string name;  // As written, or "name#k" for the k-th rule made from its groups.
  std::vector<Sequence> alternatives;
};

struct Limits {
  size_t max_text_bytes = 1 << 20;
  size_t max_rules = 1 << 14;
  size_t max_elements = 1 << 18;  // Over every alternative of every rule.
  int max_nesting = 64;           // Groups inside groups.
  int max_repeat = 1000;          // m and n of {m,n}.
};

class Grammar {
 public:
  // Parses `text`; INVALID_ARGUMENT says what is wrong and where (line:column), or which
  // limit the grammar passes.
  static absl::StatusOr<Grammar> Parse(std::string_view text, const Limits& limits = {});

  const std::vector<Rule>& rules() const { return rules_; }
  int root() const { return root_; }
  // Elements over every alternative of every rule (what Limits::max_elements bounds).
  size_t num_elements() const;
  // The rules in the form Parse reads (generated rules included), for logs and tests.
  std::string ToString() const;

 private:
  std::vector<Rule> rules_;
  int root_ = -1;
};

}  // namespace conveyor::grammar
