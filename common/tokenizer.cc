#include "common/tokenizer.h"

#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/sentencepiece_compat.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "tokenizer.model").string();
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const sentencepiece::util::Status status = sp->Load(path);
  if (!status.ok()) {
    // sentencepiece reports any failure to open as kNotFound; anything else means the
    // file was read but is not a valid model.
    const std::string message =
        absl::StrCat(path, ": cannot load sentencepiece model: ", status.message());
    return status.code() == sentencepiece::util::StatusCode::kNotFound
               ? absl::NotFoundError(message)
               : absl::DataLossError(message);
  }
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  tokenizer->sp_ = std::move(sp);
  return tokenizer;
}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::vector<int>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = sp_->Encode(text, &ids);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("sentencepiece Encode failed: ", status.message()));
  }
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int>& ids) const {
  const int piece_count = sp_->GetPieceSize();
  std::vector<int> known_ids;
  known_ids.reserve(ids.size());
  for (int id : ids) {
    if (id >= 0 && id < piece_count) known_ids.push_back(id);
  }
  std::string text;
  // With every id in range, sentencepiece's Decode cannot fail.
  sp_->Decode(known_ids, &text).IgnoreError();
  return text;
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

int Tokenizer::bos_id() const { return sp_->bos_id(); }

int Tokenizer::eos_id() const { return sp_->eos_id(); }

}  // namespace conveyor
