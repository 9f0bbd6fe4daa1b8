#include "text/jinja/value.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "text/jinja/text.h"

namespace conveyor::jinja {
namespace {

std::string ReprItems(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.append(", ");
    out.append(Repr(items[i]));
  }
  return out;
}

}  // namespace

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items_) {
    if (Equals(k, key)) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items_) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

std::optional<Value> Object::GetAttr(std::string_view name) const { return std::nullopt; }

absl::StatusOr<Value> Object::Call(Renderer& renderer, const CallArgs& args) const {
  return RenderError(absl::StrCat("'", TypeName(), "' object is not callable"));
}

Value Value::UndefinedName(std::string_view name) {
  return Undefined(absl::StrCat("'", std::string(name), "' is undefined"));
}

Value Value::MakeList(std::vector<Value> items, ListKind kind) {
  auto list = std::make_shared<List>();
  list->items = std::move(items);
  list->kind = kind;
  return Value(std::shared_ptr<const List>(std::move(list)));
}

Value Value::MakeDict(Dict dict) {
  return Value(std::shared_ptr<const Dict>(std::make_shared<Dict>(std::move(dict))));
}

bool Value::SameAs(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return as_bool() == other.as_bool();
    case Kind::kInt:
      // CPython caches the small ints; larger equal ints are usually distinct objects.
      return as_int() == other.as_int() && as_int() >= -5 && as_int() <= 256;
    case Kind::kFloat:
      return false;
    case Kind::kString:
      return as_string() == other.as_string();
    case Kind::kList:
      return &list() == &other.list();
    case Kind::kDict:
      return &dict() == &other.dict();
    case Kind::kObject:
      return object_ptr() == other.object_ptr();
  }
  return false;
}

absl::Status UndefinedError(const Value& undefined) {
  return RenderError(undefined.undefined_message());
}

absl::Status RenderError(std::string_view message) {
  return absl::InvalidArgumentError(std::string(message));
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return !v.items().empty();
    case Value::Kind::kDict:
      return v.dict().size() > 0;
    case Value::Kind::kObject:
      return true;
  }
  return false;
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip, as Python's repr uses, then Python's layout:
  // fixed notation for exponents -4..15, scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, result.ptr - buf);
  std::string out;
  if (sci.front() == '-') {
    out.push_back('-');
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::string_view exp_text = sci.substr(e + 1);
  if (!exp_text.empty() && exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);
  const int decimal_point = exponent + 1;
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-decimal_point), '0');
      out.append(digits);
    } else if (static_cast<size_t>(decimal_point) >= digits.size()) {
      out.append(digits);
      out.append(decimal_point - digits.size(), '0');
      out.append(".0");
    } else {
      out.append(digits, 0, decimal_point);
      out.push_back('.');
      out.append(digits, decimal_point);
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out.append(digits, 1);
  }
  out.push_back('e');
  out.push_back(exponent < 0 ? '-' : '+');
  const int magnitude = std::abs(exponent);
  if (magnitude < 10) out.push_back('0');
  out.append(std::to_string(magnitude));
  return out;
}

std::string Str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return v.as_string();
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return FormatFloat(v.as_float());
    case Value::Kind::kString:
      return text::PyRepr(v.as_string());
    case Value::Kind::kList: {
      std::string items = ReprItems(v.items());
      switch (v.list().kind) {
        case List::Kind::kList:
          return absl::StrCat("[", items, "]");
        case List::Kind::kTuple:
          return absl::StrCat("(", items, v.items().size() == 1 ? ",)" : ")");
        case List::Kind::kDictKeys:
          return absl::StrCat("dict_keys([", items, "])");
        case List::Kind::kDictValues:
          return absl::StrCat("dict_values([", items, "])");
        case List::Kind::kDictItems:
          return absl::StrCat("dict_items([", items, "])");
      }
      return items;
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.dict().items()) {
        if (!first) out.append(", ");
        first = false;
        absl::StrAppend(&out, Repr(key), ": ", Repr(value));
      }
      out.push_back('}');
      return out;
    }
    case Value::Kind::kObject:
      return v.object().Repr();
  }
  return "";
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.list().kind != b.list().kind) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [key, value] : a.dict().items()) {
        const Value* other = b.dict().Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kObject:
      return a.object_ptr() == b.object_ptr();
    default:
      return false;  // Numbers were handled above.
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      switch (v.list().kind) {
        case List::Kind::kList:
          return "list";
        case List::Kind::kTuple:
          return "tuple";
        case List::Kind::kDictKeys:
          return "dict_keys";
        case List::Kind::kDictValues:
          return "dict_values";
        case List::Kind::kDictItems:
          return "dict_items";
      }
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kObject:
      return v.object().TypeName();
  }
  return "object";
}

std::string TypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_object()) return v.object().TypeRepr();
  if (v.is_undefined()) return "jinja2.runtime.Undefined object";
  return TypeName(v) + " object";
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>();
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : text::Decode(v.as_string())) {
        std::string s;
        text::AppendUtf8(c, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().size());
      for (const auto& item : v.dict().items()) keys.push_back(item.first);
      return keys;
    }
    default:
      return RenderError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return text::CodePointCount(v.as_string());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    default:
      return RenderError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

bool IsHashable(const Value& v) {
  if (v.is_dict()) return false;
  if (v.is_list()) {
    if (!v.is_tuple()) return false;
    for (const Value& item : v.items()) {
      if (!IsHashable(item)) return false;
    }
  }
  return true;
}

absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    std::string_view function, const CallArgs& args, std::initializer_list<std::string_view> names,
    size_t required) {
  const std::vector<std::string_view> params(names);
  if (args.positional.size() > params.size()) {
    return RenderError(absl::StrCat(std::string(function), "() takes at most ", params.size(),
                                    " argument(s) (", args.positional.size(), " given)"));
  }
  std::vector<std::optional<Value>> bound(params.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < params.size() && params[i] != name) ++i;
    if (i == params.size()) {
      return RenderError(absl::StrCat(std::string(function),
                                      "() got an unexpected keyword argument '", name, "'"));
    }
    if (bound[i].has_value()) {
      return RenderError(
          absl::StrCat(std::string(function), "() got multiple values for argument '", name, "'"));
    }
    bound[i] = value;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!bound[i].has_value()) {
      return RenderError(absl::StrCat(std::string(function), "() missing required argument '",
                                      std::string(params[i]), "'"));
    }
  }
  return bound;
}

}  // namespace conveyor::jinja
