// UTF-8 helpers for text that must be well formed (proto3 `string` fields are).
#pragma once

#include <string>
#include <string_view>

namespace conveyor {

// Returns `text` with every ill-formed byte sequence replaced by U+FFFD, the way
// decoders do; well-formed text comes back unchanged.
std::string ValidUtf8(std::string_view text);

}  // namespace conveyor
