#include "text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "text/jinja/lexer.h"

namespace conveyor::jinja {
namespace {

using Names = std::initializer_list<std::string_view>;

bool Contains(Names names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Tags jinja2 knows that chat templates have no use for and this interpreter lacks.
constexpr std::string_view kUnsupportedTags[] = {"block", "extends",    "include", "import",
                                                 "from",  "autoescape", "trans",   "do"};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::unique_ptr<Program>> Run() {
    auto program = std::make_unique<Program>();
    std::string end_tag;
    RETURN_IF_ERROR(ParseBody(&program->body, {}, &end_tag));
    return program;
  }

 private:
  struct OpenBlock {
    std::string tag;
    int line;
  };

  // ---- Token helpers ----

  const Token& Current() const { return tokens_[pos_]; }
  const Token& Peek() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return Current().kind == TokenKind::kOperator && Current().text == op;
  }
  bool IsName(std::string_view name) const {
    return Current().kind == TokenKind::kName && Current().text == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Advance();
    return true;
  }

  static std::string Describe(const Token& token) {
    switch (token.kind) {
      case TokenKind::kText:
        return "template data";
      case TokenKind::kVariableBegin:
        return "'{{'";
      case TokenKind::kVariableEnd:
        return "end of print statement";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kBlockEnd:
        return "end of statement block";
      case TokenKind::kName:
        return absl::StrCat("'", token.text, "'");
      case TokenKind::kString:
        return "string";
      case TokenKind::kInteger:
        return "integer";
      case TokenKind::kFloat:
        return "float";
      case TokenKind::kOperator:
        return absl::StrCat("'", token.text, "'");
      case TokenKind::kEnd:
        return "end of template";
    }
    return "token";
  }

  absl::Status Error(int line, std::string_view message) const {
    return absl::InvalidArgumentError(LineMessage(line, message));
  }
  absl::Status Unexpected(std::string_view expected) const {
    return Error(Current().line,
                 absl::StrCat("expected ", std::string(expected), ", got ", Describe(Current())));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Unexpected(absl::StrCat("'", std::string(op), "'"));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Current().kind != TokenKind::kName) return Unexpected("a name");
    std::string name = Current().text;
    Advance();
    return name;
  }
  absl::Status ExpectBlockEnd() {
    if (Current().kind != TokenKind::kBlockEnd) return Unexpected("end of statement block");
    Advance();
    return absl::OkStatus();
  }

  // ---- Statements ----

  // Parses statements into `body` until a block tag named in `end_tags`, whose name it
  // consumes and stores in `end_tag` (the caller parses the rest of that tag).
  absl::Status ParseBody(Body* body, Names end_tags, std::string* end_tag) {
    while (true) {
      const Token& token = Current();
      switch (token.kind) {
        case TokenKind::kText:
          body->push_back(std::make_unique<TextStmt>(token.line, token.text));
          Advance();
          break;
        case TokenKind::kVariableBegin: {
          const int line = token.line;
          Advance();
          ASSIGN_OR_RETURN(ExprPtr expr, ParseTuple(true, false, {}));
          if (Current().kind != TokenKind::kVariableEnd) return Unexpected("'}}'");
          Advance();
          body->push_back(std::make_unique<OutputStmt>(line, std::move(expr)));
          break;
        }
        case TokenKind::kBlockBegin: {
          Advance();
          if (Current().kind != TokenKind::kName) return Unexpected("a tag name");
          const std::string name = Current().text;
          if (Contains(end_tags, name)) {
            *end_tag = name;
            Advance();
            return absl::OkStatus();
          }
          RETURN_IF_ERROR(ParseStatement(body));
          break;
        }
        case TokenKind::kEnd:
          if (end_tags.size() == 0) return absl::OkStatus();
          return Error(token.line,
                       absl::StrCat("unexpected end of template: '{% ", open_.back().tag,
                                    " %}' from line ", open_.back().line,
                                    " is not closed (expected ", QuotedTags(end_tags), ")"));
        default:
          return Unexpected("template data or a tag");
      }
    }
  }

  static std::string QuotedTags(Names tags) {
    std::vector<std::string> quoted;
    for (std::string_view tag : tags) quoted.push_back(absl::StrCat("'", std::string(tag), "'"));
    return absl::StrJoin(quoted, " or ");
  }

  // Parses the block statement whose tag name is the current token.
  absl::Status ParseStatement(Body* body) {
    const std::string tag = Current().text;
    const int line = Current().line;
    Advance();
    if (tag == "for") return ParseFor(line, body);
    if (tag == "if") return ParseIf(line, body);
    if (tag == "set") return ParseSet(line, body);
    if (tag == "macro") return ParseMacro(line, body);
    if (tag == "call") return ParseCallBlock(line, body);
    if (tag == "filter") return ParseFilterBlock(line, body);
    if (tag == "with") return ParseWith(line, body);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) {
        return Error(line, absl::StrCat("'{% ", tag, " %}' outside a for loop"));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      body->push_back(std::make_unique<LoopControlStmt>(line, tag == "break"));
      return absl::OkStatus();
    }
    if (tag == "generation") {
      // transformers' AssistantTracker: the body renders as if the tags were not there.
      RETURN_IF_ERROR(ExpectBlockEnd());
      return ParseBlockBody(tag, line, body, {"endgeneration"});
    }
    for (std::string_view unsupported : kUnsupportedTags) {
      if (tag == unsupported) {
        return Error(line, absl::StrCat("the '{% ", tag, " %}' tag is not supported"));
      }
    }
    if (!open_.empty() && (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif")) {
      return Error(line, absl::StrCat("unexpected '{% ", tag, " %}' inside '{% ", open_.back().tag,
                                      " %}' from line ", open_.back().line));
    }
    return Error(line, absl::StrCat("unknown tag '", tag, "'"));
  }

  // Parses a body that ends with one of `end_tags` followed by `%}`.
  absl::Status ParseBlockBody(const std::string& tag, int line, Body* body, Names end_tags,
                              std::string* end_tag = nullptr) {
    open_.push_back({tag, line});
    std::string found;
    RETURN_IF_ERROR(ParseBody(body, end_tags, &found));
    open_.pop_back();
    if (end_tag != nullptr) *end_tag = found;
    return found == "else" || found == "elif" ? absl::OkStatus() : ExpectBlockEnd();
  }

  absl::Status ParseFor(int line, Body* body) {
    auto stmt = std::make_unique<ForStmt>(line);
    ASSIGN_OR_RETURN(stmt->target, ParseAssignTarget(/*with_namespace=*/false));
    if (!SkipName("in")) return Unexpected("'in'");
    ASSIGN_OR_RETURN(stmt->iterable, ParseTuple(false, false, {"recursive"}));
    if (SkipName("if")) {
      ASSIGN_OR_RETURN(stmt->filter, ParseExpression(true));
    }
    if (IsName("recursive")) return Error(line, "recursive for loops are not supported");
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ++loop_depth_;
    RETURN_IF_ERROR(ParseBlockBody("for", line, &stmt->body, {"endfor", "else"}, &end));
    --loop_depth_;
    if (end == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBlockBody("for", line, &stmt->else_body, {"endfor"}));
    }
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  absl::Status ParseIf(int line, Body* body) {
    auto stmt = std::make_unique<IfStmt>(line);
    while (true) {
      ASSIGN_OR_RETURN(ExprPtr condition, ParseTuple(false, false, {}));
      RETURN_IF_ERROR(ExpectBlockEnd());
      Body branch;
      std::string end;
      RETURN_IF_ERROR(ParseBlockBody("if", line, &branch, {"elif", "else", "endif"}, &end));
      stmt->branches.emplace_back(std::move(condition), std::move(branch));
      if (end == "elif") continue;
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        RETURN_IF_ERROR(ParseBlockBody("if", line, &stmt->else_body, {"endif"}));
      }
      break;
    }
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  absl::Status ParseSet(int line, Body* body) {
    ASSIGN_OR_RETURN(AssignTarget target, ParseAssignTarget(/*with_namespace=*/true));
    if (SkipOp("=")) {
      ASSIGN_OR_RETURN(ExprPtr value, ParseTuple(true, false, {}));
      RETURN_IF_ERROR(ExpectBlockEnd());
      body->push_back(std::make_unique<SetStmt>(line, std::move(target), std::move(value)));
      return absl::OkStatus();
    }
    if (target.unpack) return Error(line, "a block '{% set %}' assigns to one name");
    auto stmt = std::make_unique<SetBlockStmt>(line);
    stmt->target = std::move(target);
    if (IsOp("|")) {
      ASSIGN_OR_RETURN(stmt->filter, ParseFilters(nullptr, /*start_inline=*/false));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseBlockBody("set", line, &stmt->body, {"endset"}));
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  // Macro and caller parameters: (a, b=default, ...).
  absl::Status ParseSignature(MacroDef* macro) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!macro->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      const int line = Current().line;
      MacroParam param;
      ASSIGN_OR_RETURN(param.name, ExpectName());
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(param.default_value, ParseExpression(true));
      } else if (!macro->params.empty() && macro->params.back().default_value != nullptr) {
        return Error(line, "non-default argument follows default argument");
      }
      macro->params.push_back(std::move(param));
    }
    Advance();
    return absl::OkStatus();
  }

  // Parses a macro (or caller) body; names it mentions are recorded on `macro`.
  absl::Status ParseMacroBody(const std::string& tag, int line, MacroDef* macro,
                              std::string_view end_tag) {
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    macros_.push_back(macro);
    RETURN_IF_ERROR(ParseBlockBody(tag, line, &macro->body, {end_tag}));
    macros_.pop_back();
    loop_depth_ = saved_loop_depth;
    return absl::OkStatus();
  }

  absl::Status ParseMacro(int line, Body* body) {
    auto macro = std::make_shared<MacroDef>();
    ASSIGN_OR_RETURN(macro->name, ExpectName());
    RETURN_IF_ERROR(ParseSignature(macro.get()));
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseMacroBody("macro", line, macro.get(), "endmacro"));
    auto stmt = std::make_unique<MacroStmt>(line);
    stmt->macro = std::move(macro);
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  absl::Status ParseCallBlock(int line, Body* body) {
    auto caller = std::make_shared<MacroDef>();
    caller->name = "caller";
    if (IsOp("(")) RETURN_IF_ERROR(ParseSignature(caller.get()));
    ASSIGN_OR_RETURN(ExprPtr call, ParseExpression(true));
    if (call->kind != ExprKind::kCall) return Error(line, "'{% call %}' needs a macro call");
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseMacroBody("call", line, caller.get(), "endcall"));
    auto stmt = std::make_unique<CallBlockStmt>(line);
    stmt->call.reset(static_cast<CallExpr*>(call.release()));
    stmt->caller = std::move(caller);
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  absl::Status ParseFilterBlock(int line, Body* body) {
    auto stmt = std::make_unique<FilterBlockStmt>(line);
    ASSIGN_OR_RETURN(stmt->filter, ParseFilters(nullptr, /*start_inline=*/true));
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseBlockBody("filter", line, &stmt->body, {"endfilter"}));
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  absl::Status ParseWith(int line, Body* body) {
    auto stmt = std::make_unique<WithStmt>(line);
    while (Current().kind != TokenKind::kBlockEnd) {
      if (!stmt->assignments.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(AssignTarget target, ParseAssignTarget(/*with_namespace=*/false));
      RETURN_IF_ERROR(ExpectOp("="));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      stmt->assignments.emplace_back(std::move(target), std::move(value));
    }
    Advance();
    RETURN_IF_ERROR(ParseBlockBody("with", line, &stmt->body, {"endwith"}));
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  // `name`, `a, b`, `(a, b)`, or (with_namespace) `ns.attr`.
  absl::StatusOr<AssignTarget> ParseAssignTarget(bool with_namespace) {
    AssignTarget target;
    if (with_namespace && Current().kind == TokenKind::kName &&
        Peek().kind == TokenKind::kOperator && Peek().text == ".") {
      target.names.push_back(Current().text);
      Advance();
      Advance();
      ASSIGN_OR_RETURN(target.attribute, ExpectName());
      return target;
    }
    const bool parenthesized = SkipOp("(");
    while (true) {
      const int line = Current().line;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (name == "true" || name == "false" || name == "none" || name == "True" ||
          name == "False" || name == "None") {
        return Error(line, absl::StrCat("cannot assign to '", name, "'"));
      }
      target.names.push_back(std::move(name));
      if (!SkipOp(",")) break;
      target.unpack = true;
      if (Current().kind != TokenKind::kName || IsName("in")) break;
    }
    if (parenthesized) RETURN_IF_ERROR(ExpectOp(")"));
    return target;
  }

  // ---- Expressions (jinja2's grammar, lowest precedence first) ----

  bool IsTupleEnd(Names extra_end_names) const {
    const Token& t = Current();
    if (t.kind == TokenKind::kVariableEnd || t.kind == TokenKind::kBlockEnd ||
        t.kind == TokenKind::kEnd) {
      return true;
    }
    if (IsOp(")")) return true;
    return t.kind == TokenKind::kName && Contains(extra_end_names, t.text);
  }

  // Comma-separated expressions: one alone is itself, several (or a trailing comma) make
  // a tuple.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parentheses,
                                     Names extra_end_names) {
    const int line = Current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end_names)) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
      items.push_back(std::move(item));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return Unexpected("an expression");
    }
    auto tuple = std::make_unique<ListExpr>(line, /*is_tuple=*/true);
    tuple->items = std::move(items);
    return tuple;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    if (!with_condexpr) return ParseOr();
    const int line = Current().line;
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (SkipName("if")) {
      ASSIGN_OR_RETURN(ExprPtr condition, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      expr = std::make_unique<ConditionalExpr>(line, std::move(condition), std::move(expr),
                                               std::move(otherwise));
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const int line = Current().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kOr, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const int line = Current().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kAnd, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Current().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      return std::make_unique<UnaryExpr>(line, UnaryOp::kNot, std::move(operand));
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Current().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::unique_ptr<CompareExpr> compare;
    while (true) {
      CompareOp op;
      if (IsOp("==")) {
        op = CompareOp::kEq;
      } else if (IsOp("!=")) {
        op = CompareOp::kNe;
      } else if (IsOp("<")) {
        op = CompareOp::kLt;
      } else if (IsOp("<=")) {
        op = CompareOp::kLe;
      } else if (IsOp(">")) {
        op = CompareOp::kGt;
      } else if (IsOp(">=")) {
        op = CompareOp::kGe;
      } else if (IsName("in")) {
        op = CompareOp::kIn;
      } else if (IsName("not") && Peek().kind == TokenKind::kName && Peek().text == "in") {
        op = CompareOp::kNotIn;
        Advance();
      } else {
        break;
      }
      Advance();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (compare == nullptr) compare = std::make_unique<CompareExpr>(line, std::move(first));
      compare->rest.emplace_back(op, std::move(operand));
    }
    if (compare == nullptr) return first;
    return compare;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const int line = Current().line;
      const ArithmeticOp op = IsOp("+") ? ArithmeticOp::kAdd : ArithmeticOp::kSub;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kArithmetic, std::move(left),
                                          std::move(right), op);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      const int line = Current().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left =
          std::make_unique<BinaryExpr>(line, BinaryOp::kConcat, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const int line = Current().line;
      const ArithmeticOp op = IsOp("*")    ? ArithmeticOp::kMul
                              : IsOp("/")  ? ArithmeticOp::kDiv
                              : IsOp("//") ? ArithmeticOp::kFloorDiv
                                           : ArithmeticOp::kMod;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kArithmetic, std::move(left),
                                          std::move(right), op);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const int line = Current().line;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = std::make_unique<BinaryExpr>(line, BinaryOp::kArithmetic, std::move(left),
                                          std::move(right), ArithmeticOp::kPow);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    const int line = Current().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const UnaryOp op = IsOp("-") ? UnaryOp::kNegate : UnaryOp::kPlus;
      Advance();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = std::make_unique<UnaryExpr>(line, op, std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Current();
    const int line = token.line;
    switch (token.kind) {
      case TokenKind::kName: {
        const std::string& name = token.text;
        ExprPtr node;
        if (name == "true" || name == "True") {
          node = std::make_unique<LiteralExpr>(line, Value::Bool(true));
        } else if (name == "false" || name == "False") {
          node = std::make_unique<LiteralExpr>(line, Value::Bool(false));
        } else if (name == "none" || name == "None") {
          node = std::make_unique<LiteralExpr>(line, Value::None());
        } else {
          RecordName(name);
          node = std::make_unique<NameExpr>(line, name);
        }
        Advance();
        return node;
      }
      case TokenKind::kString: {
        // Adjacent string literals concatenate, as in Python.
        std::string value;
        while (Current().kind == TokenKind::kString) {
          value.append(Current().text);
          Advance();
        }
        return std::make_unique<LiteralExpr>(line, Value::String(std::move(value)));
      }
      case TokenKind::kInteger: {
        auto node = std::make_unique<LiteralExpr>(line, Value::Int(token.int_value));
        Advance();
        return node;
      }
      case TokenKind::kFloat: {
        auto node = std::make_unique<LiteralExpr>(line, Value::Float(token.float_value));
        Advance();
        return node;
      }
      case TokenKind::kOperator:
        if (token.text == "(") {
          Advance();
          ASSIGN_OR_RETURN(ExprPtr node, ParseTuple(true, true, {}));
          RETURN_IF_ERROR(ExpectOp(")"));
          return node;
        }
        if (token.text == "[") return ParseList();
        if (token.text == "{") return ParseDict();
        break;
      default:
        break;
    }
    return Error(line, absl::StrCat("unexpected ", Describe(token)));
  }

  absl::StatusOr<ExprPtr> ParseList() {
    auto list = std::make_unique<ListExpr>(Current().line, /*is_tuple=*/false);
    Advance();
    while (!IsOp("]")) {
      if (!list->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      list->items.push_back(std::move(item));
    }
    Advance();
    return list;
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    auto dict = std::make_unique<DictExpr>(Current().line);
    Advance();
    while (!IsOp("}")) {
      if (!dict->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      RETURN_IF_ERROR(ExpectOp(":"));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      dict->items.emplace_back(std::move(key), std::move(value));
    }
    Advance();
    return dict;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        ASSIGN_OR_RETURN(node, ParseFilters(std::move(node), /*start_inline=*/false));
      } else if (IsName("is")) {
        ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = Current().line;
    if (SkipOp(".")) {
      const Token& attr = Current();
      if (attr.kind == TokenKind::kName) {
        std::string name = attr.text;
        Advance();
        return std::make_unique<GetAttrExpr>(line, std::move(node), std::move(name));
      }
      if (attr.kind != TokenKind::kInteger) return Unexpected("a name or a number after '.'");
      auto index = std::make_unique<LiteralExpr>(attr.line, Value::Int(attr.int_value));
      Advance();
      return std::make_unique<GetItemExpr>(line, std::move(node), std::move(index));
    }
    Advance();  // '['
    std::vector<Subscript> subscripts;
    while (!IsOp("]")) {
      if (!subscripts.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(Subscript subscript, ParseSubscribed());
      subscripts.push_back(std::move(subscript));
    }
    Advance();
    if (subscripts.empty()) return Error(line, "empty subscript");
    if (subscripts.size() == 1 && subscripts[0].is_slice) {
      auto slice = std::make_unique<SliceExpr>(line);
      slice->object = std::move(node);
      slice->start = std::move(subscripts[0].start);
      slice->stop = std::move(subscripts[0].stop);
      slice->step = std::move(subscripts[0].step);
      return slice;
    }
    ExprPtr index;
    if (subscripts.size() == 1) {
      index = std::move(subscripts[0].start);
    } else {
      // x[a, b] subscripts with a tuple.
      auto tuple = std::make_unique<ListExpr>(line, /*is_tuple=*/true);
      for (Subscript& subscript : subscripts) {
        if (subscript.is_slice)
          return Error(line, "slices inside a tuple subscript are not supported");
        tuple->items.push_back(std::move(subscript.start));
      }
      index = std::move(tuple);
    }
    return std::make_unique<GetItemExpr>(line, std::move(node), std::move(index));
  }

  // One subscript: an expression (in `start`) or a slice start:stop:step.
  struct Subscript {
    bool is_slice = false;
    ExprPtr start, stop, step;
  };

  absl::StatusOr<Subscript> ParseSubscribed() {
    Subscript subscript;
    if (!IsOp(":")) {
      ASSIGN_OR_RETURN(subscript.start, ParseExpression(true));
      if (!IsOp(":")) return subscript;
    }
    Advance();  // ':'
    subscript.is_slice = true;
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(subscript.stop, ParseExpression(true));
    }
    if (SkipOp(":") && !IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(subscript.step, ParseExpression(true));
    }
    return subscript;
  }

  absl::Status ParseCallArgs(Arguments* args) {
    const int line = Current().line;
    RETURN_IF_ERROR(ExpectOp("("));
    bool need_comma = false;
    while (!IsOp(")")) {
      if (need_comma) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) {
        return Error(line, "*args and **kwargs in calls are not supported");
      }
      if (Current().kind == TokenKind::kName && Peek().kind == TokenKind::kOperator &&
          Peek().text == "=") {
        std::string name = Current().text;
        Advance();
        Advance();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args->keyword.emplace_back(std::move(name), std::move(value));
      } else {
        if (!args->keyword.empty()) {
          return Error(line, "positional argument follows keyword argument");
        }
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args->positional.push_back(std::move(value));
      }
      need_comma = true;
    }
    Advance();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto call = std::make_unique<CallExpr>(Current().line, std::move(callee));
    RETURN_IF_ERROR(ParseCallArgs(&call->args));
    return call;
  }

  // `|f|g(x)`; with start_inline the first filter has no leading '|' (`{% filter f %}`).
  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr node, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Advance();
      start_inline = false;
      const int line = Current().line;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (IsOp(".")) return Error(line, "dotted filter names are not supported");
      const FilterFn fn = FindFilter(name);
      if (fn == nullptr) return Error(line, absl::StrCat("no filter named '", name, "'"));
      auto filter = std::make_unique<FilterExpr>(line, std::move(node), std::move(name), fn);
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(&filter->args));
      node = std::move(filter);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    const int line = Current().line;
    Advance();  // 'is'
    const bool negated = SkipName("not");
    const int name_line = Current().line;
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    if (IsOp(".")) return Error(line, "dotted test names are not supported");
    const TestFn fn = FindTest(name);
    if (fn == nullptr) return Error(name_line, absl::StrCat("no test named '", name, "'"));
    auto test = std::make_unique<TestExpr>(line, std::move(node), std::move(name), fn, negated);
    const Token& t = Current();
    if (IsOp("(")) {
      RETURN_IF_ERROR(ParseCallArgs(&test->args));
    } else if ((t.kind == TokenKind::kName || t.kind == TokenKind::kString ||
                t.kind == TokenKind::kInteger || t.kind == TokenKind::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      // `x is divisibleby 3`: one argument without parentheses.
      if (IsName("is")) return Error(t.line, "tests cannot be chained with 'is'");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      test->args.positional.push_back(std::move(arg));
    }
    return test;
  }

  // Marks the innermost macro (or caller) body as using varargs/kwargs/caller.
  void RecordName(const std::string& name) {
    if (macros_.empty()) return;
    MacroDef* macro = macros_.back();
    if (name == "varargs") macro->uses_varargs = true;
    if (name == "kwargs") macro->uses_kwargs = true;
    if (name == "caller") macro->uses_caller = true;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::vector<OpenBlock> open_;
  std::vector<MacroDef*> macros_;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Program>> ParseTemplate(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).Run();
}

}  // namespace conveyor::jinja
