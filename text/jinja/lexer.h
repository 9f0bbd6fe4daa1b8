// Splits a chat template into tokens the way jinja2's lexer does under Hugging Face's
// settings (trim_blocks, lstrip_blocks, keep_trailing_newline=False).
//
// Template text comes out as kText tokens with whitespace control already applied:
// `{%-`/`-%}` (and `{{-`, `-}}`, `{#-`, `-#}`) strip whitespace on that side, `{%+`/`+%}`
// keep it, trim_blocks drops the first newline after a block or comment tag, and
// lstrip_blocks drops the spaces and tabs before a block or comment tag that starts a
// line. Comments disappear; `{% raw %}` bodies come out as text. Inside a tag the lexer
// yields names, literals and operators; a `}}` or `%}` inside brackets is two operators,
// as in jinja2. Newlines are normalised to "\n" and one trailing newline is dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::jinja {

enum class TokenKind {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,    // `text` holds the decoded value.
  kInteger,   // `int_value`
  kFloat,     // `float_value`
  kOperator,  // `text` is the operator: "+", "//", "(", "|", ...
  kEnd,
};

struct Token {
  TokenKind kind;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Tokens of `source`, ending with kEnd. Errors are InvalidArgument
// "chat template line N: ...".
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

// "chat template line N: <message>", the form of every parse error.
std::string LineMessage(int line, std::string_view message);

}  // namespace conveyor::jinja
