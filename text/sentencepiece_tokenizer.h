// The Tokenizer (tokenizer.h) of a sentencepiece model, `tokenizer.model`.
//
// Special tokens written in the text become their ids, as Hugging Face's LlamaTokenizer
// does (transformers 5, AutoTokenizer's default for a bare tokenizer.model: the fast
// tokenizer converted from it): the text is cut at every special token (sentencepiece's
// control and unknown pieces, e.g. "<s>", "</s>", "<unk>", and the added tokens
// tokenizer_config.json lists), longest first, and each stretch between them is encoded
// by sentencepiece on its own. Sentencepiece itself would read "<s>" as the text pieces
// "▁<", "s", ">". The stretches' dummy prefix ("▁" in front, when the model adds one)
// follows HF's Metaspace pre-tokenizer: never on a stretch that starts with a space (" hi"
// is "▁hi", where sentencepiece alone gives "▁▁hi"); otherwise, with `legacy` true in
// tokenizer_config.json, on every stretch, so "<s>[INST]" is "<s>", "▁[", "INST", …; with
// `legacy` false or absent only on the text's start, so "<s>[INST]" is "<s>", "[",
// "INST", … (a stretch without the prefix is encoded after the unknown piece, whose ids
// are dropped). tests/chat_ref/spm_cases.json holds transformers' ids that
// chat_tokens_test checks this against. The tokens' lstrip/rstrip flags (whitespace eaten
// around an added token) are not applied: Llama's and Mistral's special tokens have them
// off.
//
// sentencepiece is reached through a small shared library loaded in isolation
// (sentencepiece_shim.cc explains why). It is looked up at $CONVEYOR_SPM_SHIM, next to
// the running executable, in the build tree, then on the library path.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer.h"

namespace conveyor {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads the model at `path`: NotFound if it cannot be opened, DataLoss if it is not a
  // sentencepiece model; both name the path.
  struct Options {
    // HF's `legacy` (tokenizer_config.json): a dummy prefix after every special token.
    // Off unless the config says so, as transformers 5's LlamaTokenizer has it.
    bool legacy = false;
    // tokenizer_config.json's added_tokens_decoder: (content, id) of tokens to cut the
    // text at, besides the model's control and unknown pieces.
    std::vector<std::pair<std::string, int>> added_tokens;
  };
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path,
                                                                      const Options& options);
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path) {
    return Load(path, Options());
  }
  ~SentencePieceTokenizer() override;

  std::string_view kind() const override { return "sentencepiece"; }
  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const override;
  // BOS, then Encode(text); just Encode(text) for a model without BOS.
  absl::StatusOr<std::vector<int>> EncodeWithSpecialTokens(std::string_view text) const override;
  std::string Decode(const std::vector<int>& ids) const override;
  std::string Piece(int id) const override;
  bool IsSpecial(int id) const override;
  int vocab_size() const override;
  int bos_id() const override;
  int eos_id() const override;
  int pad_id() const override;

  struct Shim;  // The shim's entry points (sentencepiece_tokenizer.cc).

 private:
  SentencePieceTokenizer(const Shim* shim, void* handle) : shim_(shim), handle_(handle) {}

  // sentencepiece's own encoding of `text` (no special-token cutting).
  absl::StatusOr<std::vector<int>> EncodePieces(std::string_view text) const;
  // One stretch between special tokens; `at_start`: it begins the text.
  absl::Status EncodeStretch(std::string_view text, bool at_start, std::vector<int>* ids) const;

  const Shim* shim_;
  void* handle_;  // The shim's processor.
  bool legacy_ = false;
  // The special tokens' text and id, longest first, and which bytes begin one.
  std::vector<std::pair<std::string, int>> specials_;
  bool starts_special_[256] = {};
  // The unknown piece's text and how many ids sentencepiece gives it alone (to encode
  // without a dummy prefix).
  std::string unk_piece_;
  size_t unk_piece_ids_ = 0;
};

}  // namespace conveyor
