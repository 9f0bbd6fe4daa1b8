// tokenizer_bench: encode (and decode) throughput of conveyor::Tokenizer on one thread.
//
// Loads the tokenizer in --tokenizer (a model directory: tokenizer.json or
// tokenizer.model), reads --texts (a JSON array of strings), encodes every string
// (Encode, no special tokens) in a loop for at least --min_seconds after one warm-up
// pass, and reports MB/s of input text; then decodes the ids the same way. Prints one
// JSON object. run_tokenizer_bench.sh runs it next to HF's `tokenizers` on the same texts.
//
//   tokenizer_bench --tokenizer=DIR --texts=texts.json [--min_seconds=2] [--ids_out=FILE]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "", "model directory holding tokenizer.json or tokenizer.model");
ABSL_FLAG(std::string, texts, "", "JSON array of the strings to encode");
ABSL_FLAG(double, min_seconds, 2.0, "time each measurement runs at least");
ABSL_FLAG(std::string, ids_out, "", "if set, write the ids of every string here (JSON)");

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) {
  std::cerr << "tokenizer_bench: " << message << "\n";
  std::exit(1);
}

// Runs `pass` (one pass over all texts) until `min_seconds` have gone by; returns
// seconds per pass.
template <typename Pass>
double SecondsPerPass(double min_seconds, Pass pass) {
  pass();  // Warm-up: caches, page faults.
  int passes = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    pass();
    ++passes;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_seconds);
  return elapsed / passes;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_tokenizer);
  const std::string texts_path = absl::GetFlag(FLAGS_texts);
  if (dir.empty() || texts_path.empty()) Die("--tokenizer and --texts are required");
  auto tokenizer = conveyor::Tokenizer::Load(dir);
  if (!tokenizer.ok()) Die(tokenizer.status().ToString());

  std::ifstream in(texts_path, std::ios::binary);
  const nlohmann::json parsed = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_array()) Die(texts_path + " is not a JSON array");
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (const auto& t : parsed) {
    if (!t.is_string()) Die(texts_path + " holds a non-string");
    texts.push_back(t.get<std::string>());
    bytes += texts.back().size();
  }

  std::vector<std::vector<int>> ids(texts.size());
  size_t tokens = 0;
  const double encode_seconds = SecondsPerPass(absl::GetFlag(FLAGS_min_seconds), [&] {
    tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      auto encoded = (*tokenizer)->Encode(texts[i]);
      if (!encoded.ok()) Die(encoded.status().ToString());
      ids[i] = *std::move(encoded);
      tokens += ids[i].size();
    }
  });
  size_t decoded_bytes = 0;
  const double decode_seconds = SecondsPerPass(absl::GetFlag(FLAGS_min_seconds), [&] {
    decoded_bytes = 0;
    for (const std::vector<int>& sequence : ids)
      decoded_bytes += (*tokenizer)->Decode(sequence).size();
  });

  if (const std::string out = absl::GetFlag(FLAGS_ids_out); !out.empty()) {
    std::ofstream(out) << nlohmann::json(ids).dump();
  }
  nlohmann::json report = {
      {"tokenizer", dir},
      {"kind", std::string((*tokenizer)->kind())},
      {"texts", texts.size()},
      {"bytes", bytes},
      {"tokens", tokens},
      {"encode_mb_per_s", bytes / encode_seconds / 1e6},
      {"encode_tokens_per_s", tokens / encode_seconds},
      {"decode_mb_per_s", decoded_bytes / decode_seconds / 1e6},
  };
  std::cout << report.dump() << "\n";
  return 0;
}
