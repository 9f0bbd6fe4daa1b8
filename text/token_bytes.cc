#include "text/token_bytes.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "absl/strings/match.h"
#include "common/utf8.h"
#include "text/hf_stage_util.h"

namespace conveyor {
namespace {

// Tokens of a short text: placed before a token, they make it decode as it would mid-text
// (a Metaspace piece keeps its leading space, which decoders strip at the start).
std::vector<int> Anchor(const Tokenizer& tokenizer) {
  for (const char* text : {"a", "x", "0", "."}) {
    absl::StatusOr<std::vector<int>> ids = tokenizer.Encode(text);
    if (ids.ok() && !ids->empty() && !tokenizer.Decode(*ids).empty()) return *ids;
  }
  return {};
}

// The byte a byte-fallback piece "<0xNN>" stands for, or -1.
int FallbackByte(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// The bytes a byte-level BPE piece (GPT-2's alphabet) stands for; false if some character
// is not in the alphabet.
bool ByteLevelBytes(std::string_view piece, std::string* out) {
  const hf::ByteAlphabet& alphabet = hf::Bytes();
  out->clear();
  for (size_t i = 0; i < piece.size();) {
    const int b = alphabet.ByteOf(NextChar(piece, &i));
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace

TokenByteTable MakeTokenByteTable(const Tokenizer& tokenizer, int vocab_size) {
  TokenByteTable table;
  table.bytes.resize(vocab_size);
  table.special.resize(vocab_size, false);
  std::vector<int> ids = Anchor(tokenizer);
  const size_t anchor_size = ids.size();
  const std::string anchor_text = tokenizer.Decode(ids);
  const int known = std::min(vocab_size, tokenizer.vocab_size());
  for (int id = 0; id < known; ++id) {
    if (tokenizer.IsSpecial(id)) {
      table.special[id] = true;
      continue;
    }
    const std::string piece = tokenizer.Piece(id);
    if (piece.empty()) continue;
    if (const int byte = FallbackByte(piece); byte >= 0) {
      table.bytes[id] = std::string(1, static_cast<char>(byte));
      continue;
    }
    // Decoded after the anchor: right for every token whose text is whole characters.
    ids.resize(anchor_size);
    ids.push_back(id);
    const std::string text = tokenizer.Decode(ids);
    if (absl::StartsWith(text, anchor_text) && !absl::StrContains(text, "\xEF\xBF\xBD")) {
      table.bytes[id] = text.substr(anchor_text.size());
      continue;
    }
    // Part of a character: a byte-level piece gives its bytes; anything else (a piece the
    // decoder renders as U+FFFD) is never allowed in a grammar's text.
    std::string bytes;
    if (ByteLevelBytes(piece, &bytes)) table.bytes[id] = std::move(bytes);
  }
  return table;
}

}  // namespace conveyor
