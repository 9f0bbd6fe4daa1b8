// Helpers for propagating absl::Status / absl::StatusOr values up to a process boundary.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CONVEYOR_CONCAT_INNER_(a, b) a##b
#define CONVEYOR_CONCAT_(a, b) CONVEYOR_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status _conveyor_status = (expr);            \
    if (!_conveyor_status.ok()) return _conveyor_status; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr())`: moves the value into `lhs`,
// or returns the error from the enclosing function.
// `lhs` is a declaration and `tmp` a name: neither can be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(CONVEYOR_CONCAT_(_conveyor_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
