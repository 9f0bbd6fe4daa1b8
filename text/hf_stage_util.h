// What the stages of an HF tokenizers pipeline (hf_normalizers.cc, hf_pre_tokenizers.cc,
// hf_post_processors.cc, hf_decoders.cc) share: reading tokenizer.json fields with errors
// that name the field, GPT-2's byte-level alphabet, and Metaspace's settings (its
// pre-tokenizer and decoder read the same ones). Internal to text/: include
// hf_tokenizer_components.h for the stages themselves.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer_components.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor::hf {

using json = nlohmann::json;

// The member `key` of `object`, or null when it is absent or null (or `object` is no
// object).
const json* Field(const json& object, std::string_view key);
// INVALID_ARGUMENT "<where>.<key> must be <type>".
absl::Status WrongType(const std::string& where, std::string_view key, std::string_view type);
// INVALID_ARGUMENT for a component type this parser does not know.
absl::Status Unknown(std::string_view kind, std::string_view type, const std::string& where);
// A field holding exactly one character (e.g. Metaspace's replacement), as its UTF-8;
// `out` keeps its value when the field is absent.
absl::Status ReadChar(const json& object, std::string_view key, const std::string& where,
                      std::string* out);
// A Split or Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
absl::StatusOr<std::shared_ptr<const Regex>> ReadPattern(const json& object,
                                                         const std::string& where);
// The sub-objects of a Sequence (`key` names the array).
absl::StatusOr<const json*> ReadArray(const json& object, std::string_view key,
                                      const std::string& where);

// GPT-2's bytes_to_unicode: a printable character standing for each byte.
struct ByteAlphabet {
  ByteAlphabet();
  std::array<std::string, 256> chars;  // UTF-8 of the character that stands for each byte.
  std::array<int16_t, 324> byte_of{};  // The byte a character < 324 stands for.

  // The byte `c` stands for, or -1.
  int ByteOf(char32_t c) const {
    if (c >= byte_of.size()) return -1;
    const int b = byte_of[c];
    return b != 0 || c == 256 ? b : -1;  // Only U+0100 stands for byte 0.
  }
};
const ByteAlphabet& Bytes();
// Appends the alphabet's characters for the bytes of `text`.
void AppendByteChars(std::string_view text, std::string* out);

// Replace: every match of `pattern` becomes `content`. The Replace normalizer, and the
// Replace decoder applies it to each token.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::shared_ptr<const Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override;

 private:
  std::shared_ptr<const Regex> pattern_;
  std::string content_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace's settings, shared by the pre-tokenizer and the decoder.
struct MetaspaceConfig {
  std::string replacement = "\xE2\x96\x81";  // "▁"
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
};
absl::StatusOr<MetaspaceConfig> ReadMetaspace(const json& object, const std::string& where);

}  // namespace conveyor::hf
