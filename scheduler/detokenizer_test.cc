#include "scheduler/detokenizer.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/test_temp_dir.h"
#include "common/tokenizer.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

// With byte fallback, sentencepiece puts the 256 byte pieces right after unk, bos, eos.
constexpr int kFirstByteId = 3;

int ByteId(unsigned char byte) { return kFirstByteId + byte; }

// A little text with a few accented letters; "ö", CJK and emoji are left out, so they
// encode as byte-fallback tokens.
std::string TrainingText() {
  std::string text;
  for (const char* line :
       {"the quick brown fox jumps over the lazy dog", "a scheduler batches requests together",
        "hello world, hello tokenizer, hello again", "tokens stream back to the client",
        "the café serves crème brûlée to a naïve élève", "lines 1, 22 and 333 of the file",
        "continuous batching keeps the accelerator busy"}) {
    for (int i = 0; i < 20; ++i) absl::StrAppend(&text, line, "\n");
  }
  return text;
}

// Whether `text` is complete, valid UTF-8 (overlong forms aside).
bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80         ? 1
                          : lead >> 5 == 0x6  ? 2
                          : lead >> 4 == 0xE  ? 3
                          : lead >> 3 == 0x1E ? 4
                                              : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t j = 1; j < length; ++j) {
      if ((static_cast<unsigned char>(text[i + j]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

class DetokenizerTest : public ::testing::Test {
 protected:
  // Trains a BPE tokenizer with byte fallback with the spm_train tool, set up as
  // tests/model_gen's test models. (Linking sentencepiece's trainer instead would bring
  // its private protobuf next to gRPC's; see common/sentencepiece_shim.cc.)
  static void SetUpTestSuite() {
    TestTempDir dir;
    dir.WriteFile("corpus.txt", TrainingText());
    const std::string command = absl::StrCat(
        "cd '", dir.path(), "' && spm_train --input=corpus.txt --model_prefix=tokenizer",
        " --vocab_size=400 --model_type=bpe --character_coverage=1.0 --byte_fallback=true",
        " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --hard_vocab_limit=false",
        " --normalization_rule_name=identity --remove_extra_whitespaces=false",
        " --add_dummy_prefix=true --split_digits=true --allow_whitespace_only_pieces=true",
        " --num_threads=1 > spm_train.log 2>&1");
    const int exit_code = std::system(command.c_str());
    std::ifstream log(dir.path() + "/spm_train.log");
    ASSERT_EQ(exit_code, 0) << command << "\n" << log.rdbuf();
    auto tokenizer = Tokenizer::Load(dir.path());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  static void TearDownTestSuite() { tokenizer_.reset(); }

  void SetUp() override { ASSERT_NE(tokenizer_, nullptr); }

  static std::vector<int> Encode(std::string_view text) {
    auto ids = tokenizer_->Encode(text);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *std::move(ids) : std::vector<int>();
  }

  // What each Append returned for `output`, in context `prompt`, then what Flush did.
  static std::vector<std::string> Stream(std::span<const int> prompt,
                                         const std::vector<int>& output) {
    IncrementalDetokenizer detokenizer(tokenizer_.get(), prompt);
    std::vector<std::string> chunks;
    chunks.reserve(output.size() + 1);
    for (int id : output) chunks.push_back(detokenizer.Append(id));
    chunks.push_back(detokenizer.Flush());
    return chunks;
  }

  static inline std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(DetokenizerTest, ByteIdsDecodeToTheirBytes) {
  EXPECT_EQ(tokenizer_->Decode({ByteId('A'), ByteId('\n')}), "A\n");
}

TEST_F(DetokenizerTest, StreamsEncodedTextAsDecodeDoes) {
  for (const std::string text :
       {"héllo wörld 你好 🚀", "the quick brown fox", "  two  spaces,\nnew line\ttab  ",
        "🚀🚀 12345 ö", "naïve café, 你好吗?"}) {
    SCOPED_TRACE(text);
    const std::vector<int> ids = Encode(text);
    const std::vector<std::string> chunks = Stream({}, ids);
    EXPECT_EQ(absl::StrJoin(chunks, ""), tokenizer_->Decode(ids));
    EXPECT_EQ(absl::StrJoin(chunks, ""), text);
    for (const std::string& chunk : chunks) EXPECT_TRUE(IsValidUtf8(chunk)) << chunk;
  }
}

TEST_F(DetokenizerTest, HoldsBackBytesUntilTheCharacterIsComplete) {
  IncrementalDetokenizer detokenizer(tokenizer_.get(), Encode("rocket"));
  EXPECT_EQ(detokenizer.Append(ByteId(0xF0)), "");
  EXPECT_EQ(detokenizer.Append(ByteId(0x9F)), "");
  EXPECT_EQ(detokenizer.Append(ByteId(0x9A)), "");
  EXPECT_EQ(detokenizer.Append(ByteId(0x80)), "🚀");
  EXPECT_EQ(detokenizer.Flush(), "");
}

TEST_F(DetokenizerTest, FlushRendersAnIncompleteCharacterAsDecodeDoes) {
  IncrementalDetokenizer detokenizer(tokenizer_.get(), {});
  EXPECT_EQ(detokenizer.Append(ByteId('a')), "a");
  EXPECT_EQ(detokenizer.Append(ByteId(0xE4)), "");
  EXPECT_EQ(detokenizer.Append(ByteId(0xBD)), "");
  const std::string held = detokenizer.Flush();
  EXPECT_EQ(held, "\uFFFD\uFFFD");
  EXPECT_EQ("a" + held, tokenizer_->Decode({ByteId('a'), ByteId(0xE4), ByteId(0xBD)}));
  EXPECT_EQ(detokenizer.Flush(), "");
}

TEST_F(DetokenizerTest, PromptContextKeepsTheFirstTokensLeadingSpace) {
  const std::vector<int> full = Encode("hello world, the café 你好 again");
  const std::string full_text = tokenizer_->Decode(full);
  for (std::ptrdiff_t split = 1; split < std::ssize(full); ++split) {
    SCOPED_TRACE(split);
    const std::vector<int> prompt(full.begin(), full.begin() + split);
    const std::vector<int> output(full.begin() + split, full.end());
    const std::string streamed = absl::StrJoin(Stream(prompt, output), "");
    if (tokenizer_->Decode(prompt).ends_with("\uFFFD")) {
      // A prompt that ends inside a character: its bytes stay with the prompt, and the
      // output's remaining bytes of that character are stray ones.
      EXPECT_TRUE(streamed.starts_with("\uFFFD")) << streamed;
      EXPECT_TRUE(streamed.ends_with(" again")) << streamed;
      continue;
    }
    EXPECT_EQ(streamed, full_text.substr(tokenizer_->Decode(prompt).size()));
  }
  // "▁world" at the start of a text drops its space; after the prompt it keeps it.
  const std::vector<int> hello = Encode("hello");
  ASSERT_TRUE(std::equal(hello.begin(), hello.end(), full.begin()));
  const std::vector<int> world(full.begin() + std::ssize(hello), full.end());
  EXPECT_EQ(absl::StrJoin(Stream(hello, world), ""), " world, the café 你好 again");
  EXPECT_EQ(absl::StrJoin(Stream({}, world), ""), "world, the café 你好 again");
}

TEST_F(DetokenizerTest, WindowDoesNotGrowWithTheOutput) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the café serves 你好 🚀🚀 to 22 naïve élèves. ";
  const std::vector<int> output = Encode(text);
  IncrementalDetokenizer detokenizer(tokenizer_.get(), {});
  std::string streamed;
  size_t longest_window = 0;
  for (int id : output) {
    streamed += detokenizer.Append(id);
    longest_window = std::max(longest_window, detokenizer.window_tokens());
  }
  EXPECT_EQ(streamed, text);
  EXPECT_GT(output.size(), 1000U);
  // At most an emoji's 4 byte tokens, just streamed, and 3 of the next one's.
  EXPECT_LE(longest_window, 7U);
}

// Random ids, heavy on byte-fallback pieces (whole, cut short and stray bytes of
// multi-byte characters), with control ids and ids outside the vocabulary.
std::vector<int> RandomIds(std::mt19937& rng, int vocab_size, size_t min_length) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<int> ids;
  const size_t length = min_length + uniform(0, 40);
  while (ids.size() < length) {
    switch (uniform(0, 5)) {
      case 0:
      case 1:
        ids.push_back(uniform(0, vocab_size - 1));
        break;
      case 2: {  // A 2-, 3- or 4-byte character, sometimes missing its last bytes.
        const int bytes = uniform(2, 4);
        const int kept = uniform(0, 2) == 0 ? uniform(1, bytes) : bytes;
        const int lead = bytes == 2   ? uniform(0xC2, 0xDF)
                         : bytes == 3 ? uniform(0xE1, 0xEC)
                                      : uniform(0xF0, 0xF3);
        ids.push_back(ByteId(lead));
        for (int i = 1; i < kept; ++i) ids.push_back(ByteId(uniform(0x90, 0xBF)));
        break;
      }
      case 3:
        ids.push_back(ByteId(uniform(0, 255)));
        break;
      case 4:
        ids.push_back(uniform(0, 2));  // unk, bos, eos
        break;
      default:
        ids.push_back(uniform(0, 9) == 0 ? -1 : vocab_size + uniform(0, 9));
    }
  }
  return ids;
}

TEST_F(DetokenizerTest, RandomOutputStreamsAsDecodeDoes) {
  std::mt19937 rng(20240611);
  const std::vector<int> prompt = Encode("the café serves 你好");
  for (int round = 0; round < 3000; ++round) {
    const std::vector<int> output = RandomIds(rng, tokenizer_->vocab_size(), 1);
    SCOPED_TRACE(absl::StrCat("output ids: ", absl::StrJoin(output, ",")));
    const std::vector<std::string> chunks = Stream({}, output);
    EXPECT_EQ(absl::StrJoin(chunks, ""), tokenizer_->Decode(output));
    for (const std::string& chunk : chunks) EXPECT_TRUE(IsValidUtf8(chunk));

    std::vector<int> full = prompt;
    full.insert(full.end(), output.begin(), output.end());
    EXPECT_EQ(absl::StrJoin(Stream(prompt, output), ""),
              tokenizer_->Decode(full).substr(tokenizer_->Decode(prompt).size()));
    if (HasFailure()) break;
  }
}

TEST_F(DetokenizerTest, EmitsCompleteTextWithoutWaitingForFlush) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<int> output = RandomIds(rng, tokenizer_->vocab_size(), 1);
    // Ends in a complete character that decodes the same anywhere.
    output.push_back(ByteId('.'));
    SCOPED_TRACE(absl::StrCat("output ids: ", absl::StrJoin(output, ",")));
    EXPECT_EQ(Stream({}, output).back(), "");
  }
}

}  // namespace
}  // namespace conveyor::scheduler
