#include "text/unicode.h"

#include <unicode/casemap.h>
#include <unicode/uchar.h>
#include <unicode/utf16.h>

namespace conveyor::unicode {
namespace {

// ICU's case mappings work on UTF-16 strings; one character maps to at most three.
template <typename Map>
void AppendMapped(char32_t c, std::u32string* out, Map map) {
  UChar in[2];
  int32_t in_length = 0;
  U16_APPEND_UNSAFE(in, in_length, static_cast<UChar32>(c));
  UChar mapped[8];
  UErrorCode status = U_ZERO_ERROR;
  const int32_t length = map(in, in_length, mapped, 8, status);
  if (U_FAILURE(status)) {
    out->push_back(c);
    return;
  }
  for (int32_t k = 0; k < length;) {
    UChar32 m;
    U16_NEXT_UNSAFE(mapped, k, m);
    out->push_back(static_cast<char32_t>(m));
  }
}

int Version(const UVersionInfo v) { return v[0] * 100 + v[1]; }

}  // namespace

void AppendLower(char32_t c, std::u32string* out) {
  AppendMapped(c, out, [](const UChar* in, int32_t n, UChar* dst, int32_t cap, UErrorCode& s) {
    return icu::CaseMap::toLower("", 0, in, n, dst, cap, nullptr, s);
  });
}

void AppendUpper(char32_t c, std::u32string* out) {
  AppendMapped(c, out, [](const UChar* in, int32_t n, UChar* dst, int32_t cap, UErrorCode& s) {
    return icu::CaseMap::toUpper("", 0, in, n, dst, cap, nullptr, s);
  });
}

void AppendTitle(char32_t c, std::u32string* out) {
  // The character alone as one titlecased "word": no break iterator, no adjustment to a
  // later cased letter, nothing lowercased.
  AppendMapped(c, out, [](const UChar* in, int32_t n, UChar* dst, int32_t cap, UErrorCode& s) {
    return icu::CaseMap::toTitle(
        "", U_TITLECASE_WHOLE_STRING | U_TITLECASE_NO_BREAK_ADJUSTMENT | U_TITLECASE_NO_LOWERCASE,
        nullptr, in, n, dst, cap, nullptr, s);
  });
}

bool IsCased(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED); }
bool IsCaseIgnorable(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASE_IGNORABLE);
}
bool IsLowercase(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_LOWERCASE);
}
bool IsUppercase(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_UPPERCASE);
}

CategoryGroup GroupOf(char32_t c) {
  const uint32_t mask = U_GET_GC_MASK(static_cast<UChar32>(c));
  if (mask & U_GC_L_MASK) return CategoryGroup::kLetter;
  if (mask & U_GC_M_MASK) return CategoryGroup::kMark;
  if (mask & U_GC_N_MASK) return CategoryGroup::kNumber;
  if (mask & U_GC_P_MASK) return CategoryGroup::kPunctuation;
  if (mask & U_GC_S_MASK) return CategoryGroup::kSymbol;
  if (mask & U_GC_Z_MASK) return CategoryGroup::kSeparator;
  return CategoryGroup::kOther;
}

bool IsTitlecaseLetter(char32_t c) {
  return u_charType(static_cast<UChar32>(c)) == U_TITLECASE_LETTER;
}

int UnicodeVersion() {
  UVersionInfo v;
  u_getUnicodeVersion(v);
  return Version(v);
}

int AgeOf(char32_t c) {
  if (u_charType(static_cast<UChar32>(c)) == U_UNASSIGNED) return 0;
  UVersionInfo v;
  u_charAge(static_cast<UChar32>(c), v);
  return Version(v);
}

}  // namespace conveyor::unicode
