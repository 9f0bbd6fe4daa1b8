#include "text/jinja/json_dumps.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "text/jinja/operators.h"
#include "text/jinja/text.h"

namespace conveyor::jinja {
namespace {

void AppendHex4(uint32_t u, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\u");
  for (int k = 3; k >= 0; --k) out->push_back(kHex[(u >> (4 * k)) & 0xF]);
}

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t c : text::Decode(s)) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            AppendHex4(0xD800 | (v >> 10), out);
            AppendHex4(0xDC00 | (v & 0x3FF), out);
          } else {
            AppendHex4(c, out);
          }
        } else {
          text::AppendUtf8(c, out);
        }
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return FormatFloat(d);
}

class Encoder {
 public:
  explicit Encoder(const JsonDumpsOptions& options) : options_(options) {}

  absl::Status Encode(const Value& v, int level, std::string* out) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out->append("null");
        return absl::OkStatus();
      case Value::Kind::kBool:
        out->append(v.as_bool() ? "true" : "false");
        return absl::OkStatus();
      case Value::Kind::kInt:
        out->append(std::to_string(v.as_int()));
        return absl::OkStatus();
      case Value::Kind::kFloat:
        out->append(JsonFloat(v.as_float()));
        return absl::OkStatus();
      case Value::Kind::kString:
        AppendJsonString(v.as_string(), options_.ensure_ascii, out);
        return absl::OkStatus();
      case Value::Kind::kList:
        if (v.list().kind == List::Kind::kList || v.is_tuple()) return EncodeList(v, level, out);
        break;
      case Value::Kind::kDict:
        return EncodeDict(v, level, out);
      default:
        break;
    }
    return RenderError(absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }

 private:
  // The separator between items, and the text that opens and closes a container's
  // contents, at nesting `level` (json.dumps's _iterencode_list / _iterencode_dict).
  std::string Newline(int level) const {
    std::string s = "\n";
    for (int i = 0; i < level; ++i) s.append(*options_.indent);
    return s;
  }

  absl::Status EncodeList(const Value& v, int level, std::string* out) {
    if (v.items().empty()) {
      out->append("[]");
      return absl::OkStatus();
    }
    out->push_back('[');
    std::string separator = options_.item_separator;
    if (options_.indent.has_value()) {
      separator += Newline(level + 1);
      out->append(Newline(level + 1));
    }
    bool first = true;
    for (const Value& item : v.items()) {
      if (!first) out->append(separator);
      first = false;
      RETURN_IF_ERROR(Encode(item, level + 1, out));
    }
    if (options_.indent.has_value()) out->append(Newline(level));
    out->push_back(']');
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Key(const Value& key) {
    switch (key.kind()) {
      case Value::Kind::kString:
        return key.as_string();
      case Value::Kind::kBool:
        return std::string(key.as_bool() ? "true" : "false");
      case Value::Kind::kInt:
        return std::to_string(key.as_int());
      case Value::Kind::kFloat:
        return JsonFloat(key.as_float());
      case Value::Kind::kNone:
        return std::string("null");
      default:
        return RenderError(
            absl::StrCat("keys must be str, int, float, bool or None, not ", TypeName(key)));
    }
  }

  absl::Status EncodeDict(const Value& v, int level, std::string* out) {
    if (v.dict().size() == 0) {
      out->append("{}");
      return absl::OkStatus();
    }
    std::vector<std::pair<Value, Value>> items = v.dict().items();
    if (options_.sort_keys) {
      RETURN_IF_ERROR(
          StableSort(&items, [](const auto& a, const auto& b) { return Less(a.first, b.first); }));
    }
    out->push_back('{');
    std::string separator = options_.item_separator;
    if (options_.indent.has_value()) {
      separator += Newline(level + 1);
      out->append(Newline(level + 1));
    }
    bool first = true;
    for (const auto& [key, value] : items) {
      if (!first) out->append(separator);
      first = false;
      ASSIGN_OR_RETURN(std::string key_text, Key(key));
      AppendJsonString(key_text, options_.ensure_ascii, out);
      out->append(options_.key_separator);
      RETURN_IF_ERROR(Encode(value, level + 1, out));
    }
    if (options_.indent.has_value()) out->append(Newline(level));
    out->push_back('}');
    return absl::OkStatus();
  }

  const JsonDumpsOptions& options_;
};

}  // namespace

absl::StatusOr<std::string> JsonDumps(const Value& value, const JsonDumpsOptions& options) {
  std::string out;
  RETURN_IF_ERROR(Encoder(options).Encode(value, 0, &out));
  return out;
}

}  // namespace conveyor::jinja
