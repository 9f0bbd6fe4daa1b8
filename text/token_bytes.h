// The bytes each token adds to the text, for the grammar matcher of structured output
// (docs/structured-output.md): the worker checks tokens against a grammar byte by byte and
// never holds the tokenizer, so the scheduler sends it this table at Init.
//
// A token's bytes are what it adds in the middle of a text, before any repair of broken
// UTF-8: a byte-level BPE token that holds half a character gives that half; a
// sentencepiece or Metaspace piece "▁the" gives " the"; a byte-fallback piece "<0xE2>"
// gives the byte 0xE2. Concatenated, the bytes of a run of tokens are the run's decoded
// text wherever that is valid UTF-8 (text/token_bytes_test.cc checks this on the
// reference tokenizers). Special tokens get no bytes and are marked: a grammar's text
// never contains them.
#pragma once

#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace conveyor {

struct TokenByteTable {
  std::vector<std::string> bytes;  // [vocab_size]; empty: the token adds no text.
  std::vector<bool> special;       // [vocab_size]
};

// The table for ids [0, vocab_size) (the model's vocabulary, which may be larger than
// the tokenizer's: ids the tokenizer lacks add nothing).
TokenByteTable MakeTokenByteTable(const Tokenizer& tokenizer, int vocab_size);

}  // namespace conveyor
