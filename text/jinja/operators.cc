#include "text/jinja/operators.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "text/jinja/methods.h"
#include "text/jinja/text.h"

namespace conveyor::jinja {
namespace {

constexpr std::string_view kOverflow = "integer overflow (integers are 64-bit in this interpreter)";

// Results bigger than this are refused: a template multiplying a string or list by a
// large number would otherwise exhaust memory.
constexpr int64_t kMaxRepeatBytes = int64_t{1} << 30;

std::string_view ArithmeticSymbol(ArithmeticOp op) {
  switch (op) {
    case ArithmeticOp::kAdd:
      return "+";
    case ArithmeticOp::kSub:
      return "-";
    case ArithmeticOp::kMul:
      return "*";
    case ArithmeticOp::kDiv:
      return "/";
    case ArithmeticOp::kFloorDiv:
      return "//";
    case ArithmeticOp::kMod:
      return "%";
    case ArithmeticOp::kPow:
      return "** or pow()";
  }
  return "?";
}

absl::Status UnsupportedOperands(std::string_view symbol, const Value& a, const Value& b) {
  return RenderError(absl::StrCat("unsupported operand type(s) for ", std::string(symbol), ": '",
                                  TypeName(a), "' and '", TypeName(b), "'"));
}

// Python's float modulo and floor division (Objects/floatobject.c), which differ from
// fmod and floor(a / b) in sign and rounding.
double FloatMod(double a, double b) {
  double mod = std::fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

double FloatFloorDiv(double a, double b) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

absl::StatusOr<Value> Repeat(const Value& sequence, int64_t times) {
  if (times < 0) times = 0;
  if (sequence.is_string()) {
    const std::string& s = sequence.as_string();
    if (!s.empty() && times > kMaxRepeatBytes / static_cast<int64_t>(s.size())) {
      return RenderError("string repetition result too large");
    }
    std::string out;
    out.reserve(s.size() * times);
    for (int64_t i = 0; i < times; ++i) out.append(s);
    return Value::String(std::move(out));
  }
  const auto& items = sequence.items();
  if (!items.empty() && times > kMaxRepeatBytes / 16 / static_cast<int64_t>(items.size())) {
    return RenderError("list repetition result too large");
  }
  std::vector<Value> out;
  out.reserve(items.size() * times);
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::MakeList(std::move(out), sequence.list().kind);
}

absl::StatusOr<Value> IntPow(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return RenderError(kOverflow);
    }
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) return RenderError(kOverflow);
  }
  return Value::Int(result);
}

absl::StatusOr<Value> NumericArithmetic(ArithmeticOp op, const Value& a, const Value& b) {
  const bool integral = a.is_integral() && b.is_integral();
  if (integral) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r;
    switch (op) {
      case ArithmeticOp::kAdd:
        if (__builtin_add_overflow(x, y, &r)) return RenderError(kOverflow);
        return Value::Int(r);
      case ArithmeticOp::kSub:
        if (__builtin_sub_overflow(x, y, &r)) return RenderError(kOverflow);
        return Value::Int(r);
      case ArithmeticOp::kMul:
        if (__builtin_mul_overflow(x, y, &r)) return RenderError(kOverflow);
        return Value::Int(r);
      case ArithmeticOp::kDiv:
        if (y == 0) return RenderError("division by zero");
        return Value::Float(static_cast<double>(x) / static_cast<double>(y));
      case ArithmeticOp::kFloorDiv:
      case ArithmeticOp::kMod: {
        if (y == 0) return RenderError("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          if (op == ArithmeticOp::kMod) return Value::Int(0);
          return RenderError(kOverflow);
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::Int(op == ArithmeticOp::kFloorDiv ? q : m);
      }
      case ArithmeticOp::kPow:
        if (y >= 0) return IntPow(x, y);
        if (x == 0) return RenderError("0.0 cannot be raised to a negative power");
        return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
    }
  }
  const double x = a.as_float(), y = b.as_float();
  switch (op) {
    case ArithmeticOp::kAdd:
      return Value::Float(x + y);
    case ArithmeticOp::kSub:
      return Value::Float(x - y);
    case ArithmeticOp::kMul:
      return Value::Float(x * y);
    case ArithmeticOp::kDiv:
      if (y == 0) return RenderError("float division by zero");
      return Value::Float(x / y);
    case ArithmeticOp::kFloorDiv:
      if (y == 0) return RenderError("float floor division by zero");
      return Value::Float(FloatFloorDiv(x, y));
    case ArithmeticOp::kMod:
      if (y == 0) return RenderError("float modulo");
      return Value::Float(FloatMod(x, y));
    case ArithmeticOp::kPow:
      if (x == 0 && y < 0) return RenderError("0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) {
        return RenderError("a negative number raised to a fractional power is complex");
      }
      return Value::Float(std::pow(x, y));
  }
  return RenderError("unknown operator");
}

// Python's rich comparison of two values for the ordering operators.
absl::StatusOr<bool> Order(CompareOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  auto apply = [op](auto x, auto y) {
    switch (op) {
      case CompareOp::kLt:
        return x < y;
      case CompareOp::kLe:
        return x <= y;
      case CompareOp::kGt:
        return x > y;
      default:
        return x >= y;
    }
  };
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return apply(a.as_int(), b.as_int());
    return apply(a.as_float(), b.as_float());
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    return apply(a.as_string().compare(b.as_string()), 0);
  }
  if (a.is_list() && b.is_list() && a.list().kind == b.list().kind &&
      (a.list().kind == List::Kind::kList || a.list().kind == List::Kind::kTuple)) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Order(op, x[i], y[i]);
    }
    return apply(x.size(), y.size());
  }
  std::string_view symbol = op == CompareOp::kLt   ? "<"
                            : op == CompareOp::kLe ? "<="
                            : op == CompareOp::kGt ? ">"
                                                   : ">=";
  return RenderError(absl::StrCat("'", std::string(symbol),
                                  "' not supported between instances of '", TypeName(a), "' and '",
                                  TypeName(b), "'"));
}

bool IsSliceIndex(const Value& v) { return v.is_none() || v.is_integral(); }

Value NoElement(const Value& object, const Value& key) {
  if (key.is_string()) {
    return Value::Undefined(
        absl::StrCat("'", TypeRepr(object), "' has no attribute '", key.as_string(), "'"));
  }
  return Value::Undefined(absl::StrCat(TypeRepr(object), " has no element ", Repr(key)));
}

// Python's %-conversion of one argument.
absl::StatusOr<std::string> ConvertOne(char type, const std::string& flags, int width,
                                       int precision, const Value& arg) {
  std::string out;
  switch (type) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = type == 's' ? Str(arg) : Repr(arg);
      if (precision >= 0) {
        std::u32string cps = text::Decode(s);
        if (static_cast<int>(cps.size()) > precision) cps.resize(precision);
        s = text::Encode(cps);
      }
      const int64_t length = text::CodePointCount(s);
      const std::string pad(width > length ? width - length : 0, ' ');
      return flags.find('-') != std::string::npos ? s + pad : pad + s;
    }
    case 'c': {
      if (arg.is_string() && text::CodePointCount(arg.as_string()) == 1) return arg.as_string();
      if (!arg.is_integral()) return RenderError("%c requires int or char");
      text::AppendUtf8(static_cast<char32_t>(arg.as_int()), &out);
      return out;
    }
    default:
      break;
  }
  if (!arg.is_number()) {
    return RenderError(absl::StrCat("%", std::string(1, type),
                                    " format: a real number is required, not ", TypeName(arg)));
  }
  std::string spec = "%" + flags;
  if (width >= 0) spec += std::to_string(width);
  if (precision >= 0) spec += "." + std::to_string(precision);
  char buf[512];
  switch (type) {
    case 'd':
    case 'i':
    case 'u': {
      const int64_t v =
          arg.is_float() ? static_cast<int64_t>(std::trunc(arg.as_float())) : arg.as_int();
      std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), static_cast<long long>(v));
      return std::string(buf);
    }
    case 'x':
    case 'X':
    case 'o': {
      if (arg.is_float()) {
        return RenderError(
            absl::StrCat("%", std::string(1, type), " format: an integer is required, not float"));
      }
      const int64_t v = arg.as_int();
      const unsigned long long magnitude =
          v < 0 ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
      std::snprintf(buf, sizeof(buf), (spec + "ll" + std::string(1, type)).c_str(), magnitude);
      return v < 0 ? "-" + std::string(buf) : std::string(buf);
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
      std::snprintf(buf, sizeof(buf), (spec + std::string(1, type)).c_str(), arg.as_float());
      return std::string(buf);
    default:
      return RenderError(absl::StrCat("unsupported format character '", std::string(1, type), "'"));
  }
}

}  // namespace

absl::StatusOr<Value> Arithmetic(ArithmeticOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) return NumericArithmetic(op, a, b);
  switch (op) {
    case ArithmeticOp::kAdd:
      if (a.is_string()) {
        if (!b.is_string()) {
          return RenderError(
              absl::StrCat("can only concatenate str (not \"", TypeName(b), "\") to str"));
        }
        return Value::String(a.as_string() + b.as_string());
      }
      if (a.is_list() && (a.list().kind == List::Kind::kList || a.is_tuple())) {
        if (!b.is_list() || b.list().kind != a.list().kind) {
          return RenderError(absl::StrCat("can only concatenate ", TypeName(a), " (not \"",
                                          TypeName(b), "\") to ", TypeName(a)));
        }
        std::vector<Value> items = a.items();
        items.insert(items.end(), b.items().begin(), b.items().end());
        return Value::MakeList(std::move(items), a.list().kind);
      }
      break;
    case ArithmeticOp::kMul: {
      const bool a_seq = a.is_string() || a.is_list();
      const bool b_seq = b.is_string() || b.is_list();
      if (a_seq && b.is_integral()) return Repeat(a, b.as_int());
      if (b_seq && a.is_integral()) return Repeat(b, a.as_int());
      if (a_seq || b_seq) {
        return RenderError(absl::StrCat("can't multiply sequence by non-int of type '",
                                        TypeName(a_seq ? b : a), "'"));
      }
      break;
    }
    case ArithmeticOp::kMod:
      if (a.is_string()) {
        ASSIGN_OR_RETURN(std::string formatted, PercentFormat(a.as_string(), b));
        return Value::String(std::move(formatted));
      }
      break;
    default:
      break;
  }
  return UnsupportedOperands(ArithmeticSymbol(op), a, b);
}

absl::StatusOr<Value> UnaryArithmetic(const Value& v, bool negate) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_float()) return Value::Float(negate ? -v.as_float() : v.as_float());
  if (v.is_integral()) {
    if (!negate) return Value::Int(v.as_int());
    if (v.as_int() == INT64_MIN) return RenderError(kOverflow);
    return Value::Int(-v.as_int());
  }
  return RenderError(
      absl::StrCat("bad operand type for unary ", negate ? "-" : "+", ": '", TypeName(v), "'"));
}

absl::StatusOr<bool> Compare(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq:
      return Equals(a, b);
    case CompareOp::kNe:
      return !Equals(a, b);
    case CompareOp::kIn:
      return Contains(b, a);
    case CompareOp::kNotIn: {
      ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    default:
      return Order(op, a, b);
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) { return Order(CompareOp::kLt, a, b); }

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;  // jinja2's Undefined iterates as empty.
    case Value::Kind::kString:
      if (!item.is_string()) {
        return RenderError(
            absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (!IsHashable(item)) {
        return RenderError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      }
      return container.dict().Find(item) != nullptr;
    default:
      return RenderError(
          absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<Value> GetAttr(const Value& object, std::string_view name) {
  if (object.is_undefined()) return UndefinedError(object);
  if (name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__") {
    // Python's dunder attributes are what the sandbox exists to hide.
    return Value::Undefined(absl::StrCat("access to attribute '", std::string(name), "' of '",
                                         TypeName(object), "' object is unsafe."));
  }
  if (std::optional<Value> method = LookupMethod(object, name)) return *std::move(method);
  if (object.is_object()) {
    if (std::optional<Value> attr = object.object().GetAttr(name)) return *std::move(attr);
  } else if (object.is_dict()) {
    if (const Value* value = object.dict().Find(Value::String(std::string(name)))) {
      return *value;
    }
  }
  return NoElement(object, Value::String(std::string(name)));
}

absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(object);
    case Value::Kind::kDict:
      if (IsHashable(key)) {
        if (const Value* value = object.dict().Find(key)) return *value;
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (key.is_integral() &&
          (object.is_string() || object.list().kind == List::Kind::kList || object.is_tuple())) {
        int64_t index = key.as_int();
        ASSIGN_OR_RETURN(const int64_t length, Length(object));
        if (index < 0) index += length;
        if (index < 0 || index >= length) return NoElement(object, key);
        if (object.is_list()) return object.items()[index];
        const std::u32string cps = text::Decode(object.as_string());
        return Value::String(text::EncodeRange(cps, index, 1));
      }
      break;
    case Value::Kind::kObject:
      // Namespaces and loops are not subscriptable; jinja2 falls back to the attribute.
      if (key.is_string()) {
        if (std::optional<Value> attr = object.object().GetAttr(key.as_string())) {
          return *std::move(attr);
        }
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (std::optional<Value> method = LookupMethod(object, key.as_string())) {
      return *std::move(method);
    }
  }
  return NoElement(object, key);
}

absl::StatusOr<SliceIndices> AdjustSlice(int64_t length, const Value& start, const Value& stop,
                                         const Value& step) {
  SliceIndices s;
  s.step = step.is_integral() ? step.as_int() : 1;
  if (s.step == 0) return RenderError("slice step cannot be zero");
  const int64_t lower = s.step < 0 ? -1 : 0;
  const int64_t upper = s.step < 0 ? length - 1 : length;
  auto adjust = [&](const Value& v, int64_t fallback) {
    if (!v.is_integral()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) {
      i += length;
      if (i < lower) i = lower;
    } else if (i > upper) {
      i = upper;
    }
    return i;
  };
  s.start = adjust(start, s.step < 0 ? upper : lower);
  s.stop = adjust(stop, s.step < 0 ? lower : upper);
  return s;
}

absl::StatusOr<Value> Slice(const Value& object, const Value& start, const Value& stop,
                            const Value& step) {
  if (object.is_undefined()) return UndefinedError(object);
  const bool sliceable =
      object.is_string() ||
      (object.is_list() && (object.list().kind == List::Kind::kList || object.is_tuple()));
  // jinja2 compiles a slice to Python's own subscript, not the sandbox's getitem: slicing
  // anything but a sequence is an error rather than an undefined value.
  if (!sliceable) {
    if (object.is_dict()) return RenderError("unhashable type: 'slice'");
    return RenderError(absl::StrCat("'", TypeName(object), "' object is not subscriptable"));
  }
  if (!IsSliceIndex(start) || !IsSliceIndex(stop) || !IsSliceIndex(step)) {
    return RenderError("slice indices must be integers or None or have an __index__ method");
  }
  ASSIGN_OR_RETURN(const int64_t length, Length(object));
  ASSIGN_OR_RETURN(const SliceIndices s, AdjustSlice(length, start, stop, step));
  std::vector<int64_t> indices;
  for (int64_t i = s.start; s.step > 0 ? i < s.stop : i > s.stop; i += s.step) {
    indices.push_back(i);
  }
  if (object.is_string()) {
    const std::u32string cps = text::Decode(object.as_string());
    std::u32string out;
    for (int64_t i : indices) out.push_back(cps[i]);
    return Value::String(text::Encode(out));
  }
  std::vector<Value> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(object.items()[i]);
  return Value::MakeList(std::move(out), object.list().kind);
}

absl::StatusOr<std::string> PercentFormat(std::string_view format, const Value& args) {
  std::vector<Value> positional;
  const bool is_mapping = args.is_dict();
  if (args.is_tuple()) {
    positional = args.items();
  } else {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    ++i;
    if (i >= format.size()) return RenderError("incomplete format");
    std::optional<Value> arg;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string_view::npos) return RenderError("incomplete format key");
      if (!is_mapping) return RenderError("format requires a mapping");
      const Value* found =
          args.dict().Find(Value::String(std::string(format.substr(i + 1, close - i - 1))));
      if (found == nullptr) {
        return RenderError(
            absl::StrCat("KeyError: '", std::string(format.substr(i + 1, close - i - 1)), "'"));
      }
      arg = *found;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() &&
           std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      flags.push_back(format[i++]);
    }
    int width = -1, precision = -1;
    while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
      width = (width < 0 ? 0 : width * 10) + (format[i++] - '0');
      if (width > 4096) return RenderError("format width too large");
    }
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        precision = precision * 10 + (format[i++] - '0');
        if (precision > 4096) return RenderError("format precision too large");
      }
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) return RenderError("incomplete format");
    const char type = format[i];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (!arg.has_value()) {
      if (next_arg >= positional.size())
        return RenderError("not enough arguments for format string");
      arg = positional[next_arg++];
    }
    ASSIGN_OR_RETURN(std::string converted, ConvertOne(type, flags, width, precision, *arg));
    out.append(converted);
  }
  if (!used_mapping && !is_mapping && next_arg < positional.size()) {
    return RenderError("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace conveyor::jinja
