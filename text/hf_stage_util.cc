#include "text/hf_stage_util.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "text/hf_tokenizer_components.h"

namespace conveyor::hf {

const json* Field(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(const std::string& where, std::string_view key, std::string_view type) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".", AsAbsl(key), " must be ", AsAbsl(type)));
}

absl::Status ReadString(const json& object, std::string_view key, const std::string& where,
                        std::string* out) {
  const json* value = Field(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) return WrongType(where, key, "a string");
  *out = value->get_ref<const std::string&>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& object, std::string_view key, const std::string& where,
                      bool* out) {
  const json* value = Field(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) return WrongType(where, key, "true or false");
  *out = value->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadInt(const json& object, std::string_view key, const std::string& where,
                     int64_t* out) {
  const json* value = Field(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number_integer()) return WrongType(where, key, "an integer");
  *out = value->get<int64_t>();
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadType(const json& object, const std::string& where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
  }
  std::string type;
  if (absl::Status s = ReadString(object, "type", where, &type); !s.ok()) return s;
  if (type.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no \"type\""));
  return type;
}

absl::Status Unknown(std::string_view kind, std::string_view type, const std::string& where) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": unknown or unsupported ", AsAbsl(kind),
                                                 " type \"", AsAbsl(type), "\""));
}

// A field holding exactly one character (e.g. Metaspace's replacement), as its UTF-8.
absl::Status ReadChar(const json& object, std::string_view key, const std::string& where,
                      std::string* out) {
  std::string value = *out;
  RETURN_IF_ERROR(ReadString(object, key, where, &value));
  if (value.empty() || FindInvalidUtf8(value) != std::string_view::npos ||
      CharSize(static_cast<unsigned char>(value[0])) != value.size()) {
    return WrongType(where, key, "one character");
  }
  *out = std::move(value);
  return absl::OkStatus();
}

// A Split or Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
absl::StatusOr<std::shared_ptr<const Regex>> ReadPattern(const json& object,
                                                         const std::string& where) {
  const json* pattern = Field(object, "pattern");
  if (pattern == nullptr || !pattern->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".pattern must be an object"));
  }
  std::string text;
  const std::string pattern_where = absl::StrCat(where, ".pattern");
  if (const json* s = Field(*pattern, "String"); s != nullptr) {
    RETURN_IF_ERROR(ReadString(*pattern, "String", pattern_where, &text));
    return Regex::Literal(text);
  }
  if (Field(*pattern, "Regex") != nullptr) {
    RETURN_IF_ERROR(ReadString(*pattern, "Regex", pattern_where, &text));
    absl::StatusOr<std::shared_ptr<const Regex>> regex = Regex::Compile(text);
    if (!regex.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", regex.status().message()));
    }
    return regex;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".pattern must hold \"String\" or \"Regex\""));
}

// The sub-objects of a Sequence (`key` names the array).
absl::StatusOr<const json*> ReadArray(const json& object, std::string_view key,
                                      const std::string& where) {
  const json* array = Field(object, key);
  if (array == nullptr || !array->is_array()) return WrongType(where, key, "an array");
  return array;
}

ByteAlphabet::ByteAlphabet() {
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t c = printable ? b : next++;
    AppendUtf8(c, &chars[b]);
    byte_of[c] = static_cast<int16_t>(b);
  }
}

absl::Status ReplaceNormalizer::Normalize(std::string* text) const {
  thread_local std::vector<Match> matches;
  RETURN_IF_ERROR(pattern_->FindAll(*text, &matches));
  if (matches.empty()) return absl::OkStatus();
  std::string out;
  out.reserve(text->size() + matches.size() * content_.size());
  size_t previous = 0;
  for (const Match& m : matches) {
    out.append(*text, previous, m.first - previous);
    out.append(content_);
    previous = m.second;
  }
  out.append(*text, previous);
  *text = std::move(out);
  return absl::OkStatus();
}

const ByteAlphabet& Bytes() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

void AppendByteChars(std::string_view text, std::string* out) {
  const ByteAlphabet& bytes = Bytes();
  for (const char c : text) out->append(bytes.chars[static_cast<unsigned char>(c)]);
}

absl::StatusOr<MetaspaceConfig> ReadMetaspace(const json& object, const std::string& where) {
  MetaspaceConfig config;
  RETURN_IF_ERROR(ReadChar(object, "replacement", where, &config.replacement));
  RETURN_IF_ERROR(ReadBool(object, "split", where, &config.split));
  std::string scheme;
  RETURN_IF_ERROR(ReadString(object, "prepend_scheme", where, &scheme));
  if (scheme == "always" || scheme.empty()) {
    config.scheme = PrependScheme::kAlways;
  } else if (scheme == "first") {
    config.scheme = PrependScheme::kFirst;
  } else if (scheme == "never") {
    config.scheme = PrependScheme::kNever;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown prepend_scheme \"", scheme, "\""));
  }
  // Files from before prepend_scheme say add_prefix_space; false means "never".
  bool add_prefix_space = true;
  RETURN_IF_ERROR(ReadBool(object, "add_prefix_space", where, &add_prefix_space));
  if (!add_prefix_space) {
    if (!scheme.empty() && config.scheme != PrependScheme::kNever) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": add_prefix_space does not match prepend_scheme"));
    }
    config.scheme = PrependScheme::kNever;
  }
  return config;
}

}  // namespace conveyor::hf
