// JSON from clients, parsed within bounds that are checked before any tree is built: how
// deep arrays and objects nest and how many values a document holds. Everything that walks
// client JSON afterwards (the OpenAI request mapping, the chat template's context, error
// messages that quote a value) may then recurse: its depth is at most `max_depth`.
//
// The check is one linear pass without recursion over the text (strings skipped, escapes
// honoured); only a document within both bounds goes on to nlohmann's parser, whose own
// parsing and destruction are iterative. A value that nests 100 000 levels deep is refused
// after reading it once, with a message that names the limit and the byte where it was
// crossed, never echoing the input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace conveyor {

struct JsonLimits {
  // Arrays and objects inside one another; `[[1]]` nests 2 deep. 64 is far beyond any
  // request shape (OpenAI tool schemas are ~10 deep) and keeps recursion over the tree
  // to a few kilobytes of stack.
  int max_depth = 64;
  // Values of every kind (scalars, arrays, objects, and members' keys), counted as an
  // upper bound: one per array element or object member plus one per container. Bounds
  // the tree's memory (about 100 bytes per value at worst, measured in
  // bench/http_body_memory_bench.py); 1 Mi allows a prompt of a million token ids.
  size_t max_values = size_t{1} << 20;
};

// OK if `text` nests no deeper and holds no more values than `limits` allow; else
// INVALID_ARGUMENT naming the bound and the byte offset where it was crossed. `what`
// names the document in the message ("the request body"). Does not check that `text` is
// valid JSON, but for a NUL byte (never valid; nlohmann's parser would stop there and
// accept what came before); for valid JSON (and for the prefix of invalid JSON a parser
// reads before failing) its depth is exact.
absl::Status CheckJsonBounds(std::string_view text, const JsonLimits& limits,
                             absl::string_view what);

// CheckJsonBounds, then parses: INVALID_ARGUMENT "… is not valid JSON (…at byte N)" for a
// syntax error. Never throws.
absl::StatusOr<nlohmann::ordered_json> ParseBoundedJson(std::string_view text,
                                                        const JsonLimits& limits,
                                                        absl::string_view what);

// `value` as compact JSON for an error message: at most `max_bytes` bytes, cut with "…"
// (the whole of a large value is never echoed back to its sender).
std::string JsonExcerpt(const nlohmann::ordered_json& value, size_t max_bytes = 80);
// `text` itself, the same way: at most `max_bytes` bytes, then "… (N bytes in all)".
std::string TextExcerpt(std::string_view text, size_t max_bytes = 80);

}  // namespace conveyor
