// Text <-> token ids for a model directory: the interface the scheduler, the benchmarks
// and the tests use, and `Tokenizer::Load`, which picks the implementation from the
// files the model ships.
//
// Two implementations: HfTokenizer (hf_tokenizer.h) runs a Hugging Face `tokenizer.json`
// (Llama 3.x, Qwen2/2.5, Mistral, Phi-3.5 ship only that), SentencePieceTokenizer
// (sentencepiece_tokenizer.h) a `tokenizer.model`. When a directory has both, Load takes
// tokenizer.json, as HF's fast tokenizers do. A GGUF file's vocabulary runs on
// HfTokenizer too, as the tokenizer.json its metadata describes (gguf_tokenizer.h).
//
// Special tokens and BOS, for the scheduler. A model's tokenizer decides what goes around
// a prompt: Llama 3's tokenizer.json adds <|begin_of_text|> through its post-processor,
// Qwen2's adds nothing, a sentencepiece model wants its BOS in front. So to build a
// prompt from text, call EncodeWithSpecialTokens(text) when the request wants the
// model's usual framing (add_bos, the default) and Encode(text) when it does not (e.g.
// text already rendered by a chat template that starts with the BOS token); do not push
// bos_id() by hand, which would give Qwen2 a BOS it never saw in training (bos_id() is -1
// there) and Llama 3 two if the caller also uses EncodeWithSpecialTokens.
//
// Special tokens written in the text ("<|eot_id|>") are recognised by both Encode calls
// and become their ids, as HF does (encode's add_special_tokens only controls the
// post-processor). Callers that must not let user text inject control tokens have to
// screen the text themselves.
//
// Decoding follows HF's decode(ids, skip_special_tokens=False): special tokens render as
// their text. To skip them, drop the ids for which IsSpecial() holds before Decode; that
// is exactly what HF's skip_special_tokens=True does. (sentencepiece renders its control
// tokens as nothing either way.)
//
// All methods are const and safe to call from several threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

class Tokenizer {
 public:
  // Loads `<model_dir>/tokenizer.json` (with `tokenizer_config.json` beside it, when
  // present, for the bos/eos/pad token names) or, failing that, `tokenizer.model`.
  // NotFound when neither exists; InvalidArgument/DataLoss naming the file when it
  // cannot be read as a tokenizer. A `model_dir` ending in ".gguf" is a GGUF file instead:
  // its tokenizer.ggml.* metadata (LoadGgufTokenizer; its errors name the file and key).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);
  virtual ~Tokenizer() = default;

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // "tokenizer.json", "sentencepiece" or "gguf".
  virtual std::string_view kind() const = 0;

  // Token ids for `text`, without the tokens the tokenizer adds around a sequence (HF:
  // encode(text, add_special_tokens=False); sentencepiece: no BOS). InvalidArgument if
  // `text` is not valid UTF-8.
  virtual absl::StatusOr<std::vector<int>> Encode(std::string_view text) const = 0;
  // Encode(text) framed as the model expects a single sequence (HF:
  // add_special_tokens=True, i.e. the post-processor's template; sentencepiece: BOS in
  // front when the model has one).
  virtual absl::StatusOr<std::vector<int>> EncodeWithSpecialTokens(std::string_view text) const = 0;

  // Text for `ids`, special tokens included (see above). Ids outside the tokenizer's
  // vocabulary (models often pad their vocabulary beyond it) decode to nothing. Byte
  // sequences that do not form UTF-8 come out as U+FFFD, so the text is always valid.
  virtual std::string Decode(const std::vector<int>& ids) const = 0;
  // The vocabulary piece of `id` as written in the model (e.g. "▁world", "Ġworld",
  // "<|eot_id|>"), or "" for ids outside the tokenizer's vocabulary.
  virtual std::string Piece(int id) const = 0;
  // Whether `id` is a special token: HF added tokens marked "special", sentencepiece's
  // control and unknown tokens.
  virtual bool IsSpecial(int id) const = 0;

  // One past the largest id the tokenizer knows (may be below the model's vocab_size;
  // ids under it may still lack a piece).
  virtual int vocab_size() const = 0;
  // The model's BOS, EOS and padding ids; -1 when it has none. For tokenizer.json they
  // come from tokenizer_config.json's bos_token/eos_token/pad_token (all -1 without it).
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int pad_id() const = 0;

 protected:
  Tokenizer() = default;
};

}  // namespace conveyor
