// The post-processors of an HF tokenizers pipeline (hf_tokenizer_components.h):
// TemplateProcessing, BertProcessing/RobertaProcessing (as templates), ByteLevel, Sequence.
#include "text/hf_tokenizer_components.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "text/hf_stage_util.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor::hf {
namespace {

// --- Post-processors -------------------------------------------------------------------

// A single-sequence template: special token ids around (or in) the sequence, marked -1.
class TemplatePostProcessor final : public PostProcessor {
 public:
  explicit TemplatePostProcessor(std::vector<std::vector<int>> parts) : parts_(std::move(parts)) {}
  void Process(std::vector<int>* ids) const override {
    std::vector<int> out;
    out.reserve(ids->size() + 8);
    for (const std::vector<int>& part : parts_) {
      if (part.empty()) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), part.begin(), part.end());
      }
    }
    *ids = std::move(out);
  }

 private:
  // Each part: the ids of a special token, or empty for the sequence.
  std::vector<std::vector<int>> parts_;
};

class NoopPostProcessor final : public PostProcessor {
 public:
  void Process(std::vector<int>*) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void Process(std::vector<int>* ids) const override {
    for (const auto& step : steps_) step->Process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const json& object,
                                                             const std::string& where) {
  // special_tokens: {"<name>": {"id": "<name>", "ids": [...], "tokens": [...]}}.
  const json* specials = Field(object, "special_tokens");
  const auto special_ids = [&](const std::string& name) -> absl::StatusOr<std::vector<int>> {
    const json* special = specials == nullptr ? nullptr : Field(*specials, name);
    const json* ids = special == nullptr ? nullptr : Field(*special, "ids");
    if (ids == nullptr || !ids->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the template uses \"", name, "\", missing from special_tokens"));
    }
    std::vector<int> out;
    for (const json& id : *ids) {
      if (!id.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".special_tokens.", name, ".ids must hold integers"));
      }
      out.push_back(id.get<int>());
    }
    if (out.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".special_tokens.", name, " has no ids"));
    }
    return out;
  };
  const json* single = Field(object, "single");
  if (single == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has no \"single\""));
  }
  std::vector<std::vector<int>> parts;
  if (single->is_string()) {
    // The short form: "[CLS]:0 $A:0 [SEP]:0"; "$", "$A", "$0" and "$A:1" are the sequence.
    const std::string& text = single->get_ref<const std::string&>();
    for (size_t i = 0; i < text.size();) {
      const size_t end = std::min(text.find(' ', i), text.size());
      std::string item = text.substr(i, end - i);
      i = end + 1;
      if (item.empty()) continue;
      if (item[0] == '$') {
        parts.emplace_back();
        continue;
      }
      const size_t colon = item.rfind(':');
      if (colon != std::string::npos) item.resize(colon);
      absl::StatusOr<std::vector<int>> ids = special_ids(item);
      if (!ids.ok()) return ids.status();
      parts.push_back(*std::move(ids));
    }
  } else if (single->is_array()) {
    for (const json& piece : *single) {
      if (Field(piece, "Sequence") != nullptr) {
        parts.emplace_back();
        continue;
      }
      const json* special = Field(piece, "SpecialToken");
      std::string name;
      if (special != nullptr) RETURN_IF_ERROR(ReadString(*special, "id", where, &name));
      if (name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".single holds a piece that is neither Sequence nor SpecialToken"));
      }
      absl::StatusOr<std::vector<int>> ids = special_ids(name);
      if (!ids.ok()) return ids.status();
      parts.push_back(*std::move(ids));
    }
  } else {
    return WrongType(where, "single", "an array or a string");
  }
  return std::make_unique<TemplatePostProcessor>(std::move(parts));
}

// Bert and Roberta processing: [cls] sequence [sep], where each is ["<token>", id].
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const json& object,
                                                           const std::string& where) {
  std::vector<std::vector<int>> parts;
  for (const char* key : {"cls", "sep"}) {
    const json* pair = Field(object, key);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
        !(*pair)[1].is_number_integer()) {
      return WrongType(where, key, "[token, id]");
    }
    parts.push_back({(*pair)[1].get<int>()});
    if (parts.size() == 1) parts.emplace_back();  // The sequence, between the two.
  }
  return std::make_unique<TemplatePostProcessor>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const json& object,
                                                                  const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "TemplateProcessing") return ParseTemplate(object, where);
  // ByteLevel only trims offsets, which are not tracked here.
  if (*type == "ByteLevel") return std::make_unique<NoopPostProcessor>();
  if (*type == "BertProcessing" || *type == "RobertaProcessing") return ParseClsSep(object, where);
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "processors", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParsePostProcessor((**array)[i], absl::StrCat(where, ".processors[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequencePostProcessor>(std::move(steps));
  }
  return Unknown("post_processor", *type, where);
}

}  // namespace conveyor::hf
