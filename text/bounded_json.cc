#include "text/bounded_json.h"

#include "absl/strings/str_cat.h"

namespace conveyor {

absl::Status CheckJsonBounds(std::string_view text, const JsonLimits& limits,
                             absl::string_view what) {
  int depth = 0;
  // One value to start with, one more per ',' (the next element or member) and per
  // container opened (its first element; "[]" counts one too many, which is harmless).
  size_t values = 1;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\0') {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " is not valid JSON (a NUL byte at byte ", i, ")"));
      }
      if (c == '\\') {
        ++i;  // Whatever is escaped cannot end the string.
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, " nests arrays and objects more than ", limits.max_depth,
                           " levels deep (at byte ", i, "); flatten it"));
        }
        [[fallthrough]];
      case ',':
        if (++values > limits.max_values) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, " holds more than ", limits.max_values, " JSON values (at byte ",
                           i, "); send less in one request"));
        }
        break;
      case ']':
      case '}':
        --depth;  // Unbalanced input goes negative; the parser refuses it.
        break;
      case '\0':
        // Never valid JSON (inside a string too, unescaped); nlohmann's parser would take
        // it for the end of the input and accept whatever came before.
        return absl::InvalidArgumentError(
            absl::StrCat(what, " is not valid JSON (a NUL byte at byte ", i, ")"));
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::ordered_json> ParseBoundedJson(std::string_view text,
                                                        const JsonLimits& limits,
                                                        absl::string_view what) {
  if (absl::Status bounded = CheckJsonBounds(text, limits, what); !bounded.ok()) return bounded;
  // A SAX pass first finds where a syntax error is, without building anything; the tree is
  // built only for a document that parses.
  struct SyntaxError : nlohmann::json_sax<nlohmann::ordered_json> {
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t position, const std::string&,
                     const nlohmann::detail::exception&) override {
      byte = position;
      return false;
    }
    size_t byte = 0;
  };
  nlohmann::ordered_json value =
      nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    SyntaxError error;
    nlohmann::ordered_json::sax_parse(text.begin(), text.end(), &error,
                                      nlohmann::detail::input_format_t::json,
                                      /*strict=*/true);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON (a syntax error at byte ", error.byte, ")"));
  }
  return value;
}

std::string JsonExcerpt(const nlohmann::ordered_json& value, size_t max_bytes) {
  return TextExcerpt(value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
                     max_bytes);
}

std::string TextExcerpt(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  // Cut on a UTF-8 character boundary.
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(absl::string_view(text.data(), cut), "… (", text.size(), " bytes in all)");
}

}  // namespace conveyor
