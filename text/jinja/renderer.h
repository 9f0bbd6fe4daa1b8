// Executes a parsed chat template (ast.h) against a context, producing the prompt text.
//
// Scoping follows jinja2: `{% set %}` at the top level or inside `{% if %}` is visible
// afterwards, while each for-loop iteration, macro call and `{% with %}` block gets a
// scope of its own that is discarded at its end (which is why templates use namespace()
// to carry state out of loops). A for loop's `{% else %}` runs when no iteration reached
// the end of the body, as in jinja2 with loopcontrols. Render-time errors carry the line
// of the innermost expression or statement that failed, except raise_exception's,
// which pass through unchanged.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace conveyor::jinja {

// Variables visible at one point of a render; lookups walk out to the parent.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  // The value of `name` here or in an enclosing scope, or nullptr.
  const Value* Find(std::string_view name) const;
  void Set(std::string_view name, Value value);

 private:
  std::shared_ptr<Scope> parent_;
  // Scopes hold a handful of names; a vector beats a hash map at that size.
  std::vector<std::pair<std::string, Value>> vars_;
};

class Renderer {
 public:
  // Renders `program` with the variables of `context` (a dict). raise_exception's error
  // is as TemplateRaised made it (builtins.h); others are InvalidArgument with a line.
  static absl::StatusOr<std::string> Render(const Program& program, const Value& context);

  // Calls `macro` with `args`, its body seeing `closure`; `caller` is the body of the
  // {% call %} block invoking it (undefined otherwise).
  absl::StatusOr<Value> CallMacro(const MacroDef& macro, std::shared_ptr<Scope> closure,
                                  const CallArgs& args, const Value& caller);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using ScopePtr = std::shared_ptr<Scope>;

  Renderer() = default;

  absl::StatusOr<Flow> RenderBody(const Body& body, const ScopePtr& scope, std::string* out);
  absl::StatusOr<Flow> RenderStmt(const Stmt& stmt, const ScopePtr& scope, std::string* out);
  absl::Status RenderFor(const ForStmt& stmt, const ScopePtr& scope, std::string* out);
  absl::Status RenderCallBlock(const CallBlockStmt& stmt, const ScopePtr& scope, std::string* out);
  absl::Status Assign(const AssignTarget& target, const Value& value, Scope& scope);

  absl::StatusOr<Value> Eval(const Expr& expr, const ScopePtr& scope);
  absl::StatusOr<Value> EvalUnlocated(const Expr& expr, const ScopePtr& scope);
  absl::StatusOr<CallArgs> EvalArgs(const Arguments& args, const ScopePtr& scope);
  absl::StatusOr<Value> Call(const Value& callee, const CallArgs& args);
  // Applies a filter chain whose innermost operand is null to `input` (a block's output).
  absl::StatusOr<Value> ApplyBlockFilter(const Expr& filter, const ScopePtr& scope,
                                         const Value& input);

  // Adds "chat template line N: " to the first error of a render (the innermost place).
  absl::Status Locate(const absl::Status& status, int line);

  bool located_ = false;
  int call_depth_ = 0;
  const Value* block_input_ = nullptr;  // For ApplyBlockFilter.
};

}  // namespace conveyor::jinja
