#include "tests/fuzz/fuzz_support.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "text/hf_tokenizer.h"

namespace conveyor::fuzz {

std::unique_ptr<Tokenizer> LoadTokenizer(std::string_view name) {
  const char* from_env = std::getenv("CONVEYOR_FUZZ_DATA");
  const std::string dir = std::string(from_env != nullptr ? from_env : CONVEYOR_FUZZ_DATA_DIR) +
                          "/" + std::string(name);
  auto tokenizer = HfTokenizer::Load(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "fuzz: cannot load the tokenizer in %s: %s\n", dir.c_str(),
                 tokenizer.status().ToString().c_str());
    std::abort();
  }
  return *std::move(tokenizer);
}

bool IsWellFormedUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t length;
    // The smallest code point of each length (longer forms of smaller ones are overlong).
    char32_t code_point, smallest;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead >> 5 == 0x6) {
      length = 2, code_point = lead & 0x1F, smallest = 0x80;
    } else if (lead >> 4 == 0xE) {
      length = 3, code_point = lead & 0x0F, smallest = 0x800;
    } else if (lead >> 3 == 0x1E) {
      length = 4, code_point = lead & 0x07, smallest = 0x10000;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (size_t j = 1; j < length; ++j) {
      const auto next = static_cast<unsigned char>(text[i + j]);
      if (next >> 6 != 0x2) return false;
      code_point = code_point << 6 | (next & 0x3F);
    }
    if (code_point < smallest || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

void InvariantViolated(std::string_view what, std::string_view details) {
  std::fprintf(stderr, "\n=== fuzz invariant violated: %.*s\n%.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(details.size()), details.data());
  std::abort();
}

}  // namespace conveyor::fuzz
