// The stages of an HF tokenizers pipeline around the model (hf_tokenizer.h runs them):
// normalizers and pre-tokenizers on the way in, post-processors and decoders on the way
// out, each built from its tokenizer.json object by a Parse* function. One file per stage
// (hf_normalizers.cc, hf_pre_tokenizers.cc, hf_post_processors.cc, hf_decoders.cc); what
// they share is hf_stage_util.h.
//
// Each stage does what the `tokenizers` library's component of the same name does to the
// text or ids; offsets are not tracked, as nothing here needs them. A type the parser
// does not know is an InvalidArgument error that names it, never a silent pass-through.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace conveyor::hf {

// Text split into pieces, as HF's PreTokenizedString holds it; one buffer for all.
class PieceList {
 public:
  struct Piece {
    uint32_t begin;
    uint32_t end;
    // Whether the piece starts where the input text started (HF: its original offset is
    // 0); Metaspace's "first" prepend scheme looks at it.
    bool at_start;
  };

  void Clear() {
    text_.clear();
    pieces_.clear();
  }
  // Adds a piece; empty ones are dropped, as HF drops empty splits.
  void Add(std::string_view text, bool at_start) {
    if (text.empty()) return;
    const auto begin = static_cast<uint32_t>(text_.size());
    text_.append(text);
    pieces_.push_back({begin, static_cast<uint32_t>(text_.size()), at_start});
  }
  // Adds a piece written straight into the buffer: call Begin, append to buffer(), End.
  uint32_t Begin() const { return static_cast<uint32_t>(text_.size()); }
  std::string* buffer() { return &text_; }
  void End(uint32_t begin, bool at_start) {
    if (text_.size() == begin) return;  // Empty: dropped, as in Add.
    pieces_.push_back({begin, static_cast<uint32_t>(text_.size()), at_start});
  }

  const std::vector<Piece>& pieces() const { return pieces_; }
  std::string_view text(const Piece& piece) const {
    const std::string_view all = text_;
    return all.substr(piece.begin, piece.end - piece.begin);
  }

 private:
  std::string text_;
  std::vector<Piece> pieces_;
};

// Rewrites the text of one segment (the input between added tokens).
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// Splits (and may rewrite) pieces; every piece of `in` becomes zero or more of `out`.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual absl::Status PreTokenize(const PieceList& in, PieceList* out) const = 0;
};

// Adds the special tokens around an encoded sequence (HF's add_special_tokens=True; with
// False, HF's post-processors leave the ids alone, so this is not called).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int>* ids) const = 0;
};

// Turns the tokens' strings into text, in place (HF's Decoder::decode_chain); the caller
// concatenates what is left.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Each builds a stage from its JSON object; `where` (e.g. "normalizer.normalizers[1]")
// locates it in error messages.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& json,
                                                            const std::string& where);
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& json,
                                                                const std::string& where);
absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& json,
                                                                  const std::string& where);
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& json,
                                                      const std::string& where);

// --- JSON helpers shared with the model and tokenizer parsers ------------------------
// All of them leave `*out` as it is when the field is missing or null.

absl::Status ReadString(const nlohmann::json& object, std::string_view key,
                        const std::string& where, std::string* out);
absl::Status ReadBool(const nlohmann::json& object, std::string_view key, const std::string& where,
                      bool* out);
absl::Status ReadInt(const nlohmann::json& object, std::string_view key, const std::string& where,
                     int64_t* out);
// The object's "type" string; an error naming `where` when it has none.
absl::StatusOr<std::string> ReadType(const nlohmann::json& object, const std::string& where);

}  // namespace conveyor::hf
