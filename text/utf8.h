// UTF-8 helpers: checking, repairing and encoding text that must be well formed (proto3
// `string` fields, tokenizer input, template values). Well formed means RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF.
#pragma once

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

}  // namespace conveyor
