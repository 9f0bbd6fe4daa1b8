// The normalizers of an HF tokenizers pipeline (hf_tokenizer_components.h): Sequence,
// NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents, Replace, Prepend/Append, ByteLevel.
#include "text/hf_tokenizer_components.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "text/hf_stage_util.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor::hf {
namespace {

// --- Normalizers -----------------------------------------------------------------------

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  absl::Status Normalize(std::string* text) const override { return hf::Normalize(form_, text); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string lower;
    lower.reserve(text->size());
    AppendLowercase(*text, &lower);
    *text = std::move(lower);
    return absl::OkStatus();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhitespace(NextChar(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while ((static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsWhitespace(NextChar(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    for (size_t i = 0; i < text->size();) {
      const size_t begin = i;
      if (!IsMark(NextChar(*text, &i))) out.append(*text, begin, i - begin);
    }
    *text = std::move(out);
    return absl::OkStatus();
  }
};

// Prepend and Append: only non-empty text gets the affix.
class AffixNormalizer final : public Normalizer {
 public:
  AffixNormalizer(std::string affix, bool prepend) : affix_(std::move(affix)), prepend_(prepend) {}
  absl::Status Normalize(std::string* text) const override {
    if (text->empty()) return absl::OkStatus();
    if (prepend_) {
      text->insert(0, affix_);
    } else {
      text->append(affix_);
    }
    return absl::OkStatus();
  }

 private:
  std::string affix_;
  bool prepend_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size() * 2);
    AppendByteChars(*text, &out);
    *text = std::move(out);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& object,
                                                            const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "normalizers", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParseNormalizer((**array)[i], absl::StrCat(where, ".normalizers[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (*type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfc);
  if (*type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfd);
  if (*type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkc);
  if (*type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkd);
  if (*type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (*type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (*type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (*type == "Strip") {
    bool left = true, right = true;
    RETURN_IF_ERROR(ReadBool(object, "strip_left", where, &left));
    RETURN_IF_ERROR(ReadBool(object, "strip_right", where, &right));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (*type == "Replace") {
    auto pattern = ReadPattern(object, where);
    if (!pattern.ok()) return pattern.status();
    std::string content;
    RETURN_IF_ERROR(ReadString(object, "content", where, &content));
    return std::make_unique<ReplaceNormalizer>(*std::move(pattern), std::move(content));
  }
  if (*type == "Prepend" || *type == "Append") {
    const bool prepend = *type == "Prepend";
    std::string affix;
    RETURN_IF_ERROR(ReadString(object, prepend ? "prepend" : "append", where, &affix));
    return std::make_unique<AffixNormalizer>(std::move(affix), prepend);
  }
  return Unknown("normalizer", *type, where);
}

}  // namespace conveyor::hf
