#include "text/jinja/text.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "text/unicode.h"

namespace conveyor::jinja::text {
namespace {

// Python's lower_ucs4: the full lowercase of s[i], except that a capital sigma becomes
// final (ς) where Unicode's Final_Sigma context holds: after a cased letter (skipping
// case-ignorable ones) and not before one.
void AppendLower(const std::u32string& s, size_t i, std::u32string* out) {
  const char32_t c = s[i];
  if (c != 0x3A3) {
    unicode::AppendLower(c, out);
    return;
  }
  size_t j = i;
  while (j > 0 && unicode::IsCaseIgnorable(s[j - 1])) --j;
  bool final_sigma = j > 0 && unicode::IsCased(s[j - 1]);
  if (final_sigma) {
    size_t k = i + 1;
    while (k < s.size() && unicode::IsCaseIgnorable(s[k])) ++k;
    final_sigma = k == s.size() || !unicode::IsCased(s[k]);
  }
  out->push_back(final_sigma ? 0x3C2 : 0x3C3);
}

bool InStripSet(char32_t c, const std::optional<std::u32string>& chars) {
  if (!chars.has_value()) return IsSpace(c);
  return chars->find(c) != std::u32string::npos;
}

}  // namespace

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    // Well formed by contract; a truncated last character is not read past.
    if (i + CharSize(static_cast<unsigned char>(s[i])) > s.size()) break;
    out.push_back(NextChar(s, &i));
  }
  return out;
}

std::string Encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

std::string EncodeRange(std::u32string_view s, size_t pos, size_t count) {
  return Encode(s.substr(pos, count));
}

bool IsValidUtf8(std::string_view s) { return FindInvalidUtf8(s) == std::string_view::npos; }

int64_t CodePointCount(std::string_view s) {
  int64_t n = 0;
  for (char ch : s) {
    if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80) ++n;
  }
  return n;
}

bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsPrintable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  const unicode::CategoryGroup group = unicode::GroupOf(c);
  return group != unicode::CategoryGroup::kOther && group != unicode::CategoryGroup::kSeparator;
}

bool IsLower(char32_t c) { return unicode::IsLowercase(c); }
bool IsUpper(char32_t c) { return unicode::IsUppercase(c); }
bool IsTitle(char32_t c) { return unicode::IsTitlecaseLetter(c); }
bool IsCased(char32_t c) { return unicode::IsCased(c); }

bool IsDigit(char32_t c) { return c >= '0' && c <= '9'; }

bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return unicode::GroupOf(c) == unicode::CategoryGroup::kLetter;
}

bool IsWordChar(char32_t c) { return IsAlpha(c) || IsDigit(c) || c == '_'; }

std::string Upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : Decode(s)) unicode::AppendUpper(c, &out);
  return Encode(out);
}

std::string Lower(std::string_view s) {
  const std::u32string in = Decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) AppendLower(in, i, &out);
  return Encode(out);
}

std::string Title(std::string_view s) {
  const std::u32string in = Decode(s);
  std::u32string out;
  bool previous_cased = false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (previous_cased) {
      AppendLower(in, i, &out);
    } else {
      unicode::AppendTitle(in[i], &out);
    }
    previous_cased = IsCased(in[i]);
  }
  return Encode(out);
}

std::string Capitalize(std::string_view s) {
  const std::u32string in = Decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0) {
      unicode::AppendTitle(in[i], &out);
    } else {
      AppendLower(in, i, &out);
    }
  }
  return Encode(out);
}

std::string SwapCase(std::string_view s) {
  const std::u32string in = Decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (IsUpper(in[i])) {
      AppendLower(in, i, &out);
    } else if (IsLower(in[i])) {
      unicode::AppendUpper(in[i], &out);
    } else {
      out.push_back(in[i]);
    }
  }
  return Encode(out);
}

std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  const std::u32string in = Decode(s);
  std::optional<std::u32string> set;
  if (chars.has_value()) set = Decode(*chars);
  size_t begin = 0, end = in.size();
  if (left) {
    while (begin < end && InStripSet(in[begin], set)) ++begin;
  }
  if (right) {
    while (end > begin && InStripSet(in[end - 1], set)) --end;
  }
  return EncodeRange(in, begin, end - begin);
}

std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep.has_value()) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  const std::u32string in = Decode(s);
  size_t i = 0;
  while (true) {
    while (i < in.size() && IsSpace(in[i])) ++i;
    if (i == in.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      // The rest, with its trailing whitespace stripped, is the last part.
      size_t end = in.size();
      while (end > i && IsSpace(in[end - 1])) --end;
      parts.push_back(EncodeRange(in, i, end - i));
      break;
    }
    const size_t begin = i;
    while (i < in.size() && !IsSpace(in[i])) ++i;
    parts.push_back(EncodeRange(in, begin, i - begin));
  }
  return parts;
}

std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep.has_value()) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  const std::u32string in = Decode(s);
  size_t i = in.size();
  while (true) {
    while (i > 0 && IsSpace(in[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t begin = 0;
      while (begin < i && IsSpace(in[begin])) ++begin;
      parts.push_back(EncodeRange(in, begin, i - begin));
      break;
    }
    const size_t end = i;
    while (i > 0 && !IsSpace(in[i - 1])) --i;
    parts.push_back(EncodeRange(in, i, end - i));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> SplitLines(std::string_view s) {
  const std::u32string in = Decode(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const char32_t c = in[i];
    const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C ||
                          (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) continue;
    lines.push_back(EncodeRange(in, start, i - start));
    if (c == '\r' && i + 1 < in.size() && in[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < in.size()) lines.push_back(EncodeRange(in, start));
  return lines;
}

std::string Replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    const std::u32string in = Decode(s);
    int64_t done = 0;
    for (char32_t c : in) {
      if (count < 0 || done < count) {
        out.append(to);
        ++done;
      }
      AppendUtf8(c, &out);
    }
    if (count < 0 || done < count) out.append(to);
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(to);
    start = at + from.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

int64_t Count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return CodePointCount(s) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) {
    ++n;
  }
  return n;
}

int64_t Find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t at = reverse ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return CodePointCount(s.substr(0, at));
}

double ParseDecimalDouble(std::string_view digits) {
  double d = 0;
  const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), d);
  if (result.ec == std::errc::result_out_of_range) {
    const bool tiny =
        digits.find("e-") != std::string_view::npos || digits.find("E-") != std::string_view::npos;
    return tiny ? 0.0 : HUGE_VAL;
  }
  return d;
}

std::string PyRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  static constexpr char kHex[] = "0123456789abcdef";
  for (char32_t c : Decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out.append("\\t");
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else {
      int digits;
      if (c <= 0xFF) {
        out.append("\\x");
        digits = 2;
      } else if (c <= 0xFFFF) {
        out.append("\\u");
        digits = 4;
      } else {
        out.append("\\U");
        digits = 8;
      }
      for (int k = digits - 1; k >= 0; --k) out.push_back(kHex[(c >> (4 * k)) & 0xF]);
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace conveyor::jinja::text
