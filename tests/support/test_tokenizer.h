// A small sentencepiece tokenizer for scheduler tests that need real detokenization but
// no model: trained on the spot with the spm_train tool, as BPE with byte fallback, set up
// like tests/model_gen's test models. With byte fallback the 256 byte pieces follow unk,
// bos and eos, so ByteToken(b) is the token that decodes to byte b alone.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "text/tokenizer.h"

namespace conveyor::testing {

inline constexpr int kTestUnkId = 0;
inline constexpr int kTestBosId = 1;
inline constexpr int kTestEosId = 2;

inline int ByteToken(unsigned char byte) { return 3 + byte; }

// Trains and loads the tokenizer; null on failure, which is reported. (Linking
// sentencepiece's trainer instead would bring its private protobuf next to gRPC's; see
// text/sentencepiece_shim.cc.)
inline std::unique_ptr<Tokenizer> TrainTestTokenizer() {
  std::string corpus;
  for (const char* line :
       {"the quick brown fox jumps over the lazy dog", "a scheduler batches requests together",
        "hello world, hello tokenizer, hello again", "tokens stream back to the client",
        "the café serves crème brûlée to a naïve élève", "lines 1, 22 and 333 of the file"}) {
    for (int i = 0; i < 20; ++i) absl::StrAppend(&corpus, line, "\n");
  }
  // Not common/test_temp_dir.h: it names `testing::` from inside namespace conveyor, which
  // this namespace would capture.
  std::string dir = ::testing::TempDir() + "conveyor_tokenizer_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << dir;
    return nullptr;
  }
  struct RemoveDir {
    const std::string& path;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } remove_dir{dir};
  std::ofstream(dir + "/corpus.txt") << corpus;
  const std::string command = absl::StrCat(
      "cd '", dir, "' && spm_train --input=corpus.txt --model_prefix=tokenizer",
      " --vocab_size=400 --model_type=bpe --character_coverage=1.0 --byte_fallback=true",
      " --unk_id=", kTestUnkId, " --bos_id=", kTestBosId, " --eos_id=", kTestEosId,
      " --pad_id=-1 --hard_vocab_limit=false --normalization_rule_name=identity",
      " --remove_extra_whitespaces=false --add_dummy_prefix=true --split_digits=true",
      " --allow_whitespace_only_pieces=true --num_threads=1 > spm_train.log 2>&1");
  if (std::system(command.c_str()) != 0) {
    std::ifstream log(dir + "/spm_train.log");
    ADD_FAILURE() << command << "\n" << log.rdbuf();
    return nullptr;
  }
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) {
    ADD_FAILURE() << tokenizer.status();
    return nullptr;
  }
  return *std::move(tokenizer);
}

}  // namespace conveyor::testing
