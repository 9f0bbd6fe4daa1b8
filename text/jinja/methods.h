// The Python methods of str, list, tuple and dict that templates call
// (`content.strip()`, `message.get('x')`, `tools.items()`), as the immutable sandbox
// exposes them.
//
// Methods that would mutate a list or dict (append, pop, update, ...) are what jinja2's
// ImmutableSandboxedEnvironment refuses: looking one up gives an undefined value whose
// use fails with jinja2's SecurityError message. A real Python method this interpreter
// does not implement (str.translate, ...) fails with a clear message when called,
// instead of silently reading a dict key of the same name.
#pragma once

#include <optional>
#include <string_view>

#include "text/jinja/value.h"

namespace conveyor::jinja {

// The attribute `name` of `receiver` if Python's str/list/tuple/dict has one: a bound
// method object, or the unsafe-attribute undefined for mutating methods. nullopt when the
// type has no attribute `name` (the caller then tries the dict key).
std::optional<Value> LookupMethod(const Value& receiver, std::string_view name);

// Python's str.format(*args, **kwargs): {}, {0}, {name}, {x.attr}, {x[key]}, !s and !r,
// and format specs [[fill]align][sign][0][width][,][.precision][type] for s, d, f, e, g, %.
absl::StatusOr<std::string> StrFormat(std::string_view format, const CallArgs& args);

}  // namespace conveyor::jinja
