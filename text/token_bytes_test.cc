// MakeTokenByteTable against decoding: on the reference tokenizers (made with HF's
// `tokenizers`), the bytes of any run of tokens, put after some text, are what decoding
// the text's tokens and the run adds, wherever that is valid UTF-8.
#include "text/token_bytes.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/test_temp_dir.h"
#include "common/utf8.h"
#include "gtest/gtest.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_test_util.h"

namespace conveyor {
namespace {

// Every reference tokenizer but "misc", whose BPE decoder gives a word's last piece a
// space only when another token follows: no per-token table can say that.
constexpr const char* kNames[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral"};

TEST(TokenBytesTest, RunsOfTokensDecodeToTheirBytes) {
  TestTempDir dir;
  ASSERT_TRUE(MakeTokenizerReference(dir, "--sweeps no --strings 5 --decodes 5"));
  std::mt19937 rng(7);
  for (const char* name : kNames) {
    SCOPED_TRACE(name);
    const std::string tokenizer_dir = absl::StrCat(dir.path(), "/", name);
    auto tokenizer = HfTokenizer::Load(tokenizer_dir + "/tokenizer.json",
                                       tokenizer_dir + "/tokenizer_config.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const Tokenizer& t = **tokenizer;
    // Two ids past the tokenizer's, as models pad their vocabulary: they add nothing.
    const TokenByteTable table = MakeTokenByteTable(t, t.vocab_size() + 2);
    ASSERT_EQ(table.bytes.size(), static_cast<size_t>(t.vocab_size() + 2));
    EXPECT_TRUE(table.bytes[t.vocab_size()].empty());

    std::vector<int> ordinary;
    int with_bytes = 0;
    for (int id = 0; id < t.vocab_size(); ++id) {
      EXPECT_EQ(table.special[id], t.IsSpecial(id)) << id;
      if (table.special[id]) {
        EXPECT_TRUE(table.bytes[id].empty()) << id;
        continue;
      }
      ordinary.push_back(id);
      with_bytes += table.bytes[id].empty() ? 0 : 1;
    }
    // Every ordinary token adds text (only unknown-token pieces could not).
    EXPECT_GE(with_bytes, static_cast<int>(ordinary.size()) - 1);

    const std::vector<int> context = *t.Encode("Hello world");
    const std::string context_text = t.Decode(context);
    std::uniform_int_distribution<size_t> pick(0, ordinary.size() - 1);
    int compared = 0;
    for (int round = 0; round < 2000; ++round) {
      std::vector<int> ids = context;
      std::string bytes;
      const int length = 1 + round % 8;
      for (int i = 0; i < length; ++i) {
        const int id = ordinary[pick(rng)];
        ids.push_back(id);
        bytes += table.bytes[id];
      }
      if (FindInvalidUtf8(bytes) != std::string::npos) continue;
      ++compared;
      ASSERT_EQ(t.Decode(ids), context_text + bytes) << "round " << round;
    }
    EXPECT_GE(compared, 500);
  }
}

}  // namespace
}  // namespace conveyor
