// The decoders of an HF tokenizers pipeline (hf_tokenizer_components.h): Sequence,
// ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, BPE suffixes.
#include "text/hf_tokenizer_components.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "text/hf_stage_util.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor::hf {
namespace {

// --- Decoders --------------------------------------------------------------------------

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// All tokens become one string: each token's characters as the bytes they stand for (a
// token with any other character keeps its own bytes), read as UTF-8 lossily.
class ByteLevelDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    const ByteAlphabet& alphabet = Bytes();
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t start = bytes.size();
      bool all_mapped = true;
      for (size_t i = 0; i < token.size() && all_mapped;) {
        const int b = alphabet.ByteOf(NextChar(token, &i));
        if (b < 0) {
          all_mapped = false;
        } else {
          bytes.push_back(static_cast<char>(b));
        }
      }
      if (!all_mapped) {
        bytes.resize(start);
        bytes.append(token);
      }
    }
    std::string text;
    text.reserve(bytes.size());
    AppendLossyUtf8(bytes, &text);
    tokens->clear();
    tokens->push_back(std::move(text));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(MetaspaceConfig config) : config_(std::move(config)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t t = 0; t < tokens->size(); ++t) {
      std::string& token = (*tokens)[t];
      // The first token loses every replacement character, not only a leading one: HF.
      const bool drop = t == 0 && config_.scheme != PrependScheme::kNever;
      std::string out;
      out.reserve(token.size());
      for (size_t i = 0; i < token.size();) {
        if (token.compare(i, config_.replacement.size(), config_.replacement) == 0) {
          if (!drop) out.push_back(' ');
          i += config_.replacement.size();
        } else {
          out.push_back(token[i++]);
        }
      }
      token = std::move(out);
    }
  }

 private:
  MetaspaceConfig config_;
};

// "<0xE4>"-style tokens become their bytes; a run of them that is not valid UTF-8 becomes
// one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (FindInvalidUtf8(run) == std::string_view::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& token : *tokens) {
      int byte = -1;
      if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>') {
        const std::string_view digits = token;
        byte = ParseHexByte(digits.substr(3, 2));
      }
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  // Rust's u8::from_str_radix(s, 16) for two characters: an optional '+' then hex digits.
  static int ParseHexByte(std::string_view s) {
    if (s[0] == '+') s.remove_prefix(1);
    int value = 0;
    for (const char c : s) {
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return -1;
      }
      value = value * 16 + digit;
    }
    return value;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& token : *tokens) all.append(token);
    tokens->clear();
    tokens->push_back(std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, int64_t start, int64_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    const std::string_view c = content_;
    for (std::string& token : *tokens) {
      const std::string_view text = token;
      size_t begin = 0, end = text.size();
      for (int64_t i = 0; i < start_ && text.substr(begin).starts_with(c); ++i) begin += c.size();
      // HF would panic where the two cuts overlap; here the token just becomes empty.
      for (int64_t i = 0; i < stop_ && end >= begin + c.size() && text.substr(0, end).ends_with(c);
           ++i) {
        end -= c.size();
      }
      token = std::string(text.substr(begin, end - begin));
    }
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::shared_ptr<const Regex> pattern, std::string content)
      : normalizer_(std::move(pattern), std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    // A PCRE2 resource failure leaves the token as it was: decoding cannot fail.
    for (std::string& token : *tokens) normalizer_.Normalize(&token).IgnoreError();
  }

 private:
  ReplaceNormalizer normalizer_;  // Replaces in one string, as the decoder does per token.
};

// Classic BPE's end-of-word suffix: a space, except after the last token.
class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    if (suffix_.empty()) return;
    for (size_t t = 0; t < tokens->size(); ++t) {
      const std::string_view with = t + 1 == tokens->size() ? "" : " ";
      std::string& token = (*tokens)[t];
      std::string out;
      for (size_t i = 0; i < token.size();) {
        if (token.compare(i, suffix_.size(), suffix_) == 0) {
          out.append(with);
          i += suffix_.size();
        } else {
          out.push_back(token[i++]);
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& object,
                                                      const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "decoders", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParseDecoder((**array)[i], absl::StrCat(where, ".decoders[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (*type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (*type == "Metaspace") {
    absl::StatusOr<MetaspaceConfig> config = ReadMetaspace(object, where);
    if (!config.ok()) return config.status();
    return std::make_unique<MetaspaceDecoder>(*std::move(config));
  }
  if (*type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (*type == "Fuse") return std::make_unique<FuseDecoder>();
  if (*type == "Strip") {
    std::string content = " ";
    int64_t start = 0, stop = 0;
    RETURN_IF_ERROR(ReadChar(object, "content", where, &content));
    RETURN_IF_ERROR(ReadInt(object, "start", where, &start));
    RETURN_IF_ERROR(ReadInt(object, "stop", where, &stop));
    return std::make_unique<StripDecoder>(std::move(content), start, stop);
  }
  if (*type == "Replace") {
    auto pattern = ReadPattern(object, where);
    if (!pattern.ok()) return pattern.status();
    std::string content;
    RETURN_IF_ERROR(ReadString(object, "content", where, &content));
    return std::make_unique<ReplaceDecoder>(*std::move(pattern), std::move(content));
  }
  if (*type == "BPEDecoder") {
    std::string suffix = "</w>";
    RETURN_IF_ERROR(ReadString(object, "suffix", where, &suffix));
    return std::make_unique<BpeSuffixDecoder>(std::move(suffix));
  }
  return Unknown("decoder", *type, where);
}

}  // namespace conveyor::hf
