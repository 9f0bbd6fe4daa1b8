// Python str semantics over UTF-8 std::strings, for the Jinja interpreter.
//
// Templates see strings as sequences of code points (len, slicing, iteration), and apply
// Python's str methods to them. Strings are stored as UTF-8; these helpers decode on
// demand. Case mappings and character properties come from text/unicode.h (ICU), applied
// as CPython applies its own: full mappings, the Final_Sigma context in lower(), title(),
// capitalize() and swapcase(), isupper()/islower() false on a titlecase letter. The
// differential test (unicode_test.cc) checks every code point against Python's str
// methods, up to the Unicode version both know. isdigit() and friends stay ASCII.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace conveyor::jinja::text {

// Decodes `s`, which must be valid UTF-8 (IsValidUtf8).
std::u32string Decode(std::string_view s);
// Encodes code points as UTF-8: all of `s`, or s.substr(pos, count).
std::string Encode(std::u32string_view s);
std::string EncodeRange(std::u32string_view s, size_t pos,
                        size_t count = std::u32string_view::npos);
using ::conveyor::AppendUtf8;
bool IsValidUtf8(std::string_view s);
// Number of code points in valid UTF-8 `s`.
int64_t CodePointCount(std::string_view s);

// Python str.isspace() for one code point.
bool IsSpace(char32_t c);
// Python str.isprintable() for one code point (see the file comment).
bool IsPrintable(char32_t c);
bool IsCased(char32_t c);
bool IsLower(char32_t c);  // The Lowercase property.
bool IsUpper(char32_t c);  // The Uppercase property.
bool IsTitle(char32_t c);  // A titlecase letter (Lt): neither lower nor upper for Python.
bool IsAlpha(char32_t c);
bool IsDigit(char32_t c);
// \w in Python's re: letters, digits and underscore.
bool IsWordChar(char32_t c);

// str.upper(), str.lower(), str.title(), str.capitalize(), str.swapcase().
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Title(std::string_view s);
std::string Capitalize(std::string_view s);
std::string SwapCase(std::string_view s);

// str.strip/lstrip/rstrip: `chars` nullopt strips whitespace, else any of its code points.
std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
// str.split(sep, maxsplit) (sep nullopt: runs of whitespace) and str.rsplit.
std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
// str.splitlines(keepends=False): \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029.
std::vector<std::string> SplitLines(std::string_view s);
// str.replace(old, new, count); count < 0 replaces all. An empty `from` inserts `to`
// between code points, as Python does.
std::string Replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
// str.count(sub): non-overlapping occurrences; an empty `sub` counts len(s) + 1.
int64_t Count(std::string_view s, std::string_view sub);
// str.find / str.rfind: code point index or -1.
int64_t Find(std::string_view s, std::string_view sub, bool reverse);

// A decimal float literal without sign ("1.5e3", "1_0.5" with the underscores removed),
// as Python reads it: values beyond the double range are inf or 0.0, not errors.
double ParseDecimalDouble(std::string_view digits);

// Python's repr() of a str: quotes and escapes chosen the way CPython chooses them.
std::string PyRepr(std::string_view s);

}  // namespace conveyor::jinja::text
