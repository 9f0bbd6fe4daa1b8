// The values a Jinja template computes with, and Python's rules for them.
//
// A Value is what jinja2 would hold as a Python object: undefined (jinja2's default
// Undefined), None, bool, int (64-bit here), float, str (UTF-8), list or tuple, dict
// (insertion-ordered), or an Object (namespace, loop, macro, bound method, ...). Lists
// and dicts are immutable once built and shared between copies, as the immutable sandbox
// forbids mutating them; only a namespace changes, through `{% set ns.x = ... %}`.
//
// The free functions give Python's semantics: truthiness, str() and repr() (Python's
// float repr, quotes chosen like CPython), == across int/float/bool, ordering, iteration.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::jinja {

class Renderer;
struct List;

// What a List is: a list, a tuple, or one of the dict views (which print as
// dict_keys([...]) etc.).
enum class ListKind { kList, kTuple, kDictKeys, kDictValues, kDictItems };

class Dict;
class Object;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject };

  // Undefined, with the message an operation on it fails with.
  Value() : data_(UndefinedData{}) {}
  static Value Undefined(std::string message) { return Value(UndefinedData{std::move(message)}); }
  // Undefined for the name `name`: "'name' is undefined".
  static Value UndefinedName(std::string_view name);
  static Value None() { return Value(NoneData{}); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double d) { return Value(d); }
  static Value String(std::string s) { return Value(std::move(s)); }
  static Value MakeList(std::vector<Value> items, ListKind kind = ListKind::kList);
  static Value MakeDict(Dict dict);
  static Value MakeObject(std::shared_ptr<Object> object) { return Value(std::move(object)); }

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  // An int proper (Python: isinstance(x, int) and not a bool).
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // int, float or bool (Python's numbers.Number).
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  // int or bool: usable as an integer.
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_tuple() const;
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_object() const { return kind() == Kind::kObject; }

  const std::string& undefined_message() const { return std::get<0>(data_).message; }
  bool as_bool() const { return std::get<bool>(data_); }
  // The integer value of an int or bool.
  int64_t as_int() const { return is_bool() ? as_bool() : std::get<int64_t>(data_); }
  // The value of any number as a double.
  double as_float() const { return is_float() ? std::get<double>(data_) : as_int(); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const std::vector<Value>& items() const;
  const Dict& dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Object& object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  const std::shared_ptr<Object>& object_ptr() const {
    return std::get<std::shared_ptr<Object>>(data_);
  }
  // Whether two values are the same object (Python's `is`), for the `sameas` test.
  bool SameAs(const Value& other) const;

 private:
  struct UndefinedData {
    std::string message;
  };
  struct NoneData {};
  using Data = std::variant<UndefinedData, NoneData, bool, int64_t, double, std::string,
                            std::shared_ptr<const List>, std::shared_ptr<const Dict>,
                            std::shared_ptr<Object>>;
  template <typename T>
  explicit Value(T data) : data_(std::move(data)) {}

  Data data_;
};

// Positional and keyword arguments of a call, after evaluation.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A list, a tuple or a dict view, immutable once built.
struct List {
  using Kind = ListKind;
  std::vector<Value> items;
  Kind kind = Kind::kList;
};

// A Python dict: keys keep their insertion order; 1, 1.0 and True are the same key.
class Dict {
 public:
  const Value* Find(const Value& key) const;
  // Sets `key` to `value`; an existing equal key keeps its place (and its original form).
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<Value, Value>> items_;
};

// Anything else a template can hold: namespaces, loop contexts, macros, functions.
class Object {
 public:
  virtual ~Object() = default;
  // Python's type(x).__name__, for error messages ("Namespace", "Macro").
  virtual std::string TypeName() const = 0;
  // jinja2's object_type_repr, for undefined messages ("jinja2.utils.Namespace object").
  virtual std::string TypeRepr() const { return TypeName() + " object"; }
  // str() and repr().
  virtual std::string Repr() const = 0;
  // The attribute `name`, or nullopt when the object has none.
  virtual std::optional<Value> GetAttr(std::string_view name) const;
  virtual bool IsCallable() const { return false; }
  // Calls the object; the default says it is not callable.
  virtual absl::StatusOr<Value> Call(Renderer& renderer, const CallArgs& args) const;
};

inline bool Value::is_tuple() const { return is_list() && list().kind == List::Kind::kTuple; }
inline const std::vector<Value>& Value::items() const { return list().items; }

// The error an operation on an undefined value fails with (jinja2's UndefinedError).
absl::Status UndefinedError(const Value& undefined);

// Python's bool(x); undefined is false.
bool Truthy(const Value& v);
// Python's str(x); undefined is "" (as jinja2 prints it).
std::string Str(const Value& v);
// Python's repr(x); undefined is "Undefined".
std::string Repr(const Value& v);
// Python's repr() of a float: "1.0", "1e-05", "1e+16", "inf", "nan".
std::string FormatFloat(double d);
// Python's ==, with jinja2's Undefined equal only to another Undefined.
bool Equals(const Value& a, const Value& b);

// Python's type(x).__name__ ("int", "str", "NoneType", "Undefined", ...).
std::string TypeName(const Value& v);
// jinja2's object_type_repr ("dict object", "None"), used in undefined messages.
std::string TypeRepr(const Value& v);

// Python's list(iter(x)): a str gives its code points, a dict its keys, undefined
// nothing; other values are a TypeError.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
// Python's len(x); undefined has length 0.
absl::StatusOr<int64_t> Length(const Value& v);
// Whether Python could hash `v` (a dict key, a set member): false for lists and dicts.
bool IsHashable(const Value& v);

// A render-time error: InvalidArgument with `message` (the renderer adds the line).
absl::Status RenderError(std::string_view message);

// Binds a call's arguments to parameters the way Python binds them: positional first,
// then keywords by name. Returns one entry per name, nullopt where the caller gave none;
// the first `required` parameters must be given.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    std::string_view function, const CallArgs& args, std::initializer_list<std::string_view> names,
    size_t required = 0);

}  // namespace conveyor::jinja
