// Python's json.dumps over template Values: what `tojson` renders in a chat template.
//
// transformers replaces jinja2's tojson filter (which HTML-escapes) with
//   json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//              sort_keys=sort_keys)
// so this reproduces json.dumps byte for byte: ", " and ": " separators by default (","
// once an indent is given), keys in insertion order unless sorted, floats as Python's
// repr (Infinity and NaN for the non-finite ones), non-ASCII characters written as they
// are unless ensure_ascii, and TypeError for values JSON cannot hold (undefined,
// namespaces, macros).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "text/jinja/value.h"

namespace conveyor::jinja {

struct JsonDumpsOptions {
  bool ensure_ascii = false;
  // json.dumps's indent: nullopt for one line, else the string put before each level.
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

absl::StatusOr<std::string> JsonDumps(const Value& value, const JsonDumpsOptions& options);

}  // namespace conveyor::jinja
