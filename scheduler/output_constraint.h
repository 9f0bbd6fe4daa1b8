// Structured output, the scheduler's half (docs/structured-output.md): a request's
// OutputConstraint (a JSON Schema, any JSON object, a regex or a grammar) compiled into
// the grammar text its workers match tokens against (NewSequence.grammar).
//
// Everything here runs on client input before the request is admitted, so each step is
// bounded (the schema's JSON depth and size, the compiler's rule count, the grammar's
// size) and every refusal is INVALID_ARGUMENT saying what to change. The grammar is
// parsed here too, so a request the workers would refuse never reaches them.
//
// Compiled grammars are cached by constraint (agents send the same schema with every
// call): thread-safe, bounded.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "conveyor.pb.h"

namespace conveyor::scheduler {

// The grammar text of `constraint` (which must have a kind set).
absl::StatusOr<std::shared_ptr<const std::string>> CompileConstraint(
    const v1::OutputConstraint& constraint);

}  // namespace conveyor::scheduler
