// Text <-> token ids through a sentencepiece model (`tokenizer.model`).
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
  // The vocabulary piece of `id` as written in the model (e.g. "▁world"), or "" for ids
  // outside the tokenizer's vocabulary.
  std::string Piece(int id) const;
  // Number of pieces in the tokenizer (may be below the model's vocab_size).
  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;

  struct Shim;  // The shim's entry points (tokenizer.cc).

 private:
  Tokenizer(const Shim* shim, void* handle) : shim_(shim), handle_(handle) {}

  const Shim* shim_;
  void* handle_;  // The shim's processor.
};

}  // namespace conveyor
