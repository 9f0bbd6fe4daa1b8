// Unicode text primitives for the HF tokenizer pipeline (hf_tokenizer.h): UTF-8 walking
// (NextChar and CharSize, from common/utf8.h),
// the character classes HF tokenizers takes from Rust's `char` and `regex` crate, the
// normalization forms, Rust's lossy UTF-8 decoding, and `Regex`, which runs the
// Oniguruma-syntax patterns of tokenizer.json files on PCRE2.
//
// Everything here must agree with what the `tokenizers` library does, character for
// character: the differential test (hf_tokenizer_test.cc) checks that, including each
// regex character class over every code point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/utf8.h"

namespace conveyor::hf {

// Debian's Abseil has its own string_view class; Abseil calls (StrCat, hash map lookups)
// get one of these.
inline absl::string_view AsAbsl(std::string_view text) { return {text.data(), text.size()}; }

// --- UTF-8 -----------------------------------------------------------------------------

// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence becomes one U+FFFD.
// (Not common/utf8.h's ValidUtf8, which replaces byte by byte.)
void AppendLossyUtf8(std::string_view bytes, std::string* out);

// --- Character classes, as Rust's `char` methods and `regex` crate define them ----------

bool IsWhitespace(char32_t c);     // char::is_whitespace (Unicode White_Space).
bool IsNumeric(char32_t c);        // char::is_numeric (Nd, Nl, No).
bool IsRegexWordChar(char32_t c);  // regex crate \w (Alphabetic, M, Nd, Pc, Join_Control).
bool IsPunctuation(char32_t c);    // ASCII punctuation or a P* category.
bool IsMark(char32_t c);           // M* categories (what StripAccents removes).

// Appends char::to_lowercase of every character of `text` (full mappings, no context).
void AppendLowercase(std::string_view text, std::string* out);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Replaces `*text` by its normal form `form` as HF computes it: with ICU, but with the
// characters assigned after Unicode 9.0 left alone, since HF's tables stop there.
// Characters and their properties elsewhere come from ICU (Unicode 15) and PCRE2 10.42
// (Unicode 14); `tokenizers` 0.23 runs Oniguruma with Unicode 16 tables, so a character
// first assigned in Unicode 15 or 16 may be classified differently. The differential
// test checks every character of Unicode 14.
absl::Status Normalize(NormalForm form, std::string* text);

// --- Regex -----------------------------------------------------------------------------

// Byte offsets [first, second) of one match.
using Match = std::pair<size_t, size_t>;

// A pattern as HF tokenizers runs it: an Oniguruma regex (its `SysRegex`) or a literal
// string, found left to right without overlaps as Oniguruma's find_iter does (an empty
// match right where the previous one ended is skipped). Regexes run on PCRE2 with JIT;
// the few escapes whose meaning differs between the two engines (\s \S \w \W \h \H \u)
// are rewritten to Oniguruma's meaning, and ^/$ match at line breaks as in Oniguruma.
// Thread-safe: matching keeps its scratch space per thread.
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern);
  static std::shared_ptr<const Regex> Literal(std::string_view text);
  ~Regex();

  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Replaces `*matches` with the matches in `text` (valid UTF-8). Fails only when PCRE2
  // runs out of resources.
  absl::Status FindAll(std::string_view text, std::vector<Match>* matches) const;

  // The Oniguruma pattern translated for PCRE2 (for tests and error messages).
  const std::string& pcre_pattern() const { return pcre_pattern_; }

 private:
  Regex() = default;
  // Finds the first match at or after `from`; false when there is none.
  absl::StatusOr<bool> Search(std::string_view text, size_t from, Match* match) const;

  std::string literal_;       // The text to find, when code_ is null.
  std::string pcre_pattern_;  // Empty for a literal.
  void* code_ = nullptr;      // pcre2_code_8*.
  bool jit_ = false;
};

// Rewrites an Oniguruma pattern for PCRE2 (see Regex). Exposed for tests.
absl::StatusOr<std::string> OnigurumaToPcre2(std::string_view pattern);

}  // namespace conveyor::hf
