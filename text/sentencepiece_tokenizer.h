// The Tokenizer (tokenizer.h) of a sentencepiece model, `tokenizer.model`.
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
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);
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

  const Shim* shim_;
  void* handle_;  // The shim's processor.
};

}  // namespace conveyor
