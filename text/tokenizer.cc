#include "text/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "text/hf_tokenizer.h"
#include "text/sentencepiece_tokenizer.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::string json_path = (dir / "tokenizer.json").string();
  const std::string model_path = (dir / "tokenizer.model").string();
  std::error_code ec;
  // tokenizer.json first: HF's fast tokenizers prefer it, and models that ship both
  // (Llama 2, Mistral) mean the same tokenizer by them.
  if (std::filesystem::exists(json_path, ec)) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> hf =
        HfTokenizer::Load(json_path, (dir / "tokenizer_config.json").string());
    if (!hf.ok()) return hf.status();
    return std::unique_ptr<Tokenizer>(*std::move(hf));
  }
  if (!std::filesystem::exists(model_path, ec)) {
    return absl::NotFoundError(absl::StrCat("no tokenizer in ", model_dir, ": neither ", json_path,
                                            " nor ", model_path, " exists"));
  }
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> spm =
      SentencePieceTokenizer::Load(model_path);
  if (!spm.ok()) return spm.status();
  return std::unique_ptr<Tokenizer>(*std::move(spm));
}

}  // namespace conveyor
