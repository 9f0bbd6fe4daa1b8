// Reading and writing the JSON of the HTTP APIs' bodies: typed fields whose errors name
// the field (INVALID_ARGUMENT with the param payload, openai_protocol.h's WithParam), and
// a dump that cannot throw. Shared by openai_protocol.cc and responses_api.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace conveyor::scheduler::openai {

using Json = nlohmann::ordered_json;

// Every dump replaces ill-formed UTF-8 instead of throwing (the engine's text is already
// well formed; this is the guarantee that no exception can escape).
std::string Dump(const Json& value);

// INVALID_ARGUMENT naming `param`.
absl::Status Invalid(absl::string_view param, absl::string_view message);
// "`param` must be `expected`".
absl::Status WrongType(absl::string_view param, absl::string_view expected);
// A value this server does not serve (code "unsupported_value").
absl::Status Unsupported(absl::string_view param, absl::string_view message);

// The member `key` of `object`, or nullptr when it is absent or null (OpenAI's clients
// send null for "not given").
const Json* Field(const Json& object, absl::string_view key);
absl::StatusOr<std::optional<bool>> GetBool(const Json& object, absl::string_view key);
absl::StatusOr<std::optional<double>> GetNumber(const Json& object, absl::string_view key);
// An integer in [lo, hi].
absl::StatusOr<std::optional<int64_t>> GetInteger(const Json& object, absl::string_view key,
                                                  int64_t lo, int64_t hi);
absl::StatusOr<std::optional<std::string>> GetString(const Json& object, absl::string_view key);

}  // namespace conveyor::scheduler::openai
