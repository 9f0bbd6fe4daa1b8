// UTF-8 helpers: checking, repairing and encoding text that must be well formed (proto3
// `string` fields, tokenizer input, template values). Well formed means RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace conveyor {

// How many bytes from text[i] on form one well-formed character (> 0), or, negated, how
// many form the longest prefix of one before it goes wrong (the "maximal subpart" that
// decoders replace with one U+FFFD; at least 1). `i` must be < text.size().
int Utf8CharLength(std::string_view text, size_t i);

// The first offset at or after `i` whose byte is not a continuation byte (10xxxxxx), or
// text.size(): where a cut that may have landed inside a character can start instead.
size_t NextCharStart(std::string_view text, size_t i);

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t FindInvalidUtf8(std::string_view text);

// Returns `text` with every byte of an ill-formed sequence replaced by U+FFFD;
// well-formed text comes back unchanged.
std::string ValidUtf8(std::string_view text);

// Appends the UTF-8 encoding of code point `c` (<= U+10FFFF).
void AppendUtf8(char32_t c, std::string* out);

// Walking text already checked to be well formed (the one decoder of the text parts):

// Decodes the character at `text[*i]` and advances `*i` past it. `text` must be valid
// UTF-8 (checked once where text enters the pipeline).
inline char32_t NextChar(std::string_view text, size_t* i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = b(*i);
  if (c < 0x80) {
    *i += 1;
    return c;
  }
  if (c < 0xE0) {
    const char32_t r = (char32_t{c} & 0x1F) << 6 | (b(*i + 1) & 0x3F);
    *i += 2;
    return r;
  }
  if (c < 0xF0) {
    const char32_t r =
        (char32_t{c} & 0x0F) << 12 | (char32_t{b(*i + 1)} & 0x3F) << 6 | (b(*i + 2) & 0x3F);
    *i += 3;
    return r;
  }
  const char32_t r = (char32_t{c} & 0x07) << 18 | (char32_t{b(*i + 1)} & 0x3F) << 12 |
                     (char32_t{b(*i + 2)} & 0x3F) << 6 | (b(*i + 3) & 0x3F);
  *i += 4;
  return r;
}

// Size in bytes of the UTF-8 character that starts with `lead`.
inline size_t CharSize(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace conveyor
