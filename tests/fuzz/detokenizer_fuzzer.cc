// Fuzzes the tokenizer's Decode and the scheduler's streamed detokenizer
// (scheduler/detokenizer.h) on arbitrary token ids, and aborts where they break their
// contract:
//  - Decode's text is well-formed UTF-8, whatever the ids (text/tokenizer.h);
//  - every chunk Append and Flush return is well-formed UTF-8;
//  - the chunks, concatenated, are the output decoded in its context: what
//    Decode(context + output) adds to Decode(context), wherever the latter is a prefix of
//    the former. Two documented exceptions are checked for the UTF-8 properties only: a
//    context that ends inside a character (its decode ends in U+FFFD; the detokenizer
//    trims it, so the output's remaining bytes of that character stream as U+FFFD), and,
//    with HF's ByteFallback decoder (the llama2 tokenizer here), a run of byte tokens
//    that is not well-formed UTF-8 as a whole, which decodes to U+FFFD per byte and so can
//    rewrite text already streamed;
//  - a second Flush returns nothing.
//
// Input: a first byte whose low bit picks the tokenizer (0: llama3, byte-level BPE; 1:
// llama2, Metaspace with byte fallback) and whose next bits give how many of the ids
// (0 to IncrementalDetokenizer::kContextTokens) are the prompt; then ids as 2-byte
// little-endian values, modulo the vocabulary plus a few ids past it (which decode to
// nothing); 0xFFFF is -1.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/detokenizer.h"
#include "tests/fuzz/fuzz_support.h"

namespace conveyor::fuzz {
namespace {

// Bounds the cost of one input (each Append decodes a window).
constexpr size_t kMaxIds = 512;

struct FuzzTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  // The byte that each byte-fallback token ("<0xE4>") stands for, -1 for other ids.
  std::vector<int> byte_of;
};

FuzzTokenizer Load(std::string_view name) {
  FuzzTokenizer t{LoadTokenizer(name), {}};
  t.byte_of.assign(t.tokenizer->vocab_size(), -1);
  for (int id = 0; id < t.tokenizer->vocab_size(); ++id) {
    const std::string piece = t.tokenizer->Piece(id);
    if (piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">")) {
      t.byte_of[id] = std::stoi(piece.substr(3, 2), nullptr, 16);
    }
  }
  return t;
}

// Whether some maximal run of byte-fallback tokens in `ids` is not well-formed UTF-8 on
// its own: HF's ByteFallback then renders each of its bytes as U+FFFD.
bool HasIllFormedByteRun(const FuzzTokenizer& t, const std::vector<int>& ids) {
  std::string run;
  for (size_t i = 0; i <= ids.size(); ++i) {
    const int id = i < ids.size() ? ids[i] : -1;
    const int byte = id >= 0 && id < static_cast<int>(t.byte_of.size()) ? t.byte_of[id] : -1;
    if (byte >= 0) {
      run.push_back(static_cast<char>(byte));
      continue;
    }
    if (!IsWellFormedUtf8(run)) return true;
    run.clear();
  }
  return false;
}

std::string Describe(const std::vector<int>& prompt, const std::vector<int>& output) {
  return absl::StrCat("prompt ids: ", absl::StrJoin(prompt, ","),
                      "\noutput ids: ", absl::StrJoin(output, ","));
}

void Check(const FuzzTokenizer& t, const std::vector<int>& prompt, const std::vector<int>& output) {
  const Tokenizer& tokenizer = *t.tokenizer;
  std::vector<int> full = prompt;
  full.insert(full.end(), output.begin(), output.end());
  const std::string full_text = tokenizer.Decode(full);
  const std::string prompt_text = tokenizer.Decode(prompt);
  if (!IsWellFormedUtf8(full_text) || !IsWellFormedUtf8(prompt_text)) {
    InvariantViolated("Decode returned ill-formed UTF-8", Describe(prompt, output));
  }

  scheduler::IncrementalDetokenizer detokenizer(&tokenizer, prompt);
  std::string streamed;
  for (size_t i = 0; i < output.size(); ++i) {
    const std::string chunk = detokenizer.Append(output[i]);
    if (!IsWellFormedUtf8(chunk)) {
      InvariantViolated("Append returned ill-formed UTF-8",
                        absl::StrCat(Describe(prompt, output), "\nat output token ", i));
    }
    streamed += chunk;
  }
  const std::string tail = detokenizer.Flush();
  if (!IsWellFormedUtf8(tail)) {
    InvariantViolated("Flush returned ill-formed UTF-8", Describe(prompt, output));
  }
  streamed += tail;
  if (const std::string again = detokenizer.Flush(); !again.empty()) {
    InvariantViolated("a second Flush returned text",
                      absl::StrCat(Describe(prompt, output), "\nit returned: ", again));
  }

  if (!full_text.starts_with(prompt_text)) return;  // The output rewrote the context.
  // The documented exceptions.
  if (prompt_text.ends_with("\uFFFD") || HasIllFormedByteRun(t, full)) return;
  const std::string expected = full_text.substr(prompt_text.size());
  if (streamed != expected) {
    InvariantViolated("the stream differs from the output decoded in context",
                      absl::StrCat(Describe(prompt, output), "\nstreamed: \"", streamed,
                                   "\"\nexpected: \"", expected, "\""));
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  static const FuzzTokenizer* tokenizers[2] = {new FuzzTokenizer(Load("llama3")),
                                               new FuzzTokenizer(Load("llama2"))};
  if (size < 1) return;
  const FuzzTokenizer& t = *tokenizers[data[0] & 1];
  const size_t prompt_tokens =
      (data[0] >> 1) % (scheduler::IncrementalDetokenizer::kContextTokens + 1);
  // Ids past the vocabulary: models pad theirs beyond the tokenizer's.
  const uint32_t id_range = static_cast<uint32_t>(t.tokenizer->vocab_size()) + 4;
  std::vector<int> ids;
  for (size_t i = 1; i + 1 < size && ids.size() < kMaxIds; i += 2) {
    const uint32_t value = data[i] | static_cast<uint32_t>(data[i + 1]) << 8;
    ids.push_back(value == 0xFFFF ? -1 : static_cast<int>(value % id_range));
  }
  const size_t split = std::min(prompt_tokens, ids.size());
  const std::vector<int> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split));
  const std::vector<int> output(ids.begin() + static_cast<std::ptrdiff_t>(split), ids.end());
  Check(t, prompt, output);
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
