// Jinja's built-in filters, tests and global functions, as transformers' environment has
// them (with its `tojson`, `raise_exception` and `strftime_now`).
//
// The parser resolves every filter and test name when it parses a template, so a
// template using one this file does not provide fails at load, naming the line.
// Filters and tests are pure functions of their operand and arguments.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "text/jinja/value.h"

namespace conveyor::jinja {

using FilterFn = absl::StatusOr<Value> (*)(const Value& operand, const CallArgs& args);
using TestFn = absl::StatusOr<bool> (*)(const Value& operand, const CallArgs& args);

// The filter or test named `name`, or nullptr when there is none.
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);

// The global function named `name` (range, dict, namespace, joiner, cycler,
// raise_exception, strftime_now), or nullopt. Template variables shadow these.
std::optional<Value> FindGlobal(std::string_view name);

// jinja2's Namespace: the one mutable object, so that a loop body can change state
// outside the loop (`{% set ns.found = true %}`).
class Namespace : public Object {
 public:
  std::string TypeName() const override { return "Namespace"; }
  std::string TypeRepr() const override { return "jinja2.utils.Namespace object"; }
  std::string Repr() const override;
  std::optional<Value> GetAttr(std::string_view name) const override;
  void SetAttr(const std::string& name, Value value) {
    attributes_.Set(Value::String(name), std::move(value));
  }

 private:
  Dict attributes_;
};

// The error raise_exception(message) fails with: the template refused its input. It is
// kFailedPrecondition inside the interpreter so that no line number is added to it;
// ChatTemplate::Render reports it as InvalidArgument with exactly `message`.
absl::Status TemplateRaised(std::string_view message);
bool IsTemplateRaised(const absl::Status& status);

}  // namespace conveyor::jinja
