#include "text/jinja/methods.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "text/jinja/operators.h"
#include "text/jinja/text.h"

namespace conveyor::jinja {
namespace {

using MethodFn = absl::StatusOr<Value> (*)(const Value& self, const CallArgs& args);

// A method bound to its receiver, as `"x".strip` is in Python.
class BoundMethod : public Object {
 public:
  BoundMethod(Value self, std::string_view name, MethodFn fn)
      : self_(std::move(self)), name_(name), fn_(fn) {}
  std::string TypeName() const override { return "builtin_function_or_method"; }
  std::string Repr() const override {
    return absl::StrCat("<built-in method ", name_, " of ", jinja::TypeName(self_), " object>");
  }
  bool IsCallable() const override { return true; }
  absl::StatusOr<Value> Call(Renderer& renderer, const CallArgs& args) const override {
    if (fn_ == nullptr) {
      return RenderError(absl::StrCat(jinja::TypeName(self_), ".", name_,
                                      "() is not supported by this template interpreter"));
    }
    return fn_(self_, args);
  }

 private:
  Value self_;
  std::string name_;
  MethodFn fn_;
};

struct Method {
  std::string_view name;
  MethodFn fn;  // nullptr: a Python method this interpreter does not implement.
};

absl::Status NeedString(std::string_view method, const Value& v) {
  return RenderError(
      absl::StrCat(std::string(method), "() argument must be str, not ", TypeName(v)));
}

// An optional str argument: nullopt for None or absent.
absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view method,
                                                          const std::optional<Value>& v) {
  if (!v.has_value() || v->is_none()) return std::nullopt;
  if (!v->is_string()) return NeedString(method, *v);
  return v->as_string();
}

absl::StatusOr<std::string> RequiredString(std::string_view method, const std::optional<Value>& v) {
  if (!v->is_string()) return NeedString(method, *v);
  return v->as_string();
}

absl::StatusOr<int64_t> OptionalInt(std::string_view method, const std::optional<Value>& v,
                                    int64_t fallback) {
  if (!v.has_value()) return fallback;
  if (!v->is_integral()) {
    return RenderError(
        absl::StrCat(std::string(method), "() expects an integer, not ", TypeName(*v)));
  }
  return v->as_int();
}

Value StringList(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::String(std::move(part)));
  return Value::MakeList(std::move(items));
}

// ---- str ----

template <bool kLeft, bool kRight>
absl::StatusOr<Value> StrStrip(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("strip", args, {"chars"}));
  ASSIGN_OR_RETURN(std::optional<std::string> chars, OptionalString("strip", bound[0]));
  return Value::String(text::Strip(self.as_string(), chars, kLeft, kRight));
}

template <bool kEnd>
absl::StatusOr<Value> StrAffix(const Value& self, const CallArgs& args) {
  const char* name = kEnd ? "endswith" : "startswith";
  ASSIGN_OR_RETURN(auto bound, BindArgs(name, args, {"prefix"}, 1));
  std::vector<Value> candidates;
  if (bound[0]->is_tuple()) {
    candidates = bound[0]->items();
  } else {
    candidates.push_back(*bound[0]);
  }
  const std::string& s = self.as_string();
  for (const Value& c : candidates) {
    if (!c.is_string()) {
      return RenderError(
          absl::StrCat(name, " first arg must be str or a tuple of str, not ", TypeName(c)));
    }
    const std::string& a = c.as_string();
    if (a.size() > s.size()) continue;
    if (kEnd ? s.compare(s.size() - a.size(), a.size(), a) == 0 : s.compare(0, a.size(), a) == 0) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

template <bool kReverse>
absl::StatusOr<Value> StrSplit(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("split", args, {"sep", "maxsplit"}));
  ASSIGN_OR_RETURN(std::optional<std::string> sep, OptionalString("split", bound[0]));
  ASSIGN_OR_RETURN(int64_t maxsplit, OptionalInt("split", bound[1], -1));
  if (sep.has_value() && sep->empty()) return RenderError("empty separator");
  return StringList(kReverse ? text::RSplit(self.as_string(), sep, maxsplit)
                             : text::Split(self.as_string(), sep, maxsplit));
}

absl::StatusOr<Value> StrSplitLines(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("splitlines", args, {"keepends"}));
  if (bound[0].has_value() && Truthy(*bound[0])) {
    return RenderError("str.splitlines(keepends=True) is not supported");
  }
  return StringList(text::SplitLines(self.as_string()));
}

absl::StatusOr<Value> StrReplace(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("replace", args, {"old", "new", "count"}, 2));
  ASSIGN_OR_RETURN(std::string from, RequiredString("replace", bound[0]));
  ASSIGN_OR_RETURN(std::string to, RequiredString("replace", bound[1]));
  ASSIGN_OR_RETURN(int64_t count, OptionalInt("replace", bound[2], -1));
  return Value::String(text::Replace(self.as_string(), from, to, count));
}

template <std::string (*kFn)(std::string_view)>
absl::StatusOr<Value> StrMap(const Value& self, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("str method", args, {}).status());
  return Value::String(kFn(self.as_string()));
}

template <bool kReverse, bool kRaise>
absl::StatusOr<Value> StrFind(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("find", args, {"sub"}, 1));
  ASSIGN_OR_RETURN(std::string sub, RequiredString("find", bound[0]));
  const int64_t at = text::Find(self.as_string(), sub, kReverse);
  if (kRaise && at < 0) return RenderError("substring not found");
  return Value::Int(at);
}

absl::StatusOr<Value> StrCount(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("count", args, {"sub"}, 1));
  ASSIGN_OR_RETURN(std::string sub, RequiredString("count", bound[0]));
  return Value::Int(text::Count(self.as_string(), sub));
}

absl::StatusOr<Value> StrJoin(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("join", args, {"iterable"}, 1));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*bound[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return RenderError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                      TypeName(items[i]), " found"));
    }
    if (i > 0) out.append(self.as_string());
    out.append(items[i].as_string());
  }
  return Value::String(std::move(out));
}

// isalpha() and friends: true when non-empty and every code point passes.
template <bool (*kPred)(char32_t)>
absl::StatusOr<Value> StrIs(const Value& self, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("str.is*", args, {}).status());
  const std::u32string cps = text::Decode(self.as_string());
  if (cps.empty()) return Value::Bool(false);
  for (char32_t c : cps) {
    if (!kPred(c)) return Value::Bool(false);
  }
  return Value::Bool(true);
}

bool IsAlnum(char32_t c) { return text::IsAlpha(c) || text::IsDigit(c); }
bool IsAscii(char32_t c) { return c < 0x80; }

// islower()/isupper(): some cased code point, and none of the other case or titlecase.
template <bool kUpper>
absl::StatusOr<Value> StrIsCase(const Value& self, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("str.is*", args, {}).status());
  bool cased = false;
  for (char32_t c : text::Decode(self.as_string())) {
    if ((kUpper ? text::IsLower(c) : text::IsUpper(c)) || text::IsTitle(c)) {
      return Value::Bool(false);
    }
    if (kUpper ? text::IsUpper(c) : text::IsLower(c)) cased = true;
  }
  return Value::Bool(cased);
}

template <bool kSuffix>
absl::StatusOr<Value> StrRemoveAffix(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("removeprefix", args, {"affix"}, 1));
  ASSIGN_OR_RETURN(std::string affix, RequiredString("removeprefix", bound[0]));
  const std::string& s = self.as_string();
  if (affix.size() <= s.size()) {
    if (!kSuffix && s.compare(0, affix.size(), affix) == 0) {
      return Value::String(s.substr(affix.size()));
    }
    if (kSuffix && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::String(s.substr(0, s.size() - affix.size()));
    }
  }
  return self;
}

// ljust (-1), center (0), rjust (1).
template <int kAlign>
absl::StatusOr<Value> StrJustify(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("ljust", args, {"width", "fillchar"}, 1));
  ASSIGN_OR_RETURN(int64_t width, OptionalInt("ljust", bound[0], 0));
  std::string fill = " ";
  if (bound[1].has_value()) {
    if (!bound[1]->is_string() || text::CodePointCount(bound[1]->as_string()) != 1) {
      return RenderError("The fill character must be exactly one character long");
    }
    fill = bound[1]->as_string();
  }
  const std::string& s = self.as_string();
  const int64_t length = text::CodePointCount(s);
  if (width <= length) return self;
  const int64_t margin = width - length;
  // Python's center puts the extra fill on the left when the margin and width are odd.
  int64_t left = kAlign < 0 ? 0 : kAlign > 0 ? margin : margin / 2 + (margin & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out.append(fill);
  out.append(s);
  for (int64_t i = 0; i < margin - left; ++i) out.append(fill);
  return Value::String(std::move(out));
}

absl::StatusOr<Value> StrZfill(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("zfill", args, {"width"}, 1));
  ASSIGN_OR_RETURN(int64_t width, OptionalInt("zfill", bound[0], 0));
  std::string s = self.as_string();
  const int64_t length = text::CodePointCount(s);
  if (width <= length) return self;
  const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  s.insert(sign, std::string(width - length, '0'));
  return Value::String(std::move(s));
}

template <bool kReverse>
absl::StatusOr<Value> StrPartition(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("partition", args, {"sep"}, 1));
  ASSIGN_OR_RETURN(std::string sep, RequiredString("partition", bound[0]));
  if (sep.empty()) return RenderError("empty separator");
  const std::string& s = self.as_string();
  const size_t at = kReverse ? s.rfind(sep) : s.find(sep);
  std::vector<Value> parts;
  if (at == std::string::npos) {
    parts = kReverse ? std::vector<Value>{Value::String(""), Value::String(""), self}
                     : std::vector<Value>{self, Value::String(""), Value::String("")};
  } else {
    parts = {Value::String(s.substr(0, at)), Value::String(sep),
             Value::String(s.substr(at + sep.size()))};
  }
  return Value::MakeList(std::move(parts), List::Kind::kTuple);
}

absl::StatusOr<Value> StrFormatMethod(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(std::string out, StrFormat(self.as_string(), args));
  return Value::String(std::move(out));
}

constexpr Method kStrMethods[] = {
    {"capitalize", StrMap<text::Capitalize>},
    {"casefold", StrMap<text::Lower>},
    {"center", StrJustify<0>},
    {"count", StrCount},
    {"encode", nullptr},
    {"endswith", StrAffix<true>},
    {"expandtabs", nullptr},
    {"find", StrFind<false, false>},
    {"format", StrFormatMethod},
    {"format_map", nullptr},
    {"index", StrFind<false, true>},
    {"isalnum", StrIs<IsAlnum>},
    {"isalpha", StrIs<text::IsAlpha>},
    {"isascii", StrIs<IsAscii>},
    {"isdecimal", StrIs<text::IsDigit>},
    {"isdigit", StrIs<text::IsDigit>},
    {"isidentifier", nullptr},
    {"islower", StrIsCase<false>},
    {"isnumeric", StrIs<text::IsDigit>},
    {"isprintable", nullptr},
    {"isspace", StrIs<text::IsSpace>},
    {"istitle", nullptr},
    {"isupper", StrIsCase<true>},
    {"join", StrJoin},
    {"ljust", StrJustify<-1>},
    {"lower", StrMap<text::Lower>},
    {"lstrip", StrStrip<true, false>},
    {"maketrans", nullptr},
    {"partition", StrPartition<false>},
    {"removeprefix", StrRemoveAffix<false>},
    {"removesuffix", StrRemoveAffix<true>},
    {"replace", StrReplace},
    {"rfind", StrFind<true, false>},
    {"rindex", StrFind<true, true>},
    {"rjust", StrJustify<1>},
    {"rpartition", StrPartition<true>},
    {"rsplit", StrSplit<true>},
    {"rstrip", StrStrip<false, true>},
    {"split", StrSplit<false>},
    {"splitlines", StrSplitLines},
    {"startswith", StrAffix<false>},
    {"strip", StrStrip<true, true>},
    {"swapcase", StrMap<text::SwapCase>},
    {"title", StrMap<text::Title>},
    {"translate", nullptr},
    {"upper", StrMap<text::Upper>},
    {"zfill", StrZfill},
};

// ---- dict ----

absl::StatusOr<Value> DictGet(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("get", args, {"key", "default"}, 1));
  if (!IsHashable(*bound[0])) {
    return RenderError(absl::StrCat("unhashable type: '", TypeName(*bound[0]), "'"));
  }
  if (const Value* value = self.dict().Find(*bound[0])) return *value;
  return bound[1].has_value() ? *bound[1] : Value::None();
}

// keys() (0), values() (1), items() (2): Python returns views; these are lists that
// print the way the views do.
template <int kWhat>
absl::StatusOr<Value> DictView(const Value& self, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("items", args, {}).status());
  std::vector<Value> out;
  for (const auto& [key, value] : self.dict().items()) {
    if (kWhat == 0) out.push_back(key);
    if (kWhat == 1) out.push_back(value);
    if (kWhat == 2) out.push_back(Value::MakeList({key, value}, List::Kind::kTuple));
  }
  return Value::MakeList(std::move(out), kWhat == 0   ? List::Kind::kDictKeys
                                         : kWhat == 1 ? List::Kind::kDictValues
                                                      : List::Kind::kDictItems);
}

absl::StatusOr<Value> Identity(const Value& self, const CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("copy", args, {}).status());
  if (self.is_list()) return Value::MakeList(self.items(), self.list().kind);
  return self;
}

constexpr Method kDictMethods[] = {
    {"copy", Identity},     {"fromkeys", nullptr}, {"get", DictGet},
    {"items", DictView<2>}, {"keys", DictView<0>}, {"values", DictView<1>},
};
constexpr std::string_view kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};

// ---- list and tuple ----

absl::StatusOr<Value> ListCount(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("count", args, {"value"}, 1));
  int64_t n = 0;
  for (const Value& item : self.items()) n += Equals(item, *bound[0]) ? 1 : 0;
  return Value::Int(n);
}

absl::StatusOr<Value> ListIndex(const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto bound, BindArgs("index", args, {"value"}, 1));
  for (size_t i = 0; i < self.items().size(); ++i) {
    if (Equals(self.items()[i], *bound[0])) return Value::Int(static_cast<int64_t>(i));
  }
  return RenderError(absl::StrCat(Repr(*bound[0]), " is not in list"));
}

constexpr Method kListMethods[] = {{"copy", Identity}, {"count", ListCount}, {"index", ListIndex}};
constexpr Method kTupleMethods[] = {{"count", ListCount}, {"index", ListIndex}};
constexpr std::string_view kListMutators[] = {"append", "clear",  "extend",  "insert",
                                              "pop",    "remove", "reverse", "sort"};

template <size_t N>
std::optional<Value> Lookup(const Method (&methods)[N], const Value& self, std::string_view name) {
  for (const Method& m : methods) {
    if (m.name == name) return Value::MakeObject(std::make_shared<BoundMethod>(self, name, m.fn));
  }
  return std::nullopt;
}

template <size_t N>
std::optional<Value> Unsafe(const std::string_view (&mutators)[N], const Value& self,
                            std::string_view name) {
  for (std::string_view m : mutators) {
    if (m == name) {
      return Value::Undefined(absl::StrCat("access to attribute '", std::string(name), "' of '",
                                           TypeName(self), "' object is unsafe."));
    }
  }
  return std::nullopt;
}

// ---- str.format ----

struct FormatSpec {
  char32_t fill = ' ';
  char align = 0;  // '<', '>', '^', '=' or 0 for the type's default.
  char sign = '-';
  bool zero = false;
  int width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

absl::StatusOr<FormatSpec> ParseFormatSpec(std::string_view spec) {
  FormatSpec f;
  const std::u32string s = text::Decode(spec);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    f.fill = s[0];
    f.align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    f.align = static_cast<char>(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' '))
    f.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '0') {
    f.zero = true;
    ++i;
  }
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    f.width = (f.width < 0 ? 0 : f.width * 10) + static_cast<int>(s[i++] - '0');
    if (f.width > 4096) return RenderError("format width too large");
  }
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) f.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '.') {
    ++i;
    f.precision = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      f.precision = f.precision * 10 + static_cast<int>(s[i++] - '0');
      if (f.precision > 4096) return RenderError("format precision too large");
    }
  }
  if (i < s.size()) f.type = static_cast<char>(s[i++]);
  if (i != s.size()) return RenderError("Invalid format specifier");
  return f;
}

std::string Group(std::string digits, char separator) {
  if (separator == 0) return digits;
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out.push_back(separator);
    out.push_back(digits[i]);
  }
  return out;
}

absl::StatusOr<std::string> FormatValue(const Value& v, std::string_view spec_text) {
  if (spec_text.empty()) return Str(v);
  ASSIGN_OR_RETURN(FormatSpec f, ParseFormatSpec(spec_text));
  std::string body;
  std::string sign;
  bool numeric = false;
  if (v.is_string() && (f.type == 0 || f.type == 's')) {
    body = v.as_string();
    if (f.precision >= 0) {
      std::u32string cps = text::Decode(body);
      if (static_cast<int>(cps.size()) > f.precision) cps.resize(f.precision);
      body = text::Encode(cps);
    }
  } else if (v.is_number() && std::string_view("dxXob").find(f.type) != std::string_view::npos &&
             f.type != 0 && !v.is_float()) {
    numeric = true;
    const int64_t i = v.as_int();
    const unsigned long long magnitude =
        i < 0 ? 0ULL - static_cast<unsigned long long>(i) : static_cast<unsigned long long>(i);
    if (i < 0) sign = "-";
    if (f.type == 'd') {
      body = Group(std::to_string(magnitude), f.grouping);
    } else if (f.type == 'b') {
      for (unsigned long long m = magnitude; m > 0; m >>= 1)
        body.insert(body.begin(), '0' + (m & 1));
      if (body.empty()) body = "0";
    } else {
      char buf[32];
      std::snprintf(buf, sizeof(buf),
                    f.type == 'o'   ? "%llo"
                    : f.type == 'x' ? "%llx"
                                    : "%llX",
                    magnitude);
      body = buf;
    }
  } else if (v.is_number() &&
             (f.type == 0 || std::string_view("eEfFgG%").find(f.type) != std::string_view::npos)) {
    numeric = true;
    if (f.type == 0 && v.is_integral() && !v.is_bool()) {
      const int64_t i = v.as_int();
      if (i < 0) sign = "-";
      body = Group(std::to_string(i < 0 ? 0ULL - static_cast<unsigned long long>(i)
                                        : static_cast<unsigned long long>(i)),
                   f.grouping);
    } else if (f.type == 0 && v.is_bool()) {
      numeric = false;
      body = Str(v);
    } else {
      double d = v.as_float();
      if (std::signbit(d) && !std::isnan(d)) {
        sign = "-";
        d = -d;
      }
      char type = f.type;
      int precision = f.precision < 0 ? 6 : f.precision;
      if (type == '%') d *= 100;
      if (type == 0) {
        if (f.precision < 0) {
          body = FormatFloat(d);
        } else {
          type = 'g';
          precision = precision == 0 ? 1 : precision;
        }
      }
      if (body.empty()) {
        char buf[512];
        const char c_type = type == '%' ? 'f' : type;
        std::snprintf(buf, sizeof(buf), (std::string("%.*") + c_type).c_str(), precision, d);
        body = buf;
        if (f.type == 0 && body.find_first_of(".einf") == std::string::npos) body += ".0";
        if (type == '%') body += "%";
      }
      if (f.grouping != 0) {
        const size_t end = body.find_first_not_of("0123456789");
        body = Group(body.substr(0, end), f.grouping) +
               (end == std::string::npos ? "" : body.substr(end));
      }
    }
  } else {
    return RenderError(
        absl::StrCat("unsupported format string passed to ", TypeName(v), ".__format__"));
  }
  if (numeric && sign.empty() && (f.sign == '+' || f.sign == ' ')) sign = std::string(1, f.sign);
  char align = f.align;
  char32_t fill = f.fill;
  if (f.zero && align == 0) {
    align = '=';
    fill = '0';
  }
  if (align == 0) align = numeric ? '>' : '<';
  const int64_t length = text::CodePointCount(body) + text::CodePointCount(sign);
  const int64_t pad = f.width > length ? f.width - length : 0;
  std::string fill_text;
  text::AppendUtf8(fill, &fill_text);
  auto fills = [&](int64_t n) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out.append(fill_text);
    return out;
  };
  switch (align) {
    case '<':
      return sign + body + fills(pad);
    case '^':
      return fills(pad / 2) + sign + body + fills(pad - pad / 2);
    case '=':
      return sign + fills(pad) + body;
    default:
      return fills(pad) + sign + body;
  }
}

}  // namespace

std::optional<Value> LookupMethod(const Value& receiver, std::string_view name) {
  switch (receiver.kind()) {
    case Value::Kind::kString:
      return Lookup(kStrMethods, receiver, name);
    case Value::Kind::kDict:
      if (auto unsafe = Unsafe(kDictMutators, receiver, name)) return unsafe;
      return Lookup(kDictMethods, receiver, name);
    case Value::Kind::kList:
      if (receiver.list().kind == List::Kind::kList) {
        if (auto unsafe = Unsafe(kListMutators, receiver, name)) return unsafe;
        return Lookup(kListMethods, receiver, name);
      }
      if (receiver.is_tuple()) return Lookup(kTupleMethods, receiver, name);
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<std::string> StrFormat(std::string_view format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return RenderError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string_view::npos)
      return RenderError("Single '{' encountered in format string");
    std::string_view field = format.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string_view::npos) {
      return RenderError("nested replacement fields are not supported");
    }
    i = close;
    std::string_view spec;
    if (const size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    char conversion = 0;
    if (const size_t bang = field.find('!'); bang != std::string_view::npos) {
      if (bang + 2 != field.size()) return RenderError("invalid conversion in format string");
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    const size_t name_end = field.find_first_of(".[");
    const std::string_view name = field.substr(0, name_end);
    Value value;
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) {
      size_t index = auto_index++;
      if (!name.empty()) {
        const auto result = std::from_chars(name.data(), name.data() + name.size(), index);
        if (result.ec != std::errc() || result.ptr != name.data() + name.size()) {
          return RenderError(absl::StrCat("invalid field name '", std::string(name), "'"));
        }
      }
      if (index >= args.positional.size()) {
        return RenderError(absl::StrCat("Replacement index ", index, " out of range"));
      }
      value = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [key, v] : args.keyword) {
        if (key == name) {
          value = v;
          found = true;
        }
      }
      if (!found) return RenderError(absl::StrCat("KeyError: '", std::string(name), "'"));
    }
    // .attr and [key] lookups after the name.
    std::string_view rest = name_end == std::string_view::npos ? "" : field.substr(name_end);
    while (!rest.empty()) {
      if (rest[0] == '.') {
        const size_t end = rest.find_first_of(".[", 1);
        ASSIGN_OR_RETURN(value, GetAttr(value, rest.substr(1, end == std::string_view::npos
                                                                  ? std::string_view::npos
                                                                  : end - 1)));
        rest = end == std::string_view::npos ? "" : rest.substr(end);
      } else {
        const size_t end = rest.find(']');
        if (end == std::string_view::npos) return RenderError("Missing ']' in format string");
        const std::string key(rest.substr(1, end - 1));
        int64_t number = 0;
        const auto parsed = std::from_chars(key.data(), key.data() + key.size(), number);
        const bool numeric = !key.empty() && parsed.ec == std::errc() &&
                             parsed.ptr == key.data() + key.size() && key[0] != '-';
        ASSIGN_OR_RETURN(value, GetItem(value, numeric ? Value::Int(number) : Value::String(key)));
        rest = rest.substr(end + 1);
      }
      if (value.is_undefined()) return UndefinedError(value);
    }
    if (conversion == 'r' || conversion == 'a') {
      value = Value::String(Repr(value));
    } else if (conversion == 's') {
      value = Value::String(Str(value));
    } else if (conversion != 0) {
      return RenderError("Unknown conversion specifier");
    }
    ASSIGN_OR_RETURN(std::string formatted, FormatValue(value, spec));
    out.append(formatted);
  }
  return out;
}

}  // namespace conveyor::jinja
