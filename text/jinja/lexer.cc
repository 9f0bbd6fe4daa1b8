#include "text/jinja/lexer.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "text/jinja/text.h"

namespace conveyor::jinja {
namespace {

bool IsAsciiDigit(char32_t c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char32_t c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= 0x80 && text::IsAlpha(c));
}
bool IsNameChar(char32_t c) { return IsNameStart(c) || IsAsciiDigit(c); }
int HexDigit(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

// jinja2 normalises every newline sequence to "\n" and, without keep_trailing_newline,
// drops one trailing newline before lexing.
std::u32string Preprocess(std::string_view source) {
  const std::u32string in = text::Decode(source);
  std::u32string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out.push_back(in[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::u32string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const size_t at = FindTagStart(pos_);
      if (at == std::u32string::npos) {
        EmitText(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char32_t kind = src_[at + 1];
      size_t after = at + 2;
      char32_t sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) {
        sign = src_[after];
        ++after;
      }
      size_t raw_body = 0;
      const bool is_raw = kind == '%' && MatchRawBegin(after, &raw_body);
      std::u32string data = src_.substr(pos_, at - pos_);
      StripBeforeTag(&data, sign, /*lstrip_applies=*/kind != '{', LineStarting(pos_));
      EmitText(data, pos_);
      absl::Status status;
      if (kind == '#') {
        status = SkipComment(at, after);
      } else if (is_raw) {
        status = LexRaw(at, raw_body);
      } else {
        status = LexTag(kind, at, after);
      }
      if (!status.ok()) return status;
    }
    tokens_.push_back(Token{TokenKind::kEnd, "", 0, 0, LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) -
                            line_starts_.begin());
  }
  bool At(size_t pos, std::u32string_view s) const {
    return pos + s.size() <= src_.size() && src_.compare(pos, s.size(), s) == 0;
  }
  bool LineStarting(size_t pos) const { return pos == 0 || src_[pos - 1] == '\n'; }
  size_t SkipSpace(size_t pos) const {
    while (pos < src_.size() && text::IsSpace(src_[pos])) ++pos;
    return pos;
  }
  absl::Status Error(size_t pos, std::string_view message) const {
    return absl::InvalidArgumentError(LineMessage(LineAt(pos), message));
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::u32string::npos;
  }

  void EmitText(const std::u32string& data, size_t start) {
    if (data.empty()) return;
    tokens_.push_back(Token{TokenKind::kText, text::Encode(data), 0, 0, LineAt(start)});
  }

  // Whitespace control on the text before a tag: `-` strips all trailing whitespace;
  // otherwise lstrip_blocks removes the indentation before a block or comment tag that
  // is alone at the start of its line (unless the tag says `+`).
  static void StripBeforeTag(std::u32string* data, char32_t sign, bool lstrip_applies,
                             bool line_starting) {
    if (sign == '-') {
      while (!data->empty() && text::IsSpace(data->back())) data->pop_back();
      return;
    }
    if (sign == '+' || !lstrip_applies) return;
    const size_t newline = data->rfind('\n');
    const size_t line_start = newline == std::u32string::npos ? 0 : newline + 1;
    if (line_start == 0 && !line_starting) return;
    if (line_start == data->size()) return;
    for (size_t i = line_start; i < data->size(); ++i) {
      if (!text::IsSpace((*data)[i])) return;
    }
    data->resize(line_start);
  }

  // After a closing `%}` or `#}`: `-` strips all following whitespace, `+` nothing, and a
  // plain close drops one newline (trim_blocks).
  void AfterBlockClose(char32_t sign) {
    if (sign == '-') {
      pos_ = SkipSpace(pos_);
    } else if (sign == 0 && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  absl::Status SkipComment(size_t tag, size_t body) {
    const size_t close = src_.find(U"#}", body);
    if (close == std::u32string::npos) return Error(tag, "missing end of comment tag");
    char32_t sign = 0;
    if (close > body && (src_[close - 1] == '-' || src_[close - 1] == '+')) {
      sign = src_[close - 1];
    }
    pos_ = close + 2;
    AfterBlockClose(sign);
    return absl::OkStatus();
  }

  // `{% raw %}` (after the opening `{%` and its sign): jinja2 does not trim the newline
  // after it.
  bool MatchRawBegin(size_t pos, size_t* body) const {
    pos = SkipSpace(pos);
    if (!At(pos, U"raw")) return false;
    pos = SkipSpace(pos + 3);
    if (At(pos, U"-%}")) {
      *body = SkipSpace(pos + 3);
      return true;
    }
    if (At(pos, U"%}")) {
      *body = pos + 2;
      return true;
    }
    return false;
  }

  absl::Status LexRaw(size_t tag, size_t body) {
    for (size_t at = src_.find(U"{%", body); at != std::u32string::npos;
         at = src_.find(U"{%", at + 1)) {
      size_t p = at + 2;
      char32_t sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = SkipSpace(p);
      if (!At(p, U"endraw")) continue;
      p = SkipSpace(p + 6);
      char32_t close_sign = 0;
      if (At(p, U"+%}") || At(p, U"-%}")) {
        close_sign = src_[p];
        p += 3;
      } else if (At(p, U"%}")) {
        p += 2;
      } else {
        continue;
      }
      std::u32string data = src_.substr(body, at - body);
      StripBeforeTag(&data, sign, /*lstrip_applies=*/true, LineStarting(body));
      EmitText(data, body);
      pos_ = p;
      AfterBlockClose(close_sign);
      return absl::OkStatus();
    }
    return Error(tag, "missing end of raw directive");
  }

  absl::Status LexTag(char32_t kind, size_t tag, size_t pos) {
    const bool is_block = kind == '%';
    tokens_.push_back(Token{is_block ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, "", 0, 0,
                            LineAt(tag)});
    pos_ = pos;
    std::vector<char32_t> brackets;
    while (true) {
      if (pos_ >= src_.size()) {
        return Error(tag, is_block ? "unexpected end of template: '{%' is not closed"
                                   : "unexpected end of template: '{{' is not closed");
      }
      // A closing delimiter counts only outside brackets, as in jinja2.
      if (brackets.empty()) {
        const int line = LineAt(pos_);
        if (is_block && (At(pos_, U"+%}") || At(pos_, U"-%}") || At(pos_, U"%}"))) {
          const char32_t sign = src_[pos_] == '%' ? 0 : src_[pos_];
          pos_ += sign == 0 ? 2 : 3;
          tokens_.push_back(Token{TokenKind::kBlockEnd, "", 0, 0, line});
          AfterBlockClose(sign);
          return absl::OkStatus();
        }
        if (!is_block && (At(pos_, U"-}}") || At(pos_, U"}}"))) {
          const bool strip = src_[pos_] == '-';
          pos_ += strip ? 3 : 2;
          if (strip) pos_ = SkipSpace(pos_);
          tokens_.push_back(Token{TokenKind::kVariableEnd, "", 0, 0, line});
          return absl::OkStatus();
        }
      }
      const char32_t c = src_[pos_];
      if (text::IsSpace(c)) {
        ++pos_;
        continue;
      }
      absl::Status status;
      if (IsAsciiDigit(c)) {
        status = LexNumber();
      } else if (IsNameStart(c)) {
        const size_t start = pos_;
        while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
        tokens_.push_back(Token{TokenKind::kName, text::Encode(src_.substr(start, pos_ - start)), 0,
                                0, LineAt(start)});
      } else if (c == '\'' || c == '"') {
        status = LexString();
      } else {
        status = LexOperator(&brackets);
      }
      if (!status.ok()) return status;
    }
  }

  // The end of a run of digits with single underscores between them ((\d+_)*\d+), or
  // `pos` when there is none.
  size_t DigitRun(size_t pos) const {
    size_t end = pos;
    size_t p = pos;
    while (p < src_.size() && IsAsciiDigit(src_[p])) {
      while (p < src_.size() && IsAsciiDigit(src_[p])) ++p;
      end = p;
      if (p + 1 < src_.size() && src_[p] == '_' && IsAsciiDigit(src_[p + 1])) {
        ++p;
      } else {
        break;
      }
    }
    return end;
  }

  size_t ExponentEnd(size_t pos) const {
    if (pos >= src_.size() || (src_[pos] != 'e' && src_[pos] != 'E')) return pos;
    size_t p = pos + 1;
    if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
    const size_t end = DigitRun(p);
    return end == p ? pos : end;
  }

  absl::Status LexNumber() {
    const size_t start = pos_;
    const int line = LineAt(start);
    // Integers with a base prefix.
    if (src_[start] == '0' && start + 1 < src_.size()) {
      const char32_t p = src_[start + 1] | 0x20;
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (base != 0) {
        size_t i = start + 2;
        uint64_t value = 0;
        bool any = false;
        while (i < src_.size()) {
          if (src_[i] == '_' && i + 1 < src_.size() && HexDigit(src_[i + 1]) >= 0) {
            ++i;
            continue;
          }
          const int d = HexDigit(src_[i]);
          if (d < 0 || d >= base) break;
          if (value > (static_cast<uint64_t>(INT64_MAX) - d) / base) {
            return Error(start, "integer literal too large (integers are 64-bit here)");
          }
          value = value * base + d;
          any = true;
          ++i;
        }
        if (any) {
          pos_ = i;
          tokens_.push_back(Token{TokenKind::kInteger, "", static_cast<int64_t>(value), 0, line});
          return absl::OkStatus();
        }
      }
    }
    const size_t int_end = DigitRun(start);
    size_t end = int_end;
    bool is_float = false;
    // jinja2's float pattern has a (?<!\.) lookbehind: `foo.0.1` is not a float.
    if (start == 0 || src_[start - 1] != '.') {
      if (end < src_.size() && src_[end] == '.' && DigitRun(end + 1) > end + 1) {
        end = DigitRun(end + 1);
        is_float = true;
      }
      const size_t exp_end = ExponentEnd(end);
      if (exp_end != end) {
        end = exp_end;
        is_float = true;
      }
    }
    std::string digits;
    for (size_t i = start; i < end; ++i) {
      if (src_[i] != '_') digits.push_back(static_cast<char>(src_[i]));
    }
    pos_ = end;
    Token token{is_float ? TokenKind::kFloat : TokenKind::kInteger, digits, 0, 0, line};
    if (is_float) {
      token.float_value = text::ParseDecimalDouble(digits);
    } else {
      const auto result =
          std::from_chars(digits.data(), digits.data() + digits.size(), token.int_value);
      if (result.ec != std::errc()) {
        return Error(start, "integer literal too large (integers are 64-bit here)");
      }
    }
    tokens_.push_back(std::move(token));
    return absl::OkStatus();
  }

  // A string literal, decoded like Python's "unicode-escape" codec as jinja2 does.
  absl::Status LexString() {
    const size_t start = pos_;
    const char32_t quote = src_[start];
    std::u32string value;
    size_t i = start + 1;
    while (true) {
      if (i >= src_.size()) return Error(start, "unterminated string literal");
      const char32_t c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return Error(start, "unterminated string literal");
      const char32_t e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;  // Line continuation.
        case '\\':
        case '\'':
        case '"':
          value.push_back(e);
          break;
        case 'a':
          value.push_back(0x07);
          break;
        case 'b':
          value.push_back(0x08);
          break;
        case 'f':
          value.push_back(0x0C);
          break;
        case 'n':
          value.push_back('\n');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'v':
          value.push_back(0x0B);
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t code = 0;
          for (int k = 0; k < n; ++k) {
            const int d = i + k < src_.size() ? HexDigit(src_[i + k]) : -1;
            if (d < 0) return Error(start, "truncated \\x, \\u or \\U escape in a string");
            code = code * 16 + d;
          }
          i += n;
          if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
            return Error(start, "string escape is not a valid Unicode scalar value");
          }
          value.push_back(code);
          break;
        }
        case 'N':
          return Error(start, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t code = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              code = code * 8 + (src_[i++] - '0');
            }
            value.push_back(code);
          } else {
            // Python keeps an unknown escape as it is.
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    pos_ = i + 1;
    tokens_.push_back(Token{TokenKind::kString, text::Encode(value), 0, 0, LineAt(start)});
    return absl::OkStatus();
  }

  absl::Status LexOperator(std::vector<char32_t>* brackets) {
    static constexpr std::u32string_view kTwoChar[] = {U"//", U"**", U"==", U"!=", U">=", U"<="};
    static constexpr std::u32string_view kOneChar = U"+-/*%~[](){}><=.:|,;";
    const size_t start = pos_;
    const int line = LineAt(start);
    for (std::u32string_view op : kTwoChar) {
      if (At(pos_, op)) {
        pos_ += 2;
        tokens_.push_back(Token{TokenKind::kOperator, text::Encode(op), 0, 0, line});
        return absl::OkStatus();
      }
    }
    const char32_t c = src_[pos_];
    if (kOneChar.find(c) == std::u32string_view::npos) {
      std::string shown;
      text::AppendUtf8(c, &shown);
      return Error(start, absl::StrCat("unexpected character '", shown, "'"));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      const std::string shown(1, static_cast<char>(c));
      if (brackets->empty()) return Error(start, absl::StrCat("unexpected '", shown, "'"));
      if (brackets->back() != c) {
        return Error(start, absl::StrCat("unexpected '", shown, "', expected '",
                                         std::string(1, static_cast<char>(brackets->back())), "'"));
      }
      brackets->pop_back();
    }
    ++pos_;
    tokens_.push_back(
        Token{TokenKind::kOperator, std::string(1, static_cast<char>(c)), 0, 0, line});
    return absl::OkStatus();
  }

  std::u32string src_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::string LineMessage(int line, std::string_view message) {
  return absl::StrCat("chat template line ", line, ": ", std::string(message));
}

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  if (!text::IsValidUtf8(source)) {
    return absl::InvalidArgumentError("chat template is not valid UTF-8");
  }
  return Lexer(Preprocess(source)).Run();
}

}  // namespace conveyor::jinja
