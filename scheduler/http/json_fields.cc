#include "scheduler/http/json_fields.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "scheduler/http/openai_protocol.h"
#include "text/bounded_json.h"

namespace conveyor::scheduler::openai {

std::string Dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::Status Invalid(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(message), param);
}

absl::Status WrongType(absl::string_view param, absl::string_view expected) {
  return Invalid(param, absl::StrCat(param, " must be ", expected));
}

const Json* Field(const Json& object, absl::string_view key) {
  const auto it = object.find(std::string{key});
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<bool>> GetBool(const Json& object, absl::string_view key) {
  const Json* v = Field(object, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, "true or false");
  return v->get<bool>();
}

absl::StatusOr<std::optional<double>> GetNumber(const Json& object, absl::string_view key) {
  const Json* v = Field(object, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return WrongType(key, "a number");
  return v->get<double>();
}

absl::StatusOr<std::optional<int64_t>> GetInteger(const Json& object, absl::string_view key,
                                                  int64_t lo, int64_t hi) {
  const Json* v = Field(object, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) return WrongType(key, "an integer");
  const bool fits =
      !v->is_number_unsigned() ||
      v->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const int64_t value = fits ? v->get<int64_t>() : 0;
  if (!fits || value < lo || value > hi) {
    return Invalid(key,
                   absl::StrCat(key, " must be in [", lo, ", ", hi, "], got ", JsonExcerpt(*v)));
  }
  return value;
}

absl::StatusOr<std::optional<std::string>> GetString(const Json& object, absl::string_view key) {
  const Json* v = Field(object, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return WrongType(key, "a string");
  return v->get<std::string>();
}

absl::Status Unsupported(absl::string_view param, absl::string_view message) {
  return WithCode(Invalid(param, message), "unsupported_value");
}

}  // namespace conveyor::scheduler::openai
