// The Tokenizer (tokenizer.h) of a Hugging Face `tokenizer.json`: the `tokenizers`
// library's pipeline for BPE models, reproduced id for id.
//
// Encoding runs, for each text:
//   1. added tokens: tokens in the file's "added_tokens" that are not "normalized" are cut
//      out of the raw text (leftmost-longest, honouring single_word/lstrip/rstrip);
//   2. normalizer, on each stretch of text between them, then the "normalized" added
//      tokens are cut out of its result;
//   3. pre-tokenizer, splitting each remaining stretch into words (byte-level GPT-2 /
//      Llama 3 / Qwen2 splits, Metaspace, ...);
//   4. model (BPE, hf_tokenizer_bpe.h) on each word;
//   5. post-processor (EncodeWithSpecialTokens only): e.g. Llama 3's BOS.
// Decoding maps ids to their strings (added tokens first) and runs the decoder chain.
// The stages are in hf_tokenizer_components.h, the regex engine and Unicode tables in
// hf_tokenizer_text.h. tests/tokenizer_ref/ holds the differential test against the
// `tokenizers` package.
//
// Not reproduced: offsets, truncation and padding settings (ignored), pairs of
// sequences, and models other than BPE (WordPiece, Unigram, WordLevel: a load error).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "text/tokenizer.h"

namespace conveyor {

namespace hf {
class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;
}  // namespace hf

class HfTokenizer final : public Tokenizer {
 public:
  // Loads `tokenizer_json_path`, and `tokenizer_config_path` when that file exists.
  // NotFound if the first is missing; InvalidArgument naming the file and the component
  // (e.g. "pre_tokenizer.pretokenizers[1]: unknown or unsupported pre_tokenizer type
  // \"Foo\"") when it cannot be used.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(
      const std::string& tokenizer_json_path, const std::string& tokenizer_config_path);
  // The same from the files' contents; `source` and `config_source` name them in error
  // messages. An empty `config_json` means there is no config.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Parse(
      std::string_view json, std::string_view source, std::string_view config_json = "",
      std::string_view config_source = "tokenizer_config.json");
  // The model's BOS, EOS and padding ids when they are known as ids (-1: none).
  struct SpecialIds {
    int bos = -1;
    int eos = -1;
    int pad = -1;
  };
  // The same from a tokenizer.json document already parsed (or built, as
  // gguf_tokenizer.h does from a GGUF file's metadata), with the special ids given
  // rather than named by a tokenizer_config.json; `kind` is what kind() returns.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromDocument(const nlohmann::json& document,
                                                                   std::string_view source,
                                                                   const SpecialIds& ids,
                                                                   std::string_view kind);
  ~HfTokenizer() override;

  // "tokenizer.json", or the kind FromDocument was given (e.g. "gguf").
  std::string_view kind() const override { return kind_; }
  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const override;
  absl::StatusOr<std::vector<int>> EncodeWithSpecialTokens(std::string_view text) const override;
  std::string Decode(const std::vector<int>& ids) const override;
  std::string Piece(int id) const override;
  bool IsSpecial(int id) const override;
  int vocab_size() const override { return vocab_size_; }
  int bos_id() const override { return bos_id_; }
  int eos_id() const override { return eos_id_; }
  int pad_id() const override { return pad_id_; }

  // The id of token `token` (an added token's content or a vocabulary entry), or -1.
  int TokenToId(std::string_view token) const;

 private:
  HfTokenizer();
  // Steps 1-5's stages from `document`; the special ids are left at -1.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Build(const nlohmann::json& document,
                                                            std::string_view source);
  absl::StatusOr<std::vector<int>> EncodeImpl(std::string_view text, bool add_special_tokens) const;
  // Steps 3-4 for one stretch of normalized text.
  absl::Status TokenizeStretch(std::string_view text, bool at_start, std::vector<int>* ids) const;
  // The string of `id` as the decoder sees it, or null.
  const std::string* IdToToken(int id) const;

  std::unique_ptr<hf::AddedVocabulary> added_;
  std::unique_ptr<hf::Normalizer> normalizer_;       // Null: none.
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer_;  // Null: the stretch is one word.
  std::unique_ptr<hf::BpeModel> model_;
  std::unique_ptr<hf::PostProcessor> post_processor_;  // Null: adds nothing.
  std::unique_ptr<hf::Decoder> decoder_;               // Null: tokens joined with spaces, as HF.
  std::string kind_ = "tokenizer.json";
  int vocab_size_ = 0;
  int bos_id_ = -1;
  int eos_id_ = -1;
  int pad_id_ = -1;
};

}  // namespace conveyor
