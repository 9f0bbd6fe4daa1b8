#include "text/hf_tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "text/unicode.h"

namespace conveyor::hf {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace

void AppendLossyUtf8(std::string_view bytes, std::string* out) {
  size_t run_start = 0;  // Start of the valid bytes not yet copied.
  for (size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const int n = Utf8CharLength(bytes, i);
    if (n > 0) {
      i += n;
      continue;
    }
    out->append(bytes.substr(run_start, i - run_start));
    out->append(kReplacementChar);
    i += -n;
    run_start = i;
  }
  out->append(bytes.substr(run_start));
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= '\t' && c <= '\r');
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0;
}

bool IsRegexWordChar(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) != 0 || c == '_';
  const auto u = static_cast<UChar32>(c);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) return std::ispunct(static_cast<int>(c)) != 0;
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_P_MASK) != 0;
}

bool IsMark(char32_t c) { return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_M_MASK) != 0; }

void AppendLowercase(std::string_view text, std::string* out) {
  for (size_t i = 0; i < text.size();) {
    const char32_t c = NextChar(text, &i);
    if (c < 0x80) {
      out->push_back(static_cast<char>(std::tolower(static_cast<int>(c))));
      continue;
    }
    // One character at a time, as Rust's char::to_lowercase: full mappings (İ becomes
    // two characters) but no context (a final Σ still becomes σ).
    std::u32string lower;
    unicode::AppendLower(c, &lower);
    for (char32_t l : lower) AppendUtf8(l, out);
  }
}

absl::Status Normalize(NormalForm form, std::string* text) {
  // ASCII is its own normal form in all four.
  bool ascii = true;
  for (const char ch : *text) ascii &= static_cast<unsigned char>(ch) < 0x80;
  if (ascii) return absl::OkStatus();
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU normalizer: ", u_errorName(status)));
  }
  // Text ICU finds normalized is normalized for HF too: its older tables (below) only
  // ever find less to do.
  if (normalizer->isNormalizedUTF8(*text, status) && U_SUCCESS(status)) return absl::OkStatus();
  status = U_ZERO_ERROR;
  // HF normalizes with Unicode 9.0 tables (its vendored unicode-normalization crate):
  // characters assigned since are inert there (no decomposition, combining class 0, so
  // nothing reorders or composes across them). Normalizing the runs between them and
  // keeping them as they are reproduces that exactly; older characters' mappings are
  // stable across Unicode versions.
  const auto newer_than_hf = [](char32_t c) {
    UVersionInfo age;
    u_charAge(static_cast<UChar32>(c), age);
    return age[0] > 9;
  };
  std::string normalized;
  normalized.reserve(text->size() + text->size() / 4);
  icu::StringByteSink<std::string> sink(&normalized);
  const std::string_view all = *text;
  size_t run = 0;  // Start of the run of characters HF's tables know.
  const auto flush = [&](size_t end) {
    if (end > run) {
      normalizer->normalizeUTF8(0,
                                icu::StringPiece(all.data() + run, static_cast<int32_t>(end - run)),
                                sink, nullptr, status);
    }
  };
  for (size_t i = 0; i < all.size() && U_SUCCESS(status);) {
    const size_t begin = i;
    const char32_t c = NextChar(all, &i);
    if (c < 0x80 || !newer_than_hf(c)) continue;
    flush(begin);
    normalized.append(all.substr(begin, i - begin));
    run = i;
  }
  flush(all.size());
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU normalization failed: ", u_errorName(status)));
  }
  *text = std::move(normalized);
  return absl::OkStatus();
}

// --- Regex -----------------------------------------------------------------------------

absl::StatusOr<std::string> OnigurumaToPcre2(std::string_view pattern) {
  // Oniguruma's Unicode classes, spelled for PCRE2 (whose \s, \w and \h mean other sets):
  // \s is White_Space; \w is Alphabetic, marks, decimal digits, connector punctuation and,
  // from its Latin-1 table, the superscripts and fractions ² ³ ¹ ¼ ½ ¾ (measured with
  // `tokenizers`; hf_tokenizer_test sweeps every code point); \h is a hex digit.
  constexpr std::string_view kSpace = "\\p{White_Space}";
  constexpr std::string_view kNotSpace = "\\P{White_Space}";
  constexpr std::string_view kWord =
      "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
  constexpr std::string_view kHex = "0-9a-fA-F";
  const auto unsupported = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", AsAbsl(pattern), "\": ", AsAbsl(what), " is not supported"));
  };
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  size_t class_start = 0;  // Offset in `pattern` just past the class's '[' (and '^').
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      switch (e) {
        case 's':
          out.append(kSpace);
          i += 2;
          continue;
        case 'S':
          out.append(kNotSpace);
          i += 2;
          continue;
        case 'w':
          absl::StrAppend(&out, in_class ? "" : "[", AsAbsl(kWord), in_class ? "" : "]");
          i += 2;
          continue;
        case 'W':
          if (in_class) return unsupported("\\W inside a character class");
          absl::StrAppend(&out, "[^", AsAbsl(kWord), "]");
          i += 2;
          continue;
        case 'h':
          absl::StrAppend(&out, in_class ? "" : "[", AsAbsl(kHex), in_class ? "" : "]");
          i += 2;
          continue;
        case 'H':
          if (in_class) return unsupported("\\H inside a character class");
          absl::StrAppend(&out, "[^", AsAbsl(kHex), "]");
          i += 2;
          continue;
        case 'u':
          if (i + 6 <= pattern.size() && pattern.substr(i + 2, 4).find_first_not_of(
                                             "0123456789abcdefABCDEF") == std::string_view::npos) {
            absl::StrAppend(&out, "\\x{", AsAbsl(pattern.substr(i + 2, 4)), "}");
            i += 6;
            continue;
          }
          break;
        default:
          break;
      }
      // Any other escape means the same in both: copy it whole (its character may be
      // multi-byte).
      const size_t n = 1 + CharSize(static_cast<unsigned char>(e));
      out.append(pattern.substr(i, n));
      i += n;
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out.push_back(c);
        ++i;
        if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
        class_start = i;
        continue;
      }
    } else {
      if (c == ']' && i != class_start) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < pattern.size() && pattern[i + 1] == ':') {
          const size_t end = pattern.find(":]", i + 2);
          if (end == std::string_view::npos) return unsupported("an unterminated [: class");
          out.append(pattern.substr(i, end + 2 - i));
          i = end + 2;
          continue;
        }
        return unsupported("a nested character class");
      } else if (c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&') {
        return unsupported("class intersection (&&)");
      }
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

namespace {

// Per-thread PCRE2 scratch: match data for the whole-match offsets, and a JIT stack large
// enough for long runs of one class (e.g. \s+(?!\S) over megabytes of spaces).
struct MatchScratch {
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* stack;
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern) {
  absl::StatusOr<std::string> translated = OnigurumaToPcre2(pattern);
  if (!translated.ok()) return translated.status();
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", AsAbsl(pattern), "\" (as PCRE2 \"", *translated,
                     "\"): ", reinterpret_cast<const char*>(message), " at offset ", error_offset));
  }
  std::shared_ptr<Regex> regex(new Regex());
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  regex->pcre_pattern_ = *std::move(translated);
  return regex;
}

std::shared_ptr<const Regex> Regex::Literal(std::string_view text) {
  std::shared_ptr<Regex> regex(new Regex());
  regex->literal_ = std::string(text);
  return regex;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

absl::StatusOr<bool> Regex::Search(std::string_view text, size_t from, Match* match) const {
  if (code_ == nullptr) {
    const size_t at = text.find(literal_, from);
    if (at == std::string_view::npos) return false;
    *match = {at, at + literal_.size()};
    return true;
  }
  MatchScratch& scratch = Scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const auto* code = static_cast<const pcre2_code*>(code_);
  // The pipeline checks UTF-8 once where text comes in; no need to check it per match.
  const int rc =
      jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, scratch.data, scratch.context)
           : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, scratch.data,
                         scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    return absl::ResourceExhaustedError(absl::StrCat(
        "regex \"", pcre_pattern_, "\" failed: ", reinterpret_cast<const char*>(message)));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
  *match = {ovector[0], ovector[1]};
  return true;
}

absl::Status Regex::FindAll(std::string_view text, std::vector<Match>* matches) const {
  matches->clear();
  // Oniguruma's find_iter: search from the end of the previous match; an empty match
  // right where the previous match ended is skipped by moving the search one character on.
  size_t from = 0;
  bool have_previous = false;
  size_t previous_end = 0;
  while (from <= text.size()) {
    Match match;
    absl::StatusOr<bool> found = Search(text, from, &match);
    if (!found.ok()) return found.status();
    if (!*found) break;
    if (match.first == match.second && have_previous && previous_end == match.second) {
      from += from < text.size() ? CharSize(static_cast<unsigned char>(text[from])) : 1;
      continue;
    }
    from = match.second;
    have_previous = true;
    previous_end = match.second;
    matches->push_back(match);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::hf
