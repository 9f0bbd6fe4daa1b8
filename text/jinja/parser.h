// Builds the syntax tree (ast.h) of a chat template from its tokens (lexer.h), following
// jinja2's grammar and operator precedence (including its quirks: filters bind tighter
// than unary minus, `**` is left-associative, `a < b < c` chains).
//
// Everything that can be checked without data is checked here, so a template this
// interpreter cannot run is rejected at load: unknown or unsupported tags, unknown
// filters and tests, unbalanced blocks, `break` outside a loop, malformed expressions.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "text/jinja/ast.h"

namespace conveyor::jinja {

// Parses `source`; errors are InvalidArgument "chat template line N: ...".
absl::StatusOr<std::unique_ptr<Program>> ParseTemplate(std::string_view source);

}  // namespace conveyor::jinja
