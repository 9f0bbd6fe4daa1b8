#include "text/tokenizer.h"

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

}  // namespace
}  // namespace conveyor
