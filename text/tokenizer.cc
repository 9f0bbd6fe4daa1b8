#include "text/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/gguf_tokenizer.h"
#include "text/hf_tokenizer.h"
#include "text/sentencepiece_tokenizer.h"

namespace conveyor {
namespace {

// What tokenizer_config.json says about a sentencepiece model's encoding, as HF's
// LlamaTokenizer reads it: `legacy` (absent: false, as in transformers 5) and the added tokens of
// `added_tokens_decoder` ({"<id>": {"content": ...}}). A missing or unreadable file gives
// the defaults.
SentencePieceTokenizer::Options SentencePieceOptions(const std::filesystem::path& config_path) {
  SentencePieceTokenizer::Options options;
  std::ifstream in(config_path);
  if (!in) return options;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (!config.is_object()) return options;
  if (const auto it = config.find("legacy"); it != config.end() && it->is_boolean()) {
    options.legacy = it->get<bool>();
  }
  if (const auto it = config.find("added_tokens_decoder"); it != config.end() && it->is_object()) {
    for (const auto& [key, token] : it->items()) {
      int id = -1;
      if (!absl::SimpleAtoi(key, &id) || !token.is_object()) continue;
      const auto content = token.find("content");
      if (content != token.end() && content->is_string()) {
        options.added_tokens.emplace_back(content->get<std::string>(), id);
      }
    }
  }
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  if (IsGgufPath(model_dir)) {
    absl::StatusOr<std::unique_ptr<HfTokenizer>> gguf = LoadGgufTokenizer(model_dir);
    if (!gguf.ok()) return gguf.status();
    return std::unique_ptr<Tokenizer>(*std::move(gguf));
  }
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
      SentencePieceTokenizer::Load(model_path, SentencePieceOptions(dir / "tokenizer_config.json"));
  if (!spm.ok()) return spm.status();
  return std::unique_ptr<Tokenizer>(*std::move(spm));
}

}  // namespace conveyor
