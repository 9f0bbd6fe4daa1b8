// What the fuzz targets (tests/fuzz/*_fuzzer.cc) share: the committed tokenizers they
// load once at start-up, a strict UTF-8 check for their invariants, and a way to stop on
// a broken invariant that libFuzzer reports as a crash (and saves the input of).
#pragma once

#include <memory>
#include <string_view>

#include "text/tokenizer.h"

namespace conveyor::fuzz {

// Loads tests/fuzz/data/<name>/ (tokenizer.json and tokenizer_config.json): "llama3"
// (byte-level BPE) or "llama2" (Metaspace, byte fallback). $CONVEYOR_FUZZ_DATA overrides
// the data folder the build recorded. Aborts when it cannot: no fuzzing without it.
std::unique_ptr<Tokenizer> LoadTokenizer(std::string_view name);

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code
// points above U+10FFFF). Written here rather than taken from common/utf8.h so that the
// invariants do not check the product with its own code.
bool IsWellFormedUtf8(std::string_view text);

// Prints `what` and the details, then aborts: libFuzzer saves the input as a crash.
[[noreturn]] void InvariantViolated(std::string_view what, std::string_view details);

}  // namespace conveyor::fuzz
