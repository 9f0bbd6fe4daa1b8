// Text <-> token ids through a sentencepiece model (`tokenizer.model`).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace conveyor {

class Tokenizer {
 public:
  // Loads `<model_dir>/tokenizer.model`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);
  ~Tokenizer();

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids for `text` (no BOS; the caller adds it where the model wants one).
  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const;
  // Text for `ids`. Ids outside the tokenizer's vocabulary (models often pad their
  // vocabulary beyond it) decode to nothing.
  std::string Decode(const std::vector<int>& ids) const;
  // Number of pieces in the tokenizer (may be below the model's vocab_size).
  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;

 private:
  Tokenizer() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace conveyor
