#include "text/jinja/builtins.h"

#include <sys/time.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "text/jinja/json_dumps.h"
#include "text/jinja/methods.h"
#include "text/jinja/operators.h"
#include "text/jinja/text.h"

namespace conveyor::jinja {
namespace {

// jinja2's sandbox refuses ranges longer than this (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

// ---- helpers shared by filters ----

// jinja2's ignore_case: lower-cases strings, leaves other values alone.
Value IgnoreCase(const Value& v) {
  return v.is_string() ? Value::String(text::Lower(v.as_string())) : v;
}

// jinja2's make_attrgetter: `attribute` is "a.b.0" (dots walk items; all-digit parts are
// indices) or an integer, looked up with the sandbox's getitem.
absl::StatusOr<Value> GetAttributePath(Value item, const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& part : text::Split(attribute.as_string(), std::string("."), -1)) {
      int64_t index = 0;
      const auto result = std::from_chars(part.data(), part.data() + part.size(), index);
      const bool digits =
          !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      parts.push_back(digits && result.ec == std::errc() ? Value::Int(index) : Value::String(part));
    }
  } else if (!attribute.is_none() && !attribute.is_undefined()) {
    parts.push_back(attribute);
  }
  for (const Value& part : parts) {
    ASSIGN_OR_RETURN(item, GetItem(item, part));
  }
  return item;
}

// Iterates `value` as a filter does, where jinja2's generator filters yield nothing for
// a falsy value (`if value:`).
absl::StatusOr<std::vector<Value>> IterateIfTruthy(const Value& value) {
  if (!Truthy(value)) return std::vector<Value>();
  return Iterate(value);
}

absl::StatusOr<Value> StringFilter(const Value& operand, const CallArgs& args,
                                   std::string (*fn)(std::string_view)) {
  RETURN_IF_ERROR(BindArgs("filter", args, {}).status());
  return Value::String(fn(Str(operand)));
}

// ---- filters ----

absl::StatusOr<Value> FilterAbs(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("abs", args, {}).status());
  if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
  if (v.is_integral()) return UnaryArithmetic(v, v.as_int() < 0);
  if (v.is_undefined()) return UndefinedError(v);
  return RenderError(absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

absl::StatusOr<Value> FilterAttr(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("attr", args, {"name"}, 1));
  if (v.is_undefined()) return UndefinedError(v);
  const std::string name = Str(*bound[0]);
  if (std::optional<Value> method = LookupMethod(v, name)) return *std::move(method);
  if (v.is_object()) {
    if (std::optional<Value> attr = v.object().GetAttr(name)) return *std::move(attr);
  }
  return Value::Undefined(absl::StrCat("'", TypeRepr(v), "' has no attribute '", name, "'"));
}

absl::StatusOr<Value> FilterBatch(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("batch", args, {"linecount", "fill_with"}, 1));
  if (!bound[0]->is_integral() || bound[0]->as_int() <= 0) {
    return RenderError("batch() needs a positive line count");
  }
  const size_t size = static_cast<size_t>(bound[0]->as_int());
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> batches;
  for (size_t i = 0; i < items.size(); i += size) {
    std::vector<Value> batch(items.begin() + i, items.begin() + std::min(items.size(), i + size));
    if (batch.size() < size && bound[1].has_value() && !bound[1]->is_none()) {
      batch.resize(size, *bound[1]);
    }
    batches.push_back(Value::MakeList(std::move(batch)));
  }
  return Value::MakeList(std::move(batches));
}

absl::StatusOr<Value> FilterCapitalize(const Value& v, const CallArgs& args) {
  return StringFilter(v, args, text::Capitalize);
}

absl::StatusOr<Value> FilterCenter(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("center", args, {"width"}));
  int64_t width = 80;
  if (bound[0].has_value()) {
    if (!bound[0]->is_integral()) return RenderError("center() width must be an integer");
    width = std::min<int64_t>(bound[0]->as_int(), 1 << 20);
  }
  const std::string s = Str(v);
  const int64_t length = text::CodePointCount(s);
  if (width <= length) return Value::String(s);
  // Python's str.center puts the odd space on the left when the width is odd too.
  const int64_t margin = width - length;
  const int64_t left = margin / 2 + (margin & width & 1);
  return Value::String(std::string(left, ' ') + s + std::string(margin - left, ' '));
}

absl::StatusOr<Value> FilterDefault(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("default", args, {"default_value", "boolean"}));
  const bool boolean = bound[1].has_value() && Truthy(*bound[1]);
  if (v.is_undefined() || (boolean && !Truthy(v))) {
    return bound[0].value_or(Value::String(""));
  }
  return v;
}

absl::StatusOr<Value> FilterDictsort(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("dictsort", args, {"case_sensitive", "by", "reverse"}));
  const bool case_sensitive = bound[0].has_value() && Truthy(*bound[0]);
  const bool reverse = bound[2].has_value() && Truthy(*bound[2]);
  int position = 0;
  if (bound[1].has_value()) {
    const std::string by = Str(*bound[1]);
    if (by == "value") {
      position = 1;
    } else if (by != "key") {
      return RenderError("You can only sort by either \"key\" or \"value\"");
    }
  }
  if (!v.is_dict()) {
    if (v.is_undefined()) return UndefinedError(v);
    return RenderError(absl::StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  }
  std::vector<Value> items;
  for (const auto& [key, value] : v.dict().items()) {
    items.push_back(Value::MakeList({key, value}, List::Kind::kTuple));
  }
  auto sort_key = [&](const Value& item) {
    const Value& k = item.items()[position];
    return case_sensitive ? k : IgnoreCase(k);
  };
  RETURN_IF_ERROR(StableSort(&items, [&](const Value& a, const Value& b) {
    return reverse ? Less(sort_key(b), sort_key(a)) : Less(sort_key(a), sort_key(b));
  }));
  return Value::MakeList(std::move(items));
}

// markupsafe.escape: the five HTML-special characters.
absl::StatusOr<Value> FilterEscape(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("escape", args, {}).status());
  std::string out;
  for (char c : Str(v)) {
    switch (c) {
      case '&':
        out.append("&amp;");
        break;
      case '<':
        out.append("&lt;");
        break;
      case '>':
        out.append("&gt;");
        break;
      case '"':
        out.append("&#34;");
        break;
      case '\'':
        out.append("&#39;");
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterFirst(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("first", args, {}).status());
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FilterLast(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("last", args, {}).status());
  if (!v.is_undefined() && !v.is_string() && !v.is_list() && !v.is_dict()) {
    return RenderError(absl::StrCat("'", TypeName(v), "' object is not reversible"));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf and nan.
std::optional<double> ParseFloat(std::string_view s) {
  const std::string trimmed = text::Strip(s, std::nullopt, true, true);
  std::string cleaned;
  for (size_t i = 0; i < trimmed.size(); ++i) {
    const char c = trimmed[i];
    if (c == '_') {
      if (i == 0 || i + 1 == trimmed.size() ||
          !std::isdigit(static_cast<unsigned char>(trimmed[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(trimmed[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    cleaned.push_back(c);
  }
  std::string_view body = cleaned;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  const std::string lower = text::Lower(body);
  if (lower == "inf" || lower == "infinity") return negative ? -INFINITY : INFINITY;
  if (lower == "nan") return NAN;
  if (body.empty() || body[0] == '+' || body[0] == '-') return std::nullopt;
  // The rest must be a decimal literal: digits, an optional fraction and exponent.
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < body.size() && std::isdigit(static_cast<unsigned char>(body[i]))) ++i;
    return i - start;
  };
  size_t mantissa = digits();
  if (i < body.size() && body[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  const double d = text::ParseDecimalDouble(body);
  return negative ? -d : d;
}

// Python's int(str) in base 10.
std::optional<int64_t> ParseInt(std::string_view s) {
  const std::string trimmed = text::Strip(s, std::nullopt, true, true);
  std::string_view body = trimmed;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body.empty() || body.front() == '_' || body.back() == '_') return std::nullopt;
  std::string digits;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '_' && body[i - 1] != '_') continue;
    if (!std::isdigit(static_cast<unsigned char>(body[i]))) return std::nullopt;
    digits.push_back(body[i]);
  }
  uint64_t magnitude = 0;
  const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
  if (result.ec != std::errc() || magnitude > static_cast<uint64_t>(INT64_MAX) + negative) {
    return std::nullopt;
  }
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

absl::StatusOr<Value> FilterFloat(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("float", args, {"default"}));
  const Value fallback = bound[0].value_or(Value::Float(0.0));
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    if (std::optional<double> d = ParseFloat(v.as_string())) return Value::Float(*d);
  }
  return fallback;
}

absl::StatusOr<Value> FilterInt(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("int", args, {"default", "base"}));
  const Value fallback = bound[0].value_or(Value::Int(0));
  if (bound[1].has_value() && !(bound[1]->is_integral() && bound[1]->as_int() == 10)) {
    return RenderError("int(): only base 10 is supported");
  }
  if (v.is_integral()) return Value::Int(v.as_int());
  double d;
  if (v.is_float()) {
    d = v.as_float();
  } else if (v.is_string()) {
    if (std::optional<int64_t> i = ParseInt(v.as_string())) return Value::Int(*i);
    // "42.23"|int is 42: jinja2 retries through float().
    std::optional<double> parsed = ParseFloat(v.as_string());
    if (!parsed.has_value() || std::isnan(*parsed)) return fallback;
    d = *parsed;
  } else {
    return fallback;
  }
  if (std::isnan(d)) return RenderError("cannot convert float NaN to integer");
  if (std::isinf(d)) return RenderError("cannot convert float infinity to integer");
  if (std::fabs(d) >= 9.2e18) return RenderError("integer overflow (integers are 64-bit here)");
  return Value::Int(static_cast<int64_t>(std::trunc(d)));
}

absl::StatusOr<Value> FilterFormat(const Value& v, const CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return RenderError("can't handle positional and keyword arguments at the same time");
  }
  Value format_args;
  if (!args.keyword.empty()) {
    Dict kwargs;
    for (const auto& [name, value] : args.keyword) kwargs.Set(Value::String(name), value);
    format_args = Value::MakeDict(std::move(kwargs));
  } else {
    format_args = Value::MakeList(args.positional, List::Kind::kTuple);
  }
  ASSIGN_OR_RETURN(std::string out, PercentFormat(Str(v), format_args));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterIndent(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("indent", args, {"width", "first", "blank"}));
  std::string indention(4, ' ');
  if (bound[0].has_value()) {
    if (bound[0]->is_string()) {
      indention = bound[0]->as_string();
    } else if (bound[0]->is_integral()) {
      indention =
          std::string(std::max<int64_t>(0, std::min<int64_t>(bound[0]->as_int(), 4096)), ' ');
    } else {
      return RenderError("indent() width must be an int or a str");
    }
  }
  const bool first = bound[1].has_value() && Truthy(*bound[1]);
  const bool blank = bound[2].has_value() && Truthy(*bound[2]);
  // jinja2 appends a newline first so that splitlines() keeps a trailing empty line.
  const std::vector<std::string> lines = text::SplitLines(Str(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out.push_back('\n');
      if (blank || !lines[i].empty()) out.append(indention);
    }
    out.append(lines[i]);
  }
  if (first) out = indention + out;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterItems(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("items", args, {}).status());
  if (v.is_undefined()) return Value::MakeList({});
  if (!v.is_dict()) return RenderError("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [key, value] : v.dict().items()) {
    items.push_back(Value::MakeList({key, value}, List::Kind::kTuple));
  }
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> FilterJoin(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("join", args, {"d", "attribute"}));
  const std::string separator = bound[0].has_value() ? Str(*bound[0]) : "";
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (bound[1].has_value() && !bound[1]->is_none()) {
      ASSIGN_OR_RETURN(item, GetAttributePath(item, *bound[1]));
    }
    if (i > 0) out.append(separator);
    out.append(Str(item));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterLength(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("length", args, {}).status());
  ASSIGN_OR_RETURN(int64_t n, Length(v));
  return Value::Int(n);
}

absl::StatusOr<Value> FilterList(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("list", args, {}).status());
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> FilterLower(const Value& v, const CallArgs& args) {
  return StringFilter(v, args, text::Lower);
}
absl::StatusOr<Value> FilterUpper(const Value& v, const CallArgs& args) {
  return StringFilter(v, args, text::Upper);
}

// jinja2's title filter: capitalises after whitespace, '-', '(', '{', '[' and '<'
// (unlike str.title, which also splits at apostrophes).
absl::StatusOr<Value> FilterTitle(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("title", args, {}).status());
  const std::u32string in = text::Decode(Str(v));
  auto is_boundary = [](char32_t c) {
    return text::IsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < in.size()) {
    const bool boundary = is_boundary(in[i]);
    size_t j = i;
    while (j < in.size() && is_boundary(in[j]) == boundary) ++j;
    const std::string word = text::EncodeRange(in, i, j - i);
    if (boundary) {
      out.append(word);
    } else {
      const std::string head = text::EncodeRange(in, i, 1);
      out.append(text::Upper(head));
      out.append(text::Lower(text::EncodeRange(in, i + 1, j - i - 1)));
    }
    i = j;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterMap(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<Value> items, IterateIfTruthy(v));
  std::vector<Value> out;
  if (args.positional.empty()) {
    std::optional<Value> attribute, fallback;
    for (const auto& [name, value] : args.keyword) {
      if (name == "attribute") {
        attribute = value;
      } else if (name == "default") {
        fallback = value;
      } else {
        return RenderError(absl::StrCat("Unexpected keyword argument '", name, "'"));
      }
    }
    if (!attribute.has_value()) return RenderError("map requires a filter argument");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value mapped, GetAttributePath(item, *attribute));
      if (mapped.is_undefined() && fallback.has_value() && !fallback->is_none()) mapped = *fallback;
      out.push_back(std::move(mapped));
    }
    return Value::MakeList(std::move(out));
  }
  const std::string name = Str(args.positional[0]);
  const FilterFn filter = FindFilter(name);
  if (filter == nullptr) return RenderError(absl::StrCat("No filter named '", name, "'."));
  CallArgs rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()),
                args.keyword};
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value mapped, filter(item, rest));
    out.push_back(std::move(mapped));
  }
  return Value::MakeList(std::move(out));
}

// min (kMax false) and max: the first extreme item.
template <bool kMax>
absl::StatusOr<Value> FilterExtreme(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound,
                   BindArgs(kMax ? "max" : "min", args, {"case_sensitive", "attribute"}));
  const bool case_sensitive = bound[0].has_value() && Truthy(*bound[0]);
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) -> absl::StatusOr<Value> {
    Value k = item;
    if (bound[1].has_value()) {
      ASSIGN_OR_RETURN(k, GetAttributePath(item, *bound[1]));
    }
    return case_sensitive ? k : IgnoreCase(k);
  };
  size_t best = 0;
  ASSIGN_OR_RETURN(Value best_key, key(items[0]));
  for (size_t i = 1; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value k, key(items[i]));
    ASSIGN_OR_RETURN(bool better, kMax ? Less(best_key, k) : Less(k, best_key));
    if (better) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

// select / reject / selectattr / rejectattr.
template <bool kSelect, bool kAttribute>
absl::StatusOr<Value> FilterSelect(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<Value> items, IterateIfTruthy(v));
  size_t next = 0;
  std::optional<Value> attribute;
  if (kAttribute) {
    if (args.positional.empty()) return RenderError("Missing parameter for attribute name");
    attribute = args.positional[next++];
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (next < args.positional.size()) {
    const std::string name = Str(args.positional[next++]);
    test = FindTest(name);
    if (test == nullptr) return RenderError(absl::StrCat("No test named '", name, "'."));
    test_args.positional.assign(args.positional.begin() + next, args.positional.end());
    test_args.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (attribute.has_value()) {
      ASSIGN_OR_RETURN(subject, GetAttributePath(item, *attribute));
    }
    bool passed;
    if (test != nullptr) {
      ASSIGN_OR_RETURN(passed, test(subject, test_args));
    } else {
      passed = Truthy(subject);
    }
    if (passed == kSelect) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterReplace(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("replace", args, {"old", "new", "count"}, 2));
  int64_t count = -1;
  if (bound[2].has_value() && !bound[2]->is_none()) {
    if (!bound[2]->is_integral()) return RenderError("replace() count must be an integer");
    count = bound[2]->as_int();
  }
  return Value::String(text::Replace(Str(v), Str(*bound[0]), Str(*bound[1]), count));
}

absl::StatusOr<Value> FilterReverse(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("reverse", args, {}).status());
  if (v.is_string()) {
    std::u32string cps = text::Decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::String(text::Encode(cps));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> FilterRound(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("round", args, {"precision", "method"}));
  int64_t precision = 0;
  if (bound[0].has_value()) {
    if (!bound[0]->is_integral()) return RenderError("round() precision must be an integer");
    precision = bound[0]->as_int();
  }
  const std::string method = bound[1].has_value() ? Str(*bound[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return RenderError("method must be common, ceil or floor");
  }
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number()) {
    return RenderError(absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method != "common") {
    const double x = v.as_float() * scale;
    return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (v.is_integral()) {
    if (precision >= 0) return Value::Int(v.as_int());
    const double rounded = std::nearbyint(static_cast<double>(v.as_int()) / (1.0 / scale));
    return Value::Int(static_cast<int64_t>(rounded / scale));
  }
  const double x = v.as_float();
  if (!std::isfinite(x)) return Value::Float(x);
  if (precision == 0) return Value::Float(std::nearbyint(x));  // Half to even.
  if (precision > 0 && precision < 300) {
    // Python rounds the exact binary value correctly; so does printf.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
    double d = 0;
    std::from_chars(buf, buf + std::char_traits<char>::length(buf), d);
    return Value::Float(d);
  }
  return Value::Float(std::nearbyint(x * scale) / scale);
}

absl::StatusOr<Value> FilterSafe(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("safe", args, {}).status());
  return Value::String(Str(v));
}

absl::StatusOr<Value> FilterSort(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("sort", args, {"reverse", "case_sensitive", "attribute"}));
  const bool reverse = bound[0].has_value() && Truthy(*bound[0]);
  const bool case_sensitive = bound[1].has_value() && Truthy(*bound[1]);
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  // jinja2 sorts by a list of keys: one per comma-separated attribute.
  std::vector<Value> attributes;
  if (bound[2].has_value() && !bound[2]->is_none()) {
    if (bound[2]->is_string()) {
      for (const std::string& part : text::Split(bound[2]->as_string(), std::string(","), -1)) {
        attributes.push_back(Value::String(part));
      }
    } else {
      attributes.push_back(*bound[2]);
    }
  }
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (const Value& item : items) {
    std::vector<Value> key;
    if (attributes.empty()) key.push_back(case_sensitive ? item : IgnoreCase(item));
    for (const Value& attribute : attributes) {
      ASSIGN_OR_RETURN(Value k, GetAttributePath(item, attribute));
      key.push_back(case_sensitive ? k : IgnoreCase(k));
    }
    keyed.emplace_back(Value::MakeList(std::move(key)), item);
  }
  RETURN_IF_ERROR(StableSort(&keyed, [&](const auto& a, const auto& b) {
    return reverse ? Less(b.first, a.first) : Less(a.first, b.first);
  }));
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterString(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("string", args, {}).status());
  return Value::String(Str(v));
}

absl::StatusOr<Value> FilterSum(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("sum", args, {"attribute", "start"}));
  Value total = bound[1].value_or(Value::Int(0));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  for (const Value& item : items) {
    Value term = item;
    if (bound[0].has_value() && !bound[0]->is_none()) {
      ASSIGN_OR_RETURN(term, GetAttributePath(item, *bound[0]));
    }
    ASSIGN_OR_RETURN(total, Arithmetic(ArithmeticOp::kAdd, total, term));
  }
  return total;
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys).
absl::StatusOr<Value> FilterToJson(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound,
                   BindArgs("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpsOptions options;
  options.ensure_ascii = bound[0].has_value() && Truthy(*bound[0]);
  options.sort_keys = bound[3].has_value() && Truthy(*bound[3]);
  if (bound[1].has_value() && !bound[1]->is_none()) {
    if (bound[1]->is_string()) {
      options.indent = bound[1]->as_string();
    } else if (bound[1]->is_integral()) {
      options.indent =
          std::string(std::max<int64_t>(0, std::min<int64_t>(bound[1]->as_int(), 4096)), ' ');
    } else {
      return RenderError("tojson() indent must be an int or a str");
    }
    options.item_separator = ",";
  }
  if (bound[2].has_value() && !bound[2]->is_none()) {
    const Value& separators = *bound[2];
    if (!separators.is_list() || separators.items().size() != 2 ||
        !separators.items()[0].is_string() || !separators.items()[1].is_string()) {
      return RenderError("tojson() separators must be a pair of strings");
    }
    options.item_separator = separators.items()[0].as_string();
    options.key_separator = separators.items()[1].as_string();
  }
  ASSIGN_OR_RETURN(std::string json, JsonDumps(v, options));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> FilterTrim(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("trim", args, {"chars"}));
  std::optional<std::string> chars;
  if (bound[0].has_value() && !bound[0]->is_none()) chars = Str(*bound[0]);
  return Value::String(text::Strip(Str(v), chars, true, true));
}

absl::StatusOr<Value> FilterUnique(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("unique", args, {"case_sensitive", "attribute"}));
  const bool case_sensitive = bound[0].has_value() && Truthy(*bound[0]);
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> seen, out;
  for (const Value& item : items) {
    Value key = item;
    if (bound[1].has_value() && !bound[1]->is_none()) {
      ASSIGN_OR_RETURN(key, GetAttributePath(item, *bound[1]));
    }
    if (!case_sensitive) key = IgnoreCase(key);
    if (!IsHashable(key))
      return RenderError(absl::StrCat("unhashable type: '", TypeName(key), "'"));
    bool duplicate = false;
    for (const Value& s : seen) {
      if (Equals(s, key)) {
        duplicate = true;
        break;
      }
    }
    if (!duplicate) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterWordcount(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("wordcount", args, {}).status());
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : text::Decode(Str(v))) {
    const bool word_char = text::IsWordChar(c);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::Int(words);
}

struct NamedFilter {
  std::string_view name;
  FilterFn fn;
};

constexpr NamedFilter kFilters[] = {
    {"abs", FilterAbs},
    {"attr", FilterAttr},
    {"batch", FilterBatch},
    {"capitalize", FilterCapitalize},
    {"center", FilterCenter},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"dictsort", FilterDictsort},
    {"e", FilterEscape},
    {"escape", FilterEscape},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"forceescape", FilterEscape},
    {"format", FilterFormat},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", FilterLower},
    {"map", FilterMap},
    {"max", FilterExtreme<true>},
    {"min", FilterExtreme<false>},
    {"reject", FilterSelect<false, false>},
    {"rejectattr", FilterSelect<false, true>},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"round", FilterRound},
    {"safe", FilterSafe},
    {"select", FilterSelect<true, false>},
    {"selectattr", FilterSelect<true, true>},
    {"sort", FilterSort},
    {"string", FilterString},
    {"sum", FilterSum},
    {"title", FilterTitle},
    {"tojson", FilterToJson},
    {"trim", FilterTrim},
    {"unique", FilterUnique},
    {"upper", FilterUpper},
    {"wordcount", FilterWordcount},
};

// ---- tests ----

absl::StatusOr<std::optional<Value>> OneArg(std::string_view test, const CallArgs& args,
                                            bool required) {
  ASSIGN_OR_RETURN(auto bound, BindArgs(test, args, {"other"}, required ? 1 : 0));
  return bound[0];
}

absl::StatusOr<bool> NoArgs(std::string_view test, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs(test, args, {}).status());
  return true;
}

absl::StatusOr<bool> RemainderIs(const Value& v, const Value& divisor, int64_t remainder) {
  ASSIGN_OR_RETURN(Value r, Arithmetic(ArithmeticOp::kMod, v, divisor));
  return Equals(r, Value::Int(remainder));
}

absl::StatusOr<bool> TestOdd(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("odd", args).status());
  return RemainderIs(v, Value::Int(2), 1);
}
absl::StatusOr<bool> TestEven(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("even", args).status());
  return RemainderIs(v, Value::Int(2), 0);
}
absl::StatusOr<bool> TestDivisibleBy(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::optional<Value> num, OneArg("divisibleby", args, true));
  return RemainderIs(v, *num, 0);
}

// Tests that only look at the operand's type or value.
template <bool (*kPredicate)(const Value&)>
absl::StatusOr<bool> TestKind(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("test", args).status());
  return kPredicate(v);
}

bool IsDefined(const Value& v) { return !v.is_undefined(); }
bool IsUndefined(const Value& v) { return v.is_undefined(); }
bool IsNone(const Value& v) { return v.is_none(); }
bool IsBoolean(const Value& v) { return v.is_bool(); }
bool IsTrue(const Value& v) { return v.is_bool() && v.as_bool(); }
bool IsFalse(const Value& v) { return v.is_bool() && !v.as_bool(); }
bool IsInteger(const Value& v) { return v.is_int(); }
bool IsFloat(const Value& v) { return v.is_float(); }
bool IsNumber(const Value& v) { return v.is_number(); }
bool IsString(const Value& v) { return v.is_string(); }
bool IsMapping(const Value& v) { return v.is_dict(); }
// Undefined has __len__, __getitem__ and __iter__ (and __call__), so jinja2 counts it as
// a sequence, iterable and callable.
bool IsSequence(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_dict() ||
         (v.is_list() && (v.list().kind == List::Kind::kList || v.is_tuple()));
}
bool IsIterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool IsCallable(const Value& v) {
  return v.is_undefined() || (v.is_object() && v.object().IsCallable());
}
bool IsEscaped(const Value& v) { return false; }
// str(value).islower() / .isupper(): some cased code point, none of the other case.
template <bool kUpper>
bool IsCaseString(const Value& v) {
  bool cased = false;
  for (char32_t c : text::Decode(Str(v))) {
    if (kUpper ? text::IsLower(c) : text::IsUpper(c)) return false;
    if (kUpper ? text::IsUpper(c) : text::IsLower(c)) cased = true;
  }
  return cased;
}

template <CompareOp kOp>
absl::StatusOr<bool> TestCompare(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::optional<Value> other, OneArg("compare", args, true));
  return Compare(kOp, v, *other);
}

absl::StatusOr<bool> TestSameAs(const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::optional<Value> other, OneArg("sameas", args, true));
  return v.SameAs(*other);
}

absl::StatusOr<bool> TestIsFilter(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("filter", args).status());
  return v.is_string() && FindFilter(v.as_string()) != nullptr;
}

absl::StatusOr<bool> TestIsTest(const Value& v, const CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("test", args).status());
  return v.is_string() && FindTest(v.as_string()) != nullptr;
}

struct NamedTest {
  std::string_view name;
  TestFn fn;
};

constexpr NamedTest kTests[] = {
    {"!=", TestCompare<CompareOp::kNe>},
    {"<", TestCompare<CompareOp::kLt>},
    {"<=", TestCompare<CompareOp::kLe>},
    {"==", TestCompare<CompareOp::kEq>},
    {">", TestCompare<CompareOp::kGt>},
    {">=", TestCompare<CompareOp::kGe>},
    {"boolean", TestKind<IsBoolean>},
    {"callable", TestKind<IsCallable>},
    {"defined", TestKind<IsDefined>},
    {"divisibleby", TestDivisibleBy},
    {"eq", TestCompare<CompareOp::kEq>},
    {"equalto", TestCompare<CompareOp::kEq>},
    {"escaped", TestKind<IsEscaped>},
    {"even", TestEven},
    {"false", TestKind<IsFalse>},
    {"filter", TestIsFilter},
    {"float", TestKind<IsFloat>},
    {"ge", TestCompare<CompareOp::kGe>},
    {"greaterthan", TestCompare<CompareOp::kGt>},
    {"gt", TestCompare<CompareOp::kGt>},
    {"in", TestCompare<CompareOp::kIn>},
    {"integer", TestKind<IsInteger>},
    {"iterable", TestKind<IsIterable>},
    {"le", TestCompare<CompareOp::kLe>},
    {"lessthan", TestCompare<CompareOp::kLt>},
    {"lower", TestKind<IsCaseString<false>>},
    {"lt", TestCompare<CompareOp::kLt>},
    {"mapping", TestKind<IsMapping>},
    {"ne", TestCompare<CompareOp::kNe>},
    {"none", TestKind<IsNone>},
    {"number", TestKind<IsNumber>},
    {"odd", TestOdd},
    {"sameas", TestSameAs},
    {"sequence", TestKind<IsSequence>},
    {"string", TestKind<IsString>},
    {"test", TestIsTest},
    {"true", TestKind<IsTrue>},
    {"undefined", TestKind<IsUndefined>},
    {"upper", TestKind<IsCaseString<true>>},
};

// ---- globals ----

class BuiltinFunction : public Object {
 public:
  using Fn = absl::StatusOr<Value> (*)(const CallArgs& args);
  BuiltinFunction(std::string_view name, Fn fn) : name_(name), fn_(fn) {}
  std::string TypeName() const override { return "function"; }
  std::string Repr() const override { return absl::StrCat("<function ", std::string(name_), ">"); }
  bool IsCallable() const override { return true; }
  absl::StatusOr<Value> Call(Renderer& renderer, const CallArgs& args) const override {
    return fn_(args);
  }

 private:
  std::string_view name_;
  Fn fn_;
};

absl::StatusOr<Value> GlobalRange(const CallArgs& args) {
  if (!args.keyword.empty()) return RenderError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) {
    return RenderError(absl::StrCat("range expected at most 3 arguments, got ", p.size()));
  }
  for (const Value& v : p) {
    if (!v.is_integral()) {
      return RenderError(
          absl::StrCat("'", TypeName(v), "' object cannot be interpreted as an integer"));
    }
  }
  const int64_t start = p.size() == 1 ? 0 : p[0].as_int();
  const int64_t stop = p.size() == 1 ? p[0].as_int() : p[1].as_int();
  const int64_t step = p.size() == 3 ? p[2].as_int() : 1;
  if (step == 0) return RenderError("range() arg 3 must not be zero");
  // Count in floating point first: a huge range must be refused, not overflow.
  const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                 static_cast<double>(step));
  if (count > kMaxRange) {
    return RenderError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::Int(i));
  return Value::MakeList(std::move(items));
}

// dict(mapping_or_pairs, **kwargs) and the attributes of namespace(...).
absl::StatusOr<Dict> DictFromArgs(std::string_view function, const CallArgs& args) {
  Dict dict;
  if (args.positional.size() > 1) {
    return RenderError(absl::StrCat(std::string(function), " expected at most 1 argument, got ",
                                    args.positional.size()));
  }
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      dict = source.dict();
    } else {
      ASSIGN_OR_RETURN(std::vector<Value> pairs, Iterate(source));
      for (const Value& pair : pairs) {
        ASSIGN_OR_RETURN(std::vector<Value> kv, Iterate(pair));
        if (kv.size() != 2) {
          return RenderError(absl::StrCat("dictionary update sequence element has length ",
                                          kv.size(), "; 2 is required"));
        }
        dict.Set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [name, value] : args.keyword) dict.Set(Value::String(name), value);
  return dict;
}

absl::StatusOr<Value> GlobalDict(const CallArgs& args) {
  ASSIGN_OR_RETURN(Dict dict, DictFromArgs("dict", args));
  return Value::MakeDict(std::move(dict));
}

absl::StatusOr<Value> GlobalNamespace(const CallArgs& args) {
  ASSIGN_OR_RETURN(Dict dict, DictFromArgs("namespace", args));
  auto ns = std::make_shared<Namespace>();
  for (const auto& [key, value] : dict.items()) {
    if (!key.is_string()) return RenderError("namespace() attribute names must be strings");
    ns->SetAttr(key.as_string(), value);
  }
  return Value::MakeObject(std::move(ns));
}

absl::StatusOr<Value> GlobalRaiseException(const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("raise_exception", args, {"message"}, 1));
  return TemplateRaised(Str(*bound[0]));
}

// datetime.now().strftime(format): local time; %f (microseconds) is Python's own.
absl::StatusOr<Value> GlobalStrftimeNow(const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("strftime_now", args, {"format"}, 1));
  if (!bound[0]->is_string()) {
    return RenderError(
        absl::StrCat("strftime() argument 1 must be str, not ", TypeName(*bound[0])));
  }
  timeval now;
  gettimeofday(&now, nullptr);
  std::tm local;
  localtime_r(&now.tv_sec, &local);
  char micros[8];
  std::snprintf(micros, sizeof(micros), "%06ld", static_cast<long>(now.tv_usec));
  const std::string format = text::Replace(bound[0]->as_string(), "%f", micros, -1);
  if (format.empty()) return Value::String("");
  std::string out(format.size() * 4 + 64, '\0');
  while (true) {
    const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
    if (n > 0) {
      out.resize(n);
      return Value::String(std::move(out));
    }
    if (out.size() > 65536) return Value::String("");  // The result is empty.
    out.resize(out.size() * 4);
  }
}

// joiner(sep): returns "" on its first call and `sep` on every later one.
class Joiner : public Object {
 public:
  explicit Joiner(std::string separator) : separator_(std::move(separator)) {}
  std::string TypeName() const override { return "Joiner"; }
  std::string TypeRepr() const override { return "jinja2.utils.Joiner object"; }
  std::string Repr() const override { return "<jinja2.utils.Joiner object>"; }
  bool IsCallable() const override { return true; }
  absl::StatusOr<Value> Call(Renderer& renderer, const CallArgs& args) const override {
    RETURN_IF_ERROR(BindArgs("joiner", args, {}).status());
    if (!used_) {
      used_ = true;
      return Value::String("");
    }
    return Value::String(separator_);
  }

 private:
  std::string separator_;
  mutable bool used_ = false;  // Per render: the joiner object lives in one render.
};

absl::StatusOr<Value> GlobalJoiner(const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("joiner", args, {"sep"}));
  return Value::MakeObject(
      std::make_shared<Joiner>(bound[0].has_value() ? Str(*bound[0]) : std::string(", ")));
}

struct NamedGlobal {
  std::string_view name;
  BuiltinFunction::Fn fn;
};

constexpr NamedGlobal kGlobals[] = {
    {"dict", GlobalDict},           {"joiner", GlobalJoiner},
    {"namespace", GlobalNamespace}, {"raise_exception", GlobalRaiseException},
    {"range", GlobalRange},         {"strftime_now", GlobalStrftimeNow},
};

}  // namespace

FilterFn FindFilter(std::string_view name) {
  for (const NamedFilter& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

TestFn FindTest(std::string_view name) {
  for (const NamedTest& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

std::optional<Value> FindGlobal(std::string_view name) {
  for (const NamedGlobal& g : kGlobals) {
    if (g.name == name) return Value::MakeObject(std::make_shared<BuiltinFunction>(g.name, g.fn));
  }
  return std::nullopt;
}

std::string Namespace::Repr() const {
  return absl::StrCat("<Namespace ", jinja::Repr(Value::MakeDict(attributes_)), ">");
}

std::optional<Value> Namespace::GetAttr(std::string_view name) const {
  if (const Value* value = attributes_.Find(Value::String(std::string(name)))) return *value;
  return std::nullopt;
}

absl::Status TemplateRaised(std::string_view message) {
  return absl::FailedPreconditionError(std::string(message));
}

bool IsTemplateRaised(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace conveyor::jinja
