// The syntax tree of a parsed chat template: expressions and statements, as parser.cc
// builds them and renderer.cc walks them.
//
// Nodes are plain structs tagged with their kind; every node records its template line
// for error messages. Filters and tests are resolved to their functions at parse time.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/builtins.h"
#include "text/jinja/operators.h"
#include "text/jinja/value.h"

namespace conveyor::jinja {

enum class ExprKind {
  kLiteral,
  kName,
  kList,  // also tuples
  kDict,
  kGetAttr,
  kGetItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kUnary,
  kBinary,
  kCompare,
  kConditional,
};

struct Expr {
  Expr(ExprKind kind, int line) : kind(kind), line(line) {}
  virtual ~Expr() = default;
  const ExprKind kind;
  const int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct LiteralExpr : Expr {
  LiteralExpr(int line, Value value) : Expr(ExprKind::kLiteral, line), value(std::move(value)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(int line, std::string name) : Expr(ExprKind::kName, line), name(std::move(name)) {}
  std::string name;
};

struct ListExpr : Expr {
  ListExpr(int line, bool is_tuple) : Expr(ExprKind::kList, line), is_tuple(is_tuple) {}
  std::vector<ExprPtr> items;
  bool is_tuple;
};

struct DictExpr : Expr {
  explicit DictExpr(int line) : Expr(ExprKind::kDict, line) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(int line, ExprPtr object, std::string attribute)
      : Expr(ExprKind::kGetAttr, line),
        object(std::move(object)),
        attribute(std::move(attribute)) {}
  ExprPtr object;
  std::string attribute;
};

struct GetItemExpr : Expr {
  GetItemExpr(int line, ExprPtr object, ExprPtr index)
      : Expr(ExprKind::kGetItem, line), object(std::move(object)), index(std::move(index)) {}
  ExprPtr object;
  ExprPtr index;
};

// object[start:stop:step]; omitted parts are null.
struct SliceExpr : Expr {
  explicit SliceExpr(int line) : Expr(ExprKind::kSlice, line) {}
  ExprPtr object, start, stop, step;
};

struct CallExpr : Expr {
  CallExpr(int line, ExprPtr callee) : Expr(ExprKind::kCall, line), callee(std::move(callee)) {}
  ExprPtr callee;
  Arguments args;
};

// operand|name(args). `operand` is null in `{% filter %}` and `{% set x | f %}` chains,
// where the block's output is the operand.
struct FilterExpr : Expr {
  FilterExpr(int line, ExprPtr operand, std::string name, FilterFn fn)
      : Expr(ExprKind::kFilter, line), operand(std::move(operand)), name(std::move(name)), fn(fn) {}
  ExprPtr operand;
  std::string name;
  FilterFn fn;
  Arguments args;
};

struct TestExpr : Expr {
  TestExpr(int line, ExprPtr operand, std::string name, TestFn fn, bool negated)
      : Expr(ExprKind::kTest, line),
        operand(std::move(operand)),
        name(std::move(name)),
        fn(fn),
        negated(negated) {}
  ExprPtr operand;
  std::string name;
  TestFn fn;
  bool negated;
  Arguments args;
};

enum class UnaryOp { kNot, kNegate, kPlus };
struct UnaryExpr : Expr {
  UnaryExpr(int line, UnaryOp op, ExprPtr operand)
      : Expr(ExprKind::kUnary, line), op(op), operand(std::move(operand)) {}
  UnaryOp op;
  ExprPtr operand;
};

// Arithmetic (operators.h), `~`, and the short-circuit `and` / `or`.
enum class BinaryOp { kArithmetic, kConcat, kAnd, kOr };
struct BinaryExpr : Expr {
  BinaryExpr(int line, BinaryOp op, ExprPtr left, ExprPtr right,
             ArithmeticOp arithmetic = ArithmeticOp::kAdd)
      : Expr(ExprKind::kBinary, line),
        op(op),
        arithmetic(arithmetic),
        left(std::move(left)),
        right(std::move(right)) {}
  BinaryOp op;
  ArithmeticOp arithmetic;  // For kArithmetic.
  ExprPtr left, right;
};

// first op1 x op2 y ...: Python's chained comparison.
struct CompareExpr : Expr {
  CompareExpr(int line, ExprPtr first) : Expr(ExprKind::kCompare, line), first(std::move(first)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

// then_expr if condition else else_expr; else_expr may be null (an undefined result).
struct ConditionalExpr : Expr {
  ConditionalExpr(int line, ExprPtr condition, ExprPtr then_expr, ExprPtr else_expr)
      : Expr(ExprKind::kConditional, line),
        condition(std::move(condition)),
        then_expr(std::move(then_expr)),
        else_expr(std::move(else_expr)) {}
  ExprPtr condition, then_expr, else_expr;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
};

struct Stmt {
  Stmt(StmtKind kind, int line) : kind(kind), line(line) {}
  virtual ~Stmt() = default;
  const StmtKind kind;
  const int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// Where an assignment goes: one name, several names to unpack into, or a namespace
// attribute (`ns.attr`).
struct AssignTarget {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attribute;  // Non-empty for `names[0].attribute`.
};

struct TextStmt : Stmt {
  TextStmt(int line, std::string text) : Stmt(StmtKind::kText, line), text(std::move(text)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(int line, ExprPtr expr) : Stmt(StmtKind::kOutput, line), expr(std::move(expr)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int line) : Stmt(StmtKind::kIf, line) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif.
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int line) : Stmt(StmtKind::kFor, line) {}
  AssignTarget target;
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`; may be null.
  Body body;
  Body else_body;
};

struct SetStmt : Stmt {
  SetStmt(int line, AssignTarget target, ExprPtr value)
      : Stmt(StmtKind::kSet, line), target(std::move(target)), value(std::move(value)) {}
  AssignTarget target;
  ExprPtr value;
};

// {% set x | filters %}body{% endset %}: `filter` is a chain whose innermost operand is
// null (the body), or null when there is no filter.
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int line) : Stmt(StmtKind::kSetBlock, line) {}
  AssignTarget target;
  ExprPtr filter;
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // May be null.
};

// A macro, or the body of a {% call %} block (the `caller` it passes).
struct MacroDef {
  std::string name;
  std::vector<MacroParam> params;
  Body body;
  // Whether the body mentions these names; jinja2 accepts extra positional or keyword
  // arguments, or a caller, only then.
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int line) : Stmt(StmtKind::kMacro, line) {}
  std::shared_ptr<const MacroDef> macro;
};

// {% call(params) callee(args) %}body{% endcall %}
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int line) : Stmt(StmtKind::kCallBlock, line) {}
  std::unique_ptr<CallExpr> call;
  std::shared_ptr<const MacroDef> caller;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int line) : Stmt(StmtKind::kFilterBlock, line) {}
  ExprPtr filter;  // A chain whose innermost operand is null (the body).
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int line) : Stmt(StmtKind::kWith, line) {}
  std::vector<std::pair<AssignTarget, ExprPtr>> assignments;
  Body body;
};

struct LoopControlStmt : Stmt {
  LoopControlStmt(int line, bool is_break)
      : Stmt(is_break ? StmtKind::kBreak : StmtKind::kContinue, line) {}
};

// A parsed template.
struct Program {
  Body body;
};

}  // namespace conveyor::jinja
