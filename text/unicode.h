// Unicode's case mappings and character properties: the one source for the text parts.
// Both the tokenizers (which follow Rust's `char`) and the chat-template interpreter (which
// follows Python's `str`) take them from here, and here they come from ICU, so the two
// cannot drift apart. What differs between Rust and Python (context, which mappings a
// method applies) is the callers'.
//
// Mappings are the full ones (SpecialCasing.txt's unconditional mappings: ß upper is SS,
// İ lower is i̇, ǆ title is ǅ) without context; the Final_Sigma rule is the caller's,
// which IsCased and IsCaseIgnorable serve.
#pragma once

#include <string>

namespace conveyor::unicode {

// The full lowercase, uppercase and titlecase mappings of `c`, appended to `out`.
void AppendLower(char32_t c, std::u32string* out);
void AppendUpper(char32_t c, std::u32string* out);
void AppendTitle(char32_t c, std::u32string* out);

// Derived core properties (DerivedCoreProperties.txt).
bool IsCased(char32_t c);
bool IsCaseIgnorable(char32_t c);
bool IsLowercase(char32_t c);
bool IsUppercase(char32_t c);

// General categories, by group.
enum class CategoryGroup {
  kLetter,       // Lu Ll Lt Lm Lo
  kMark,         // Mn Mc Me
  kNumber,       // Nd Nl No
  kPunctuation,  // P*
  kSymbol,       // S*
  kSeparator,    // Zs Zl Zp
  kOther,        // Cc Cf Cs Co Cn (controls, format, surrogates, private use, unassigned)
};
CategoryGroup GroupOf(char32_t c);
bool IsTitlecaseLetter(char32_t c);  // Lt

// The Unicode version of this data (ICU's), e.g. 15.0: as major * 100 + minor (1500).
int UnicodeVersion();
// The version that assigned `c` in the same form; 0 if it is unassigned.
int AgeOf(char32_t c);

}  // namespace conveyor::unicode
