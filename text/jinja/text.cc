#include "text/jinja/text.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace conveyor::jinja::text {
namespace {

// glibc's C.UTF-8 locale carries Unicode's simple case mappings for every script; it is
// used whatever the process locale is. Without it, the tables below cover the common
// European scripts.
locale_t Utf8Locale() {
  static const locale_t locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", nullptr);
  return locale;
}

// Simple one-to-one case pairs (the fallback tables cover Latin-1, Latin Extended-A,
// basic Greek and Cyrillic).
char32_t TableUpper(char32_t c);
char32_t TableLower(char32_t c);

char32_t SimpleUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (locale_t locale = Utf8Locale(); locale != nullptr) {
    return static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), locale));
  }
  return TableUpper(c);
}

char32_t SimpleLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (locale_t locale = Utf8Locale(); locale != nullptr) {
    return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), locale));
  }
  return TableLower(c);
}

char32_t TableUpper(char32_t c) {
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    const bool odd_is_lower = (c <= 0x137) || (c >= 0x14A && c <= 0x177);
    const bool even_is_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_is_lower && (c & 1)) return c - 1;
    if (even_is_lower && !(c & 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 0x20;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if (((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) && (c & 1)) return c - 1;
  return c;
}

char32_t TableLower(char32_t c) {
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    const bool even_is_upper = (c <= 0x137) || (c >= 0x14A && c <= 0x177);
    const bool odd_is_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (even_is_upper && !(c & 1) && c != 0x130) return c + 1;
    if (odd_is_upper && (c & 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) && !(c & 1)) return c + 1;
  return c;
}

// Lowercase letters that have no uppercase of their own (so SimpleUpper leaves them).
bool IsLowerWithoutUpper(char32_t c) {
  return c == 0xDF || c == 0x138 || c == 0x149 || c == 0x390 || c == 0x3B0;
}

void AppendUpper(char32_t c, std::u32string* out) {
  if (c == 0xDF) {
    out->append(U"SS");
  } else {
    out->push_back(SimpleUpper(c));
  }
}

// Title case of one code point (for title() and capitalize()): the upper case, except
// for ß and the Latin digraphs, whose title case is their middle form (ǅ, ǈ, ǋ, ǲ).
void AppendTitle(char32_t c, std::u32string* out) {
  if (c == 0xDF) {
    out->append(U"Ss");
  } else if (c >= 0x1C4 && c <= 0x1CC) {
    out->push_back(0x1C5 + 3 * ((c - 0x1C4) / 3));
  } else if (c >= 0x1F1 && c <= 0x1F3) {
    out->push_back(0x1F2);
  } else {
    out->push_back(SimpleUpper(c));
  }
}

void AppendLower(const std::u32string& s, size_t i, std::u32string* out) {
  const char32_t c = s[i];
  if (c == 0x130) {
    out->append(U"i\u0307");
  } else if (c == 0x3A3) {
    // Final sigma: Python lowers Σ to ς at the end of a word.
    const bool after_cased = i > 0 && IsCased(s[i - 1]);
    const bool before_cased = i + 1 < s.size() && IsCased(s[i + 1]);
    out->push_back(after_cased && !before_cased ? 0x3C2 : 0x3C3);
  } else {
    out->push_back(SimpleLower(c));
  }
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
    const unsigned char b = static_cast<unsigned char>(s[i]);
    char32_t c;
    int n;
    if (b < 0x80) {
      c = b;
      n = 1;
    } else if (b < 0xE0) {
      c = b & 0x1F;
      n = 2;
    } else if (b < 0xF0) {
      c = b & 0x0F;
      n = 3;
    } else {
      c = b & 0x07;
      n = 4;
    }
    for (int k = 1; k < n && i + k < s.size(); ++k) {
      c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    out.push_back(c);
    i += n;
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
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c >= 0x80 && c <= 0xA0) return false;  // C1 controls and no-break space.
  if (c == 0xAD) return false;               // Soft hyphen (format).
  if (c < 0x600) return true;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x1680 ||
      c == 0x180E) {
    return false;
  }
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000) {
    return false;
  }
  if ((c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFDD0 && c <= 0xFDEF) || c == 0xFEFF ||
      (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF) {
    return false;  // Surrogates, private use, noncharacters, format characters.
  }
  if (c == 0x110BD || (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A) ||
      c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) || c >= 0xF0000) {
    return false;
  }
  return true;
}

bool IsLower(char32_t c) {
  if (locale_t locale = Utf8Locale(); c >= 0x80 && locale != nullptr) {
    return iswlower_l(static_cast<wint_t>(c), locale) || IsLowerWithoutUpper(c);
  }
  return SimpleUpper(c) != c || IsLowerWithoutUpper(c);
}

bool IsUpper(char32_t c) {
  if (locale_t locale = Utf8Locale(); c >= 0x80 && locale != nullptr) {
    return iswupper_l(static_cast<wint_t>(c), locale);
  }
  return SimpleLower(c) != c || c == 0x130;
}

bool IsCased(char32_t c) { return IsLower(c) || IsUpper(c); }

bool IsDigit(char32_t c) { return c >= '0' && c <= '9'; }

bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (IsCased(c)) return true;
  if (c < 0x100) return c == 0xAA || c == 0xBA;  // The rest of Latin-1 is symbols.
  if (!IsPrintable(c) || IsSpace(c)) return false;
  if (locale_t locale = Utf8Locale(); locale != nullptr) {
    return iswalpha_l(static_cast<wint_t>(c), locale);
  }
  // Punctuation, symbol and emoji blocks; everything else (other scripts, CJK) counts as
  // letters, which is what \w and isalpha() see for the text chat templates handle.
  if ((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x2E00 && c <= 0x2E7F) ||
      (c >= 0x3000 && c <= 0x303F) || (c >= 0xFE30 && c <= 0xFE4F) ||
      (c >= 0xFF00 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) ||
      (c >= 0x1F000 && c <= 0x1FAFF)) {
    return false;
  }
  return true;
}

bool IsWordChar(char32_t c) { return IsAlpha(c) || IsDigit(c) || c == '_'; }

std::string Upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : Decode(s)) AppendUpper(c, &out);
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
      AppendTitle(in[i], &out);
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
      AppendTitle(in[i], &out);
    } else {
      AppendLower(in, i, &out);
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
