#include "text/tokenizer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/sentencepiece_compat.h"

namespace conveyor {
namespace {

using ::testing::Each;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Lt;
using ::testing::Not;

constexpr int kVocabSize = 96;

// A little English text: enough for BPE to learn `kVocabSize` pieces.
std::string TrainingText() {
  std::string text;
  for (const char* line :
       {"the quick brown fox jumps over the lazy dog", "a scheduler batches requests together",
        "every worker owns one shard of the model weights", "tokens stream back to the client",
        "hello world, hello tokenizer", "continuous batching keeps the accelerator busy",
        "blocks of the cache are shared between requests with the same prefix"}) {
    for (int i = 0; i < 20; ++i) absl::StrAppend(&text, line, "\n");
  }
  return text;
}

class TokenizerTest : public ::testing::Test {
 protected:
  // Trains `<dir>/tokenizer.model` with sentencepiece's own trainer.
  void SetUp() override {
    const std::string corpus = dir_.WriteFile("corpus.txt", TrainingText());
    const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(
        absl::StrCat("--input=", corpus, " --model_prefix=", dir_.path(), "/tokenizer",
                     " --vocab_size=", kVocabSize,
                     " --model_type=bpe --character_coverage=1.0 --minloglevel=2"));
    ASSERT_TRUE(status.ok()) << status.ToString();
  }

  std::unique_ptr<Tokenizer> LoadOrDie() {
    auto tokenizer = Tokenizer::Load(dir_.path());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
  }

  TestTempDir dir_;
};

TEST_F(TokenizerTest, ReportsVocabularyAndSpecialIds) {
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), kVocabSize);
  EXPECT_EQ(tokenizer->bos_id(), 1);  // sentencepiece's defaults: unk 0, bos 1, eos 2.
  EXPECT_EQ(tokenizer->eos_id(), 2);
}

TEST_F(TokenizerTest, SpecialTokensFrameTheSequence) {
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->kind(), "sentencepiece");
  auto ids = tokenizer->Encode("hello world");
  auto framed = tokenizer->EncodeWithSpecialTokens("hello world");
  ASSERT_TRUE(ids.ok() && framed.ok());
  ids->insert(ids->begin(), tokenizer->bos_id());  // sentencepiece frames with BOS only.
  EXPECT_EQ(*framed, *ids);
  EXPECT_TRUE(tokenizer->IsSpecial(tokenizer->bos_id()));
  EXPECT_TRUE(tokenizer->IsSpecial(tokenizer->eos_id()));
  EXPECT_TRUE(tokenizer->IsSpecial(0));  // unk
  EXPECT_FALSE(tokenizer->IsSpecial((*ids)[1]));
  EXPECT_FALSE(tokenizer->IsSpecial(kVocabSize));
  EXPECT_EQ(tokenizer->pad_id(), -1);
}

TEST_F(TokenizerTest, EncodeDecodeRoundTrips) {
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "hello world, the quick brown fox";
  auto ids = tokenizer->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, Not(IsEmpty()));
  EXPECT_THAT(*ids, Each(Ge(3)));  // No BOS, EOS or unknown.
  EXPECT_THAT(*ids, Each(Lt(kVocabSize)));
  EXPECT_EQ(tokenizer->Decode(*ids), text);
}

TEST_F(TokenizerTest, EncodesEmptyText) {
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  auto ids = tokenizer->Encode("");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, IsEmpty());
  EXPECT_EQ(tokenizer->Decode({}), "");
}

TEST_F(TokenizerTest, DecodeSkipsIdsOutsideVocabulary) {
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  auto ids = tokenizer->Encode("hello world");
  ASSERT_TRUE(ids.ok()) << ids.status();
  std::vector<int> padded = {-1, kVocabSize};
  padded.insert(padded.end(), ids->begin(), ids->end());
  padded.push_back(kVocabSize + 1000);
  EXPECT_EQ(tokenizer->Decode(padded), "hello world");
}

TEST(TokenizerLoadTest, MissingModelIsNotFoundNamingPath) {
  TestTempDir dir;
  auto tokenizer = Tokenizer::Load(dir.path());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(dir.path() + "/tokenizer.model"));
}

TEST(TokenizerLoadTest, CorruptModelIsDataLossNamingPath) {
  TestTempDir dir;
  const std::string path = dir.WriteFile("tokenizer.model", "this is not a protobuf \xff\xfe");
  auto tokenizer = Tokenizer::Load(dir.path());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(path));
}

// Special tokens in the text are cut out and become their ids, as HF's LlamaTokenizer does
// (a chat template's "{{ bos_token }}" is the BOS id, not the pieces of "<s>"), with the
// dummy prefix after them as its `legacy` setting says.
TEST_F(TokenizerTest, SpecialTokenTextBecomesItsIdLegacy) {
  dir_.WriteFile("tokenizer_config.json", R"({"legacy": true})");
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  auto hello = tokenizer->Encode("hello world");
  auto ids = tokenizer->Encode("<s>hello world</s><unk>");
  ASSERT_TRUE(hello.ok() && ids.ok());
  // Legacy: each stretch is encoded alone, dummy prefix and all.
  std::vector<int> expected = {1};
  expected.insert(expected.end(), hello->begin(), hello->end());
  expected.push_back(2);
  expected.push_back(0);
  EXPECT_EQ(*ids, expected);
  EXPECT_EQ(tokenizer->Piece((*ids)[1]).rfind("\u2581", 0), 0u);
  // Text that only looks like one stays text; so does text in the middle of a word.
  auto near = tokenizer->Encode("<s hello");
  ASSERT_TRUE(near.ok());
  EXPECT_THAT(*near, Each(::testing::Ne(1)));
  auto framed = tokenizer->EncodeWithSpecialTokens("hello<s>");
  ASSERT_TRUE(framed.ok());
  EXPECT_EQ(framed->front(), 1);
  EXPECT_EQ(framed->back(), 1);
}

TEST_F(TokenizerTest, SpecialTokenTextNonLegacyHasNoDummyPrefixAfterIt) {
  dir_.WriteFile("tokenizer_config.json", R"({"legacy": false, "added_tokens_decoder": {
      "5": {"content": "[X]", "special": true}}})");
  auto tokenizer = LoadOrDie();
  ASSERT_NE(tokenizer, nullptr);
  auto ids = tokenizer->Encode("<s>hello[X] world");
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 4u);
  EXPECT_EQ((*ids)[0], 1);
  // "hello" right after <s>: no "▁" in front (HF legacy=False).
  EXPECT_NE(tokenizer->Piece((*ids)[1]).rfind("\u2581", 0), 0u) << tokenizer->Piece((*ids)[1]);
  const auto added = std::find(ids->begin(), ids->end(), 5);
  ASSERT_NE(added, ids->end());  // The added token of tokenizer_config.json.
  // " world": its own space is kept, as one "▁".
  EXPECT_EQ(tokenizer->Piece(*(added + 1)).rfind("\u2581", 0), 0u);
  auto start = tokenizer->Encode("<s>hello");
  ASSERT_TRUE(start.ok());
  EXPECT_EQ(tokenizer->Decode(*start), "hello");
  // The start of a text keeps its dummy prefix.
  auto plain = tokenizer->Encode("hello world");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(tokenizer->Piece(plain->front()).rfind("\u2581", 0), 0u);
}

}  // namespace
}  // namespace conveyor
