#include "text/jinja/renderer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "text/jinja/lexer.h"
#include "text/jinja/operators.h"

namespace conveyor::jinja {
namespace {

// Deeper macro recursion than this is a runaway template (Python would hit its own
// recursion limit).
constexpr int kMaxCallDepth = 200;
// A prompt larger than this is a runaway template, not a prompt.
constexpr size_t kMaxOutputBytes = size_t{256} << 20;

// A macro (or the body of a {% call %} block) as a value. It refers to the scope it was
// defined in weakly: that scope may hold the macro itself, and a strong reference would
// be a cycle that outlives the render.
class Macro : public Object {
 public:
  Macro(std::shared_ptr<const MacroDef> macro, std::weak_ptr<Scope> closure)
      : macro_(std::move(macro)), closure_(std::move(closure)) {}
  std::string TypeName() const override { return "Macro"; }
  std::string TypeRepr() const override { return "jinja2.runtime.Macro object"; }
  std::string Repr() const override { return absl::StrCat("<Macro '", macro_->name, "'>"); }
  std::optional<Value> GetAttr(std::string_view name) const override {
    if (name == "name") return Value::String(macro_->name);
    return std::nullopt;
  }
  bool IsCallable() const override { return true; }
  absl::StatusOr<Value> Call(Renderer& renderer, const CallArgs& args) const override {
    return CallWithCaller(renderer, args, Value::Undefined("No caller defined"));
  }
  absl::StatusOr<Value> CallWithCaller(Renderer& renderer, const CallArgs& args,
                                       const Value& caller) const {
    std::shared_ptr<Scope> closure = closure_.lock();
    if (closure == nullptr) {
      return RenderError(absl::StrCat("macro '", macro_->name,
                                      "' is called after the scope that defined it ended"));
    }
    return renderer.CallMacro(*macro_, std::move(closure), args, caller);
  }

 private:
  std::shared_ptr<const MacroDef> macro_;
  std::weak_ptr<Scope> closure_;
};

// The `loop` variable of a for loop.
class LoopContext : public Object, public std::enable_shared_from_this<LoopContext> {
 public:
  explicit LoopContext(std::vector<Value> items) : items_(std::move(items)) {}
  void set_index0(size_t index0) { index0_ = index0; }

  std::string TypeName() const override { return "LoopContext"; }
  std::string TypeRepr() const override { return "jinja2.runtime.LoopContext object"; }
  std::string Repr() const override {
    return absl::StrCat("<LoopContext ", index0_ + 1, "/", items_.size(), ">");
  }
  std::optional<Value> GetAttr(std::string_view name) const override {
    const int64_t index0 = static_cast<int64_t>(index0_);
    const int64_t length = static_cast<int64_t>(items_.size());
    if (name == "index") return Value::Int(index0 + 1);
    if (name == "index0") return Value::Int(index0);
    if (name == "revindex") return Value::Int(length - index0);
    if (name == "revindex0") return Value::Int(length - index0 - 1);
    if (name == "first") return Value::Bool(index0 == 0);
    if (name == "last") return Value::Bool(index0 + 1 == length);
    if (name == "length") return Value::Int(length);
    if (name == "depth") return Value::Int(1);
    if (name == "depth0") return Value::Int(0);
    if (name == "previtem") {
      if (index0 == 0) return Value::Undefined("there is no previous item");
      return items_[index0_ - 1];
    }
    if (name == "nextitem") {
      if (index0 + 1 >= length) return Value::Undefined("there is no next item");
      return items_[index0_ + 1];
    }
    if (name == "cycle" || name == "changed") {
      return Value::MakeObject(std::make_shared<LoopMethod>(
          std::const_pointer_cast<LoopContext>(shared_from_this()), name == "cycle"));
    }
    return std::nullopt;
  }

 private:
  // loop.cycle(...) and loop.changed(...).
  class LoopMethod : public Object {
   public:
    LoopMethod(std::shared_ptr<LoopContext> loop, bool is_cycle)
        : loop_(std::move(loop)), is_cycle_(is_cycle) {}
    std::string TypeName() const override { return "method"; }
    std::string Repr() const override {
      return is_cycle_ ? "<bound method LoopContext.cycle>" : "<bound method LoopContext.changed>";
    }
    bool IsCallable() const override { return true; }
    absl::StatusOr<Value> Call(Renderer& renderer, const CallArgs& args) const override {
      if (!args.keyword.empty()) return RenderError("loop methods take no keyword arguments");
      if (is_cycle_) {
        if (args.positional.empty()) return RenderError("no items for cycling given");
        return args.positional[loop_->index0_ % args.positional.size()];
      }
      Value current = Value::MakeList(args.positional);
      if (loop_->has_last_changed_ && Equals(loop_->last_changed_, current)) {
        return Value::Bool(false);
      }
      loop_->last_changed_ = std::move(current);
      loop_->has_last_changed_ = true;
      return Value::Bool(true);
    }

   private:
    std::shared_ptr<LoopContext> loop_;
    bool is_cycle_;
  };

  std::vector<Value> items_;
  size_t index0_ = 0;
  Value last_changed_;
  bool has_last_changed_ = false;
};

absl::Status UnpackError(size_t expected, size_t got) {
  if (got < expected) {
    return RenderError(
        absl::StrCat("not enough values to unpack (expected ", expected, ", got ", got, ")"));
  }
  return RenderError(absl::StrCat("too many values to unpack (expected ", expected, ")"));
}

}  // namespace

const Value* Scope::Find(std::string_view name) const {
  for (const Scope* scope = this; scope != nullptr; scope = scope->parent_.get()) {
    for (const auto& [key, value] : scope->vars_) {
      if (key == name) return &value;
    }
  }
  return nullptr;
}

void Scope::Set(std::string_view name, Value value) {
  for (auto& [key, existing] : vars_) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

absl::StatusOr<std::string> Renderer::Render(const Program& program, const Value& context) {
  auto variables = std::make_shared<Scope>(nullptr);
  if (context.is_dict()) {
    for (const auto& [key, value] : context.dict().items()) {
      if (key.is_string()) variables->Set(key.as_string(), value);
    }
  }
  // Top-level {% set %}s go into a scope of their own above the context's variables.
  auto top = std::make_shared<Scope>(variables);
  Renderer renderer;
  std::string out;
  RETURN_IF_ERROR(renderer.RenderBody(program.body, top, &out).status());
  return out;
}

absl::Status Renderer::Locate(const absl::Status& status, int line) {
  if (located_ || IsTemplateRaised(status)) return status;
  located_ = true;
  return absl::InvalidArgumentError(LineMessage(line, absl::StrCat(status.message())));
}

absl::StatusOr<Renderer::Flow> Renderer::RenderBody(const Body& body, const ScopePtr& scope,
                                                    std::string* out) {
  for (const StmtPtr& stmt : body) {
    absl::StatusOr<Flow> flow = RenderStmt(*stmt, scope, out);
    if (!flow.ok()) return Locate(flow.status(), stmt->line);
    if (out->size() > kMaxOutputBytes) {
      return Locate(RenderError("the rendered template exceeds 256 MiB"), stmt->line);
    }
    if (*flow != Flow::kNormal) return *flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Renderer::Flow> Renderer::RenderStmt(const Stmt& stmt, const ScopePtr& scope,
                                                    std::string* out) {
  switch (stmt.kind) {
    case StmtKind::kText:
      out->append(static_cast<const TextStmt&>(stmt).text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      ASSIGN_OR_RETURN(Value value, Eval(*static_cast<const OutputStmt&>(stmt).expr, scope));
      out->append(Str(value));
      return Flow::kNormal;
    }
    case StmtKind::kIf: {
      const auto& s = static_cast<const IfStmt&>(stmt);
      for (const auto& [condition, body] : s.branches) {
        ASSIGN_OR_RETURN(Value test, Eval(*condition, scope));
        if (Truthy(test)) return RenderBody(body, scope, out);
      }
      return RenderBody(s.else_body, scope, out);
    }
    case StmtKind::kFor:
      RETURN_IF_ERROR(RenderFor(static_cast<const ForStmt&>(stmt), scope, out));
      return Flow::kNormal;
    case StmtKind::kSet: {
      const auto& s = static_cast<const SetStmt&>(stmt);
      ASSIGN_OR_RETURN(Value value, Eval(*s.value, scope));
      RETURN_IF_ERROR(Assign(s.target, value, *scope));
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock: {
      const auto& s = static_cast<const SetBlockStmt&>(stmt);
      std::string captured;
      RETURN_IF_ERROR(RenderBody(s.body, scope, &captured).status());
      Value value = Value::String(std::move(captured));
      if (s.filter != nullptr) {
        ASSIGN_OR_RETURN(value, ApplyBlockFilter(*s.filter, scope, value));
      }
      RETURN_IF_ERROR(Assign(s.target, value, *scope));
      return Flow::kNormal;
    }
    case StmtKind::kMacro: {
      const auto& s = static_cast<const MacroStmt&>(stmt);
      scope->Set(s.macro->name, Value::MakeObject(std::make_shared<Macro>(s.macro, scope)));
      return Flow::kNormal;
    }
    case StmtKind::kCallBlock:
      RETURN_IF_ERROR(RenderCallBlock(static_cast<const CallBlockStmt&>(stmt), scope, out));
      return Flow::kNormal;
    case StmtKind::kFilterBlock: {
      const auto& s = static_cast<const FilterBlockStmt&>(stmt);
      std::string captured;
      RETURN_IF_ERROR(RenderBody(s.body, std::make_shared<Scope>(scope), &captured).status());
      ASSIGN_OR_RETURN(Value value,
                       ApplyBlockFilter(*s.filter, scope, Value::String(std::move(captured))));
      out->append(Str(value));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      const auto& s = static_cast<const WithStmt&>(stmt);
      std::vector<Value> values;
      for (const auto& [target, expr] : s.assignments) {
        ASSIGN_OR_RETURN(Value value, Eval(*expr, scope));
        values.push_back(std::move(value));
      }
      auto inner = std::make_shared<Scope>(scope);
      for (size_t i = 0; i < values.size(); ++i) {
        RETURN_IF_ERROR(Assign(s.assignments[i].first, values[i], *inner));
      }
      RETURN_IF_ERROR(RenderBody(s.body, inner, out).status());
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
  }
  return RenderError("unknown statement");
}

absl::Status Renderer::RenderFor(const ForStmt& stmt, const ScopePtr& scope, std::string* out) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.iterable, scope));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
  if (stmt.filter != nullptr) {
    // `for x in xs if cond`: the condition sees the loop variables, not `loop`.
    std::vector<Value> kept;
    for (Value& item : items) {
      auto probe = std::make_shared<Scope>(scope);
      RETURN_IF_ERROR(Assign(stmt.target, item, *probe));
      ASSIGN_OR_RETURN(Value keep, Eval(*stmt.filter, probe));
      if (Truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  auto loop = std::make_shared<LoopContext>(items);
  const Value loop_value = Value::MakeObject(loop);
  // jinja2 runs `else` unless some iteration reached the end of the body.
  bool completed_an_iteration = false;
  for (size_t i = 0; i < items.size(); ++i) {
    loop->set_index0(i);
    auto iteration = std::make_shared<Scope>(scope);
    RETURN_IF_ERROR(Assign(stmt.target, items[i], *iteration));
    iteration->Set("loop", loop_value);
    ASSIGN_OR_RETURN(Flow flow, RenderBody(stmt.body, iteration, out));
    if (flow == Flow::kBreak) break;
    if (flow == Flow::kNormal) completed_an_iteration = true;
  }
  if (!completed_an_iteration && !stmt.else_body.empty()) {
    RETURN_IF_ERROR(RenderBody(stmt.else_body, std::make_shared<Scope>(scope), out).status());
  }
  return absl::OkStatus();
}

absl::Status Renderer::RenderCallBlock(const CallBlockStmt& stmt, const ScopePtr& scope,
                                       std::string* out) {
  ASSIGN_OR_RETURN(Value callee, Eval(*stmt.call->callee, scope));
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(stmt.call->args, scope));
  const Value caller = Value::MakeObject(std::make_shared<Macro>(stmt.caller, scope));
  Value result;
  if (callee.is_object()) {
    if (auto* macro = dynamic_cast<Macro*>(&callee.object())) {
      ASSIGN_OR_RETURN(result, macro->CallWithCaller(*this, args, caller));
      out->append(Str(result));
      return absl::OkStatus();
    }
  }
  args.keyword.emplace_back("caller", caller);
  ASSIGN_OR_RETURN(result, Call(callee, args));
  out->append(Str(result));
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::CallMacro(const MacroDef& macro, std::shared_ptr<Scope> closure,
                                          const CallArgs& args, const Value& caller) {
  if (call_depth_ >= kMaxCallDepth) {
    return RenderError("maximum recursion depth exceeded in macro calls");
  }
  auto scope = std::make_shared<Scope>(std::move(closure));
  const size_t n = macro.params.size();
  if (args.positional.size() > n && !macro.uses_varargs) {
    return RenderError(
        absl::StrCat("macro '", macro.name, "' takes not more than ", n, " argument(s)"));
  }
  std::vector<std::optional<Value>> bound(n);
  for (size_t i = 0; i < n && i < args.positional.size(); ++i) bound[i] = args.positional[i];
  Dict extra_kwargs;
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < n && macro.params[i].name != name) ++i;
    if (i < n) {
      if (bound[i].has_value()) {
        return RenderError(
            absl::StrCat("macro '", macro.name, "' got multiple values for argument '", name, "'"));
      }
      bound[i] = value;
    } else if (name == "caller" && macro.uses_caller) {
      return RenderError(absl::StrCat("macro '", macro.name,
                                      "' was invoked with two values for the special caller "
                                      "argument. This is most likely a bug."));
    } else if (macro.uses_kwargs) {
      extra_kwargs.Set(Value::String(name), value);
    } else {
      return RenderError(
          absl::StrCat("macro '", macro.name, "' takes no keyword argument '", name, "'"));
    }
  }
  if (!caller.is_undefined() && !macro.uses_caller) {
    return RenderError(absl::StrCat("macro '", macro.name,
                                    "' was invoked with two values for the special caller "
                                    "argument. This is most likely a bug."));
  }
  ++call_depth_;
  // Defaults are evaluated in the macro's scope, so they can use earlier parameters.
  for (size_t i = 0; i < n; ++i) {
    Value value;
    if (bound[i].has_value()) {
      value = *bound[i];
    } else if (macro.params[i].default_value != nullptr) {
      absl::StatusOr<Value> default_value = Eval(*macro.params[i].default_value, scope);
      if (!default_value.ok()) {
        --call_depth_;
        return default_value.status();
      }
      value = *std::move(default_value);
    } else {
      value =
          Value::Undefined(absl::StrCat("parameter '", macro.params[i].name, "' was not provided"));
    }
    scope->Set(macro.params[i].name, std::move(value));
  }
  if (macro.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = n; i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
    scope->Set("varargs", Value::MakeList(std::move(rest), List::Kind::kTuple));
  }
  if (macro.uses_kwargs) scope->Set("kwargs", Value::MakeDict(std::move(extra_kwargs)));
  if (macro.uses_caller) scope->Set("caller", caller);
  std::string out;
  absl::StatusOr<Flow> flow = RenderBody(macro.body, scope, &out);
  --call_depth_;
  if (!flow.ok()) return flow.status();
  return Value::String(std::move(out));
}

absl::Status Renderer::Assign(const AssignTarget& target, const Value& value, Scope& scope) {
  if (!target.attribute.empty()) {
    const Value* object = scope.Find(target.names[0]);
    Namespace* ns = nullptr;
    if (object != nullptr && object->is_object()) {
      ns = dynamic_cast<Namespace*>(&object->object());
    }
    if (ns == nullptr) return RenderError("cannot assign attribute on non-namespace object");
    ns->SetAttr(target.attribute, value);
    return absl::OkStatus();
  }
  if (!target.unpack) {
    scope.Set(target.names[0], value);
    return absl::OkStatus();
  }
  if (!value.is_string() && !value.is_list() && !value.is_dict() && !value.is_undefined()) {
    return RenderError(absl::StrCat("cannot unpack non-iterable ", TypeName(value), " object"));
  }
  ASSIGN_OR_RETURN(std::vector<Value> parts, Iterate(value));
  if (parts.size() != target.names.size()) return UnpackError(target.names.size(), parts.size());
  for (size_t i = 0; i < parts.size(); ++i) scope.Set(target.names[i], std::move(parts[i]));
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::ApplyBlockFilter(const Expr& filter, const ScopePtr& scope,
                                                 const Value& input) {
  const Value* saved = block_input_;
  block_input_ = &input;
  absl::StatusOr<Value> result = Eval(filter, scope);
  block_input_ = saved;
  return result;
}

absl::StatusOr<Value> Renderer::Eval(const Expr& expr, const ScopePtr& scope) {
  absl::StatusOr<Value> value = EvalUnlocated(expr, scope);
  if (!value.ok()) return Locate(value.status(), expr.line);
  return value;
}

absl::StatusOr<CallArgs> Renderer::EvalArgs(const Arguments& args, const ScopePtr& scope) {
  CallArgs out;
  for (const ExprPtr& arg : args.positional) {
    ASSIGN_OR_RETURN(Value value, Eval(*arg, scope));
    out.positional.push_back(std::move(value));
  }
  for (const auto& [name, arg] : args.keyword) {
    ASSIGN_OR_RETURN(Value value, Eval(*arg, scope));
    out.keyword.emplace_back(name, std::move(value));
  }
  return out;
}

absl::StatusOr<Value> Renderer::Call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_object() || !callee.object().IsCallable()) {
    return RenderError(absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }
  return callee.object().Call(*this, args);
}

absl::StatusOr<Value> Renderer::EvalUnlocated(const Expr& expr, const ScopePtr& scope) {
  switch (expr.kind) {
    case ExprKind::kLiteral:
      return static_cast<const LiteralExpr&>(expr).value;
    case ExprKind::kName: {
      const std::string& name = static_cast<const NameExpr&>(expr).name;
      if (const Value* value = scope->Find(name)) return *value;
      if (std::optional<Value> global = FindGlobal(name)) return *std::move(global);
      return Value::UndefinedName(name);
    }
    case ExprKind::kList: {
      const auto& e = static_cast<const ListExpr&>(expr);
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) {
        ASSIGN_OR_RETURN(Value value, Eval(*item, scope));
        items.push_back(std::move(value));
      }
      return Value::MakeList(std::move(items), e.is_tuple ? List::Kind::kTuple : List::Kind::kList);
    }
    case ExprKind::kDict: {
      Dict dict;
      for (const auto& [key_expr, value_expr] : static_cast<const DictExpr&>(expr).items) {
        ASSIGN_OR_RETURN(Value key, Eval(*key_expr, scope));
        ASSIGN_OR_RETURN(Value value, Eval(*value_expr, scope));
        if (!IsHashable(key)) {
          return RenderError(absl::StrCat("unhashable type: '", TypeName(key), "'"));
        }
        dict.Set(std::move(key), std::move(value));
      }
      return Value::MakeDict(std::move(dict));
    }
    case ExprKind::kGetAttr: {
      const auto& e = static_cast<const GetAttrExpr&>(expr);
      ASSIGN_OR_RETURN(Value object, Eval(*e.object, scope));
      return GetAttr(object, e.attribute);
    }
    case ExprKind::kGetItem: {
      const auto& e = static_cast<const GetItemExpr&>(expr);
      ASSIGN_OR_RETURN(Value object, Eval(*e.object, scope));
      ASSIGN_OR_RETURN(Value index, Eval(*e.index, scope));
      return GetItem(object, index);
    }
    case ExprKind::kSlice: {
      const auto& e = static_cast<const SliceExpr&>(expr);
      ASSIGN_OR_RETURN(Value object, Eval(*e.object, scope));
      Value parts[3] = {Value::None(), Value::None(), Value::None()};
      const ExprPtr* exprs[3] = {&e.start, &e.stop, &e.step};
      for (int i = 0; i < 3; ++i) {
        if (*exprs[i] != nullptr) {
          ASSIGN_OR_RETURN(parts[i], Eval(**exprs[i], scope));
        }
      }
      return Slice(object, parts[0], parts[1], parts[2]);
    }
    case ExprKind::kCall: {
      const auto& e = static_cast<const CallExpr&>(expr);
      ASSIGN_OR_RETURN(Value callee, Eval(*e.callee, scope));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
      return Call(callee, args);
    }
    case ExprKind::kFilter: {
      const auto& e = static_cast<const FilterExpr&>(expr);
      Value operand;
      if (e.operand != nullptr) {
        ASSIGN_OR_RETURN(operand, Eval(*e.operand, scope));
      } else if (block_input_ != nullptr) {
        operand = *block_input_;
      }
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
      return e.fn(operand, args);
    }
    case ExprKind::kTest: {
      const auto& e = static_cast<const TestExpr&>(expr);
      ASSIGN_OR_RETURN(Value operand, Eval(*e.operand, scope));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
      ASSIGN_OR_RETURN(bool passed, e.fn(operand, args));
      return Value::Bool(passed != e.negated);
    }
    case ExprKind::kUnary: {
      const auto& e = static_cast<const UnaryExpr&>(expr);
      ASSIGN_OR_RETURN(Value operand, Eval(*e.operand, scope));
      if (e.op == UnaryOp::kNot) return Value::Bool(!Truthy(operand));
      return UnaryArithmetic(operand, e.op == UnaryOp::kNegate);
    }
    case ExprKind::kBinary: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      ASSIGN_OR_RETURN(Value left, Eval(*e.left, scope));
      // `and` / `or` return an operand, not a bool, as in Python.
      if (e.op == BinaryOp::kAnd && !Truthy(left)) return left;
      if (e.op == BinaryOp::kOr && Truthy(left)) return left;
      ASSIGN_OR_RETURN(Value right, Eval(*e.right, scope));
      switch (e.op) {
        case BinaryOp::kAnd:
        case BinaryOp::kOr:
          return right;
        case BinaryOp::kConcat:
          return Value::String(Str(left) + Str(right));
        case BinaryOp::kArithmetic:
          return Arithmetic(e.arithmetic, left, right);
      }
      return RenderError("unknown operator");
    }
    case ExprKind::kCompare: {
      const auto& e = static_cast<const CompareExpr&>(expr);
      ASSIGN_OR_RETURN(Value left, Eval(*e.first, scope));
      for (const auto& [op, operand] : e.rest) {
        ASSIGN_OR_RETURN(Value right, Eval(*operand, scope));
        ASSIGN_OR_RETURN(bool holds, Compare(op, left, right));
        if (!holds) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case ExprKind::kConditional: {
      const auto& e = static_cast<const ConditionalExpr&>(expr);
      ASSIGN_OR_RETURN(Value condition, Eval(*e.condition, scope));
      if (Truthy(condition)) return Eval(*e.then_expr, scope);
      if (e.else_expr != nullptr) return Eval(*e.else_expr, scope);
      return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                           " evaluated to false and no else section was "
                                           "defined."));
    }
  }
  return RenderError("unknown expression");
}

}  // namespace conveyor::jinja
