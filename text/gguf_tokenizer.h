// The tokenizer and chat template a GGUF file carries (issue K): its `tokenizer.ggml.*`
// and `tokenizer.chat_template` metadata, turned into the Hugging Face documents they
// stand for, a tokenizer.json and a tokenizer_config.json, which HfTokenizer then runs.
//
// A GGUF file has no tokenizer.json; convert_hf_to_gguf.py stores the vocabulary, merges,
// token types and special ids as metadata, and a pre-tokenizer *name*
// (`tokenizer.ggml.pre`) for the regex that llama.cpp hard-codes per name. Building the
// tokenizer.json those keys describe, as transformers' GGUF loader does, reuses the one
// tokenizer implementation that the differential tests already hold to `tokenizers` id for
// id; docs/gguf.md ("The tokenizer") has the mapping, key by key, and where it follows
// llama.cpp rather than transformers.
//
// Two vocabulary kinds (`tokenizer.ggml.model`):
//   "gpt2"  byte-level BPE: tokens, merges, the pre-tokenizer regex named by
//           tokenizer.ggml.pre (KnownGgufPreTokenizers()).
//   "llama" sentencepiece-style BPE: tokens, scores (the merges are derived from them when
//           the file has none), byte fallback through the <0xNN> tokens, "▁" for a space,
//           a "▁" in front of the text (tokenizer.ggml.add_space_prefix, default true).
// Tokens of type control (3) and unknown (2) become special added tokens, user-defined (4)
// plain added tokens: all of them are matched whole in the text.
//
// Every error names the file and the key (and the index in an array): a missing or
// ill-typed key, an id out of range or a merge naming an unknown token is
// INVALID_ARGUMENT; a vocabulary kind or pre-tokenizer Conveyor does not know is
// UNIMPLEMENTED listing the ones it does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer.h"

namespace conveyor {

class GgufFile;

// Whether `path` names a GGUF file rather than a model directory: it ends in ".gguf", the
// rule the worker's loader uses too.
bool IsGgufPath(std::string_view path);

// The values of tokenizer.ggml.pre this file knows, sorted.
std::vector<std::string> KnownGgufPreTokenizers();

// What a GGUF file's tokenizer metadata says, in Hugging Face's terms.
struct GgufTokenizerDocuments {
  // The tokenizer.json document (model, added_tokens, pre_tokenizer, decoder,
  // post_processor).
  nlohmann::json tokenizer;
  // The tokenizer_config.json it implies: bos_token, eos_token, unk_token, pad_token (the
  // tokens' text, or null), add_bos_token, add_eos_token, and chat_template when the file
  // has `tokenizer.chat_template`.
  nlohmann::json config;
  // The special ids, from tokenizer.ggml.{bos,eos,padding}_token_id (-1: absent).
  HfTokenizer::SpecialIds ids;
};

// Builds the documents from `file`'s metadata (see above for the errors).
absl::StatusOr<GgufTokenizerDocuments> GgufTokenizerDocumentsOf(const GgufFile& file);

// The tokenizer of `file`, or of the GGUF file at `path` (kind() "gguf").
absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const GgufFile& file);
absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const std::string& path);

// The tokenizer_config.json equivalent of the GGUF file at `path` (the `config` above).
absl::StatusOr<nlohmann::json> LoadGgufTokenizerConfig(const std::string& path);

}  // namespace conveyor
