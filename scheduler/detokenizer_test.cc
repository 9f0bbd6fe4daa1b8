#include "scheduler/detokenizer.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/test_temp_dir.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler/stop_matcher.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_test_util.h"
#include "text/tokenizer.h"

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

// Trains a BPE tokenizer with byte fallback with the spm_train tool, set up as
// tests/model_gen's test models (unless `remove_extra_whitespaces`), and loads it; null
// on failure, which is reported. (Linking sentencepiece's trainer instead would bring its
// private protobuf next to gRPC's; see text/sentencepiece_shim.cc.)
std::unique_ptr<Tokenizer> TrainTokenizer(bool remove_extra_whitespaces = false) {
  TestTempDir dir;
  dir.WriteFile("corpus.txt", TrainingText());
  const std::string command = absl::StrCat(
      "cd '", dir.path(), "' && spm_train --input=corpus.txt --model_prefix=tokenizer",
      " --vocab_size=400 --model_type=bpe --character_coverage=1.0 --byte_fallback=true",
      " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --hard_vocab_limit=false",
      " --normalization_rule_name=identity --remove_extra_whitespaces=",
      remove_extra_whitespaces ? "true" : "false",
      " --add_dummy_prefix=true --split_digits=true --allow_whitespace_only_pieces=true",
      " --num_threads=1 > spm_train.log 2>&1");
  const int exit_code = std::system(command.c_str());
  if (exit_code != 0) {
    std::ifstream log(dir.path() + "/spm_train.log");
    ADD_FAILURE() << command << "\n" << log.rdbuf();
    return nullptr;
  }
  auto tokenizer = Tokenizer::Load(dir.path());
  if (!tokenizer.ok()) {
    ADD_FAILURE() << tokenizer.status();
    return nullptr;
  }
  return *std::move(tokenizer);
}

class DetokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = TrainTokenizer(); }

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

// The detokenizer as it was before the anchor: after each emission it decoded the tokens
// just streamed alone for the prefix's size, two Decode calls per token. With this file's
// tokenizer the anchor must not change what any step emits (with remove_extra_whitespaces
// the two differ where this one was wrong; see DetokenizerWithoutExtraWhitespaceTest).
class TwoDecodeDetokenizer {
 public:
  TwoDecodeDetokenizer(const Tokenizer* tokenizer, std::span<const int> prompt)
      : tokenizer_(tokenizer) {
    const std::span<const int> context =
        prompt.last(std::min(prompt.size(), IncrementalDetokenizer::kContextTokens));
    window_.assign(context.begin(), context.end());
    while (!window_.empty() && tokenizer_->Decode(window_).ends_with("\uFFFD")) {
      window_.pop_back();
    }
    prefix_tokens_ = window_.size();
    prefix_text_bytes_ = tokenizer_->Decode(window_).size();
  }

  std::string Append(int token_id) {
    window_.push_back(token_id);
    const std::string text = tokenizer_->Decode(window_);
    if (text.ends_with("\uFFFD")) return "";
    return TakeNewText(text);
  }

  std::string Flush() { return TakeNewText(tokenizer_->Decode(window_)); }

 private:
  std::string TakeNewText(const std::string& window_text) {
    // As the product does since the fuzzer found it: a cut that falls inside a character
    // (the prefix's text was rewritten, e.g. a stray byte turned into U+FFFD) moves on to
    // the next one, so that no chunk starts with a continuation byte.
    const size_t begin = NextCharStart(window_text, prefix_text_bytes_);
    if (window_text.size() <= begin) return "";
    std::string new_text = window_text.substr(begin);
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(prefix_tokens_));
    prefix_tokens_ = window_.size();
    prefix_text_bytes_ = tokenizer_->Decode(window_).size();
    return new_text;
  }

  const Tokenizer* tokenizer_;
  std::vector<int> window_;
  size_t prefix_tokens_;
  size_t prefix_text_bytes_;
};

// Streams `output` in context `prompt` through both detokenizers, calling Flush after the
// tokens whose indices are in `flush_after` (and at the end), and expects the same chunks.
void ExpectSameChunksAsTwoDecode(const Tokenizer* tokenizer, std::span<const int> prompt,
                                 const std::vector<int>& output,
                                 const std::vector<size_t>& flush_after = {}) {
  IncrementalDetokenizer detokenizer(tokenizer, prompt);
  TwoDecodeDetokenizer reference(tokenizer, prompt);
  for (size_t i = 0; i < output.size(); ++i) {
    ASSERT_EQ(detokenizer.Append(output[i]), reference.Append(output[i])) << "token " << i;
    if (std::find(flush_after.begin(), flush_after.end(), i) != flush_after.end()) {
      ASSERT_EQ(detokenizer.Flush(), reference.Flush()) << "flush after token " << i;
    }
  }
  ASSERT_EQ(detokenizer.Flush(), reference.Flush()) << "final flush";
}

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
    // A text that starts with a space encodes without the dummy "▁" (as transformers 5's
    // Llama tokenizer does), and decoding drops one leading space (HF's decoder too), so
    // only the others come back whole.
    if (!text.starts_with(" ")) EXPECT_EQ(absl::StrJoin(chunks, ""), text);
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

// --- One Decode call per token: the anchor ---------------------------------------------

// Text that exercises what the anchor must not change: leading spaces, whitespace-only
// pieces, accented letters in the vocabulary, CJK and emoji as byte-fallback tokens, and
// characters outside the training text ('#', '!', '?') as single byte tokens.
constexpr std::string_view kMixedText =
    "hello world, the café serves 你好 🚀🚀 to 22 naïve élèves.  two  spaces,\nnew "
    "line\ttab ### done! ö 你好吗?";

TEST_F(DetokenizerTest, DecodesOncePerTokenPastTheFirstEmissions) {
  std::string text;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&text, std::string(kMixedText), " ");
  const std::vector<int> output = Encode(text);
  for (const std::vector<int>& prompt : {std::vector<int>(), Encode("the quick brown fox"),
                                         std::vector<int>{tokenizer_->bos_id()}}) {
    SCOPED_TRACE(absl::StrCat("prompt: ", absl::StrJoin(prompt, ",")));
    IncrementalDetokenizer detokenizer(tokenizer_.get(), prompt);
    std::string streamed;
    for (int id : output) streamed += detokenizer.Append(id);
    streamed += detokenizer.Flush();
    std::vector<int> full = prompt;
    full.insert(full.end(), output.begin(), output.end());
    EXPECT_EQ(streamed, tokenizer_->Decode(full).substr(tokenizer_->Decode(prompt).size()));
    // One call per Append and the Flush; besides, at most: the context's, the new
    // tokens alone after the first emission at the text's start, and the anchor's check.
    EXPECT_LE(detokenizer.decode_calls(), output.size() + 1 + 3);
    EXPECT_GE(detokenizer.decode_calls(), output.size() + 1);
  }
}

TEST_F(DetokenizerTest, MatchesTheTwoDecodeDetokenizerChunkForChunk) {
  const std::vector<std::string> texts = {
      std::string(kMixedText), "hello", " hello", "  hello", "🚀 hello",    "你好", "\n\n hi",
      "### the end",           "a",     " ",      "café",    "!!! ??? ###"};
  const std::vector<std::vector<int>> prompts = {
      {},
      {tokenizer_->bos_id()},
      Encode("hello"),
      Encode("the café serves 你好"),
      Encode(" "),
      {ByteId(0xE4), ByteId(0xBD)},  // Ends inside a character.
      {ByteId('a'), ByteId(0xF0), ByteId(0x9F), ByteId(0x9A), ByteId(0x80)},
      {tokenizer_->bos_id(), tokenizer_->eos_id()},
  };
  for (const std::vector<int>& prompt : prompts) {
    for (const std::string& text : texts) {
      SCOPED_TRACE(absl::StrCat("prompt: ", absl::StrJoin(prompt, ","), " text: ", text));
      ExpectSameChunksAsTwoDecode(tokenizer_.get(), prompt, Encode(text));
    }
  }
}

TEST_F(DetokenizerTest, MatchesTheTwoDecodeDetokenizerOnRandomIds) {
  std::mt19937 rng(31337);
  const std::vector<int> prompt = Encode("the café serves 你好");
  for (int round = 0; round < 2000; ++round) {
    const std::vector<int> output = RandomIds(rng, tokenizer_->vocab_size(), 1);
    SCOPED_TRACE(absl::StrCat("output ids: ", absl::StrJoin(output, ",")));
    ExpectSameChunksAsTwoDecode(tokenizer_.get(), {}, output);
    ExpectSameChunksAsTwoDecode(tokenizer_.get(), prompt, output);
    // Appends after a Flush are outside the contract; the anchor changes nothing there
    // either.
    ExpectSameChunksAsTwoDecode(tokenizer_.get(), prompt, output,
                                {std::uniform_int_distribution<size_t>(0, output.size())(rng)});
    if (HasFailure()) break;
  }
}

TEST_F(DetokenizerTest, LeadingSpaceOnlyDropsAtTheTextsStart) {
  const std::vector<int> output = Encode("hello world again");
  ASSERT_GE(output.size(), 3U);
  ASSERT_EQ(tokenizer_->Piece(output[0]).rfind("\u2581", 0), 0U) << tokenizer_->Piece(output[0]);
  // Without context, and after a control token only, the first piece's "▁" is the
  // text's start; every later piece keeps it, the ones streamed behind the anchor too.
  for (const std::vector<int>& prompt :
       {std::vector<int>(), std::vector<int>{tokenizer_->bos_id()}}) {
    const std::vector<std::string> chunks = Stream(prompt, output);
    EXPECT_EQ(absl::StrJoin(chunks, ""), "hello world again");
    EXPECT_FALSE(chunks.front().starts_with(" ")) << chunks.front();
  }
  // After context that renders text, the first piece keeps its space too.
  EXPECT_EQ(absl::StrJoin(Stream(Encode("say"), output), ""), " hello world again");
  // Whitespace-only pieces at the start: only the first "▁" is dropped. (These texts
  // start with a space, so they encode without the dummy "▁", as transformers 5 does, and
  // come back less their first space, as from HF's decode.)
  for (const std::string text : {"   x y", " \n x", "  "}) {
    SCOPED_TRACE(text);
    const std::vector<int> spaces = Encode(text);
    EXPECT_EQ(tokenizer_->Decode(spaces), text.substr(1));
    EXPECT_EQ(absl::StrJoin(Stream({}, spaces), ""), text.substr(1));
    EXPECT_EQ(absl::StrJoin(Stream(std::vector<int>{tokenizer_->bos_id()}, spaces), ""),
              text.substr(1));
  }
}

TEST_F(DetokenizerTest, ByteFallbackCharacterSplitAcrossStepsBehindTheAnchor) {
  // "go" streams first (the anchor is checked then), then the rocket's four byte tokens,
  // one per step, then more text.
  std::vector<int> output = Encode("go on");
  for (unsigned char byte : std::string_view("🚀")) output.push_back(ByteId(byte));
  const std::vector<int> tail = Encode("now 你好");  // "▁now": the dummy prefix's space.
  output.insert(output.end(), tail.begin(), tail.end());
  IncrementalDetokenizer detokenizer(tokenizer_.get(), Encode("rocket"));
  std::vector<std::string> chunks;
  chunks.reserve(output.size() + 1);
  for (int id : output) chunks.push_back(detokenizer.Append(id));
  chunks.push_back(detokenizer.Flush());
  const size_t first_byte = Encode("go on").size();
  EXPECT_EQ(chunks[first_byte], "");
  EXPECT_EQ(chunks[first_byte + 1], "");
  EXPECT_EQ(chunks[first_byte + 2], "");
  EXPECT_EQ(chunks[first_byte + 3], "🚀");
  EXPECT_EQ(absl::StrJoin(chunks, ""), " go on🚀 now 你好");
  for (const std::string& chunk : chunks) EXPECT_TRUE(IsValidUtf8(chunk)) << chunk;
}

TEST_F(DetokenizerTest, StrayContinuationBytesAfterACompleteCharacter) {
  // "é" as byte tokens completes a character; the continuation byte after it is stray and
  // must decode to U+FFFD on its own, not join the "é" before it (nor the anchor).
  const std::vector<int> output = {ByteId('a'), ByteId(0xC3), ByteId(0xA9), ByteId(0xA9),
                                   ByteId('b'), ByteId(0xE4), ByteId('c')};
  for (const std::vector<int>& prompt : {std::vector<int>(), Encode("hello")}) {
    std::vector<int> full = prompt;
    full.insert(full.end(), output.begin(), output.end());
    const std::string expected = tokenizer_->Decode(full).substr(tokenizer_->Decode(prompt).size());
    EXPECT_EQ(expected, "a\u00E9\uFFFDb\uFFFDc");
    EXPECT_EQ(absl::StrJoin(Stream(prompt, output), ""), expected);
    ExpectSameChunksAsTwoDecode(tokenizer_.get(), prompt, output);
  }
}

TEST_F(DetokenizerTest, OutputOfByteTokensOnlyNeedsNoAnchor) {
  // No token here can anchor (all are byte-fallback): every emission decodes the new
  // tokens alone, as before the anchor, and the text is still right.
  std::vector<int> output;
  for (int i = 0; i < 30; ++i) {
    for (unsigned char byte : std::string_view("你🚀é")) output.push_back(ByteId(byte));
  }
  IncrementalDetokenizer detokenizer(tokenizer_.get(), {});
  std::string streamed;
  for (int id : output) streamed += detokenizer.Append(id);
  streamed += detokenizer.Flush();
  EXPECT_EQ(streamed, tokenizer_->Decode(output));
  // One call per token, one more per emitted character (3 per 9 tokens).
  EXPECT_LE(detokenizer.decode_calls(), output.size() + 1 + output.size() / 3);
  ExpectSameChunksAsTwoDecode(tokenizer_.get(), {}, output);
}

TEST_F(DetokenizerTest, StopStringsSpanningTokensCutTheStreamedText) {
  // Stop strings made of several pieces, of byte-fallback tokens ('#' is not in the
  // training text) and of multi-byte characters split over byte tokens.
  struct Case {
    std::string stop;
    std::string expected;
  };
  const std::string text(kMixedText);
  for (const Case& c : {Case{"###", text.substr(0, text.find("###"))},
                        Case{" ###", text.substr(0, text.find(" ###"))},
                        Case{"café serves", text.substr(0, text.find("café serves"))},
                        Case{"你好 🚀", text.substr(0, text.find("你好 🚀"))},
                        Case{"🚀🚀 to", text.substr(0, text.find("🚀🚀 to"))}, Case{"world,", "hello "},
                        Case{"not there", text}}) {
    SCOPED_TRACE(c.stop);
    for (const std::vector<int>& prompt : {std::vector<int>(), Encode("say")}) {
      IncrementalDetokenizer detokenizer(tokenizer_.get(), prompt);
      StopMatcher matcher({c.stop});
      std::string streamed;
      bool stopped = false;
      for (int id : Encode(text)) {
        const StopMatcher::Result result = matcher.Feed(detokenizer.Append(id));
        streamed += result.emit;
        if ((stopped = result.stopped)) break;
      }
      if (!stopped) {
        const StopMatcher::Result result = matcher.Feed(detokenizer.Flush());
        streamed += result.emit;
        stopped = result.stopped;
        if (!stopped) streamed += matcher.Flush();
      }
      const std::string expected = prompt.empty() ? c.expected : " " + c.expected;
      EXPECT_EQ(streamed, expected);
      EXPECT_EQ(stopped, c.stop != "not there");
      EXPECT_TRUE(IsValidUtf8(streamed));
    }
  }
}

TEST(DetokenizerWithoutExtraWhitespaceTest, StreamsAsDecodeDoes) {
  // With remove_extra_whitespaces, sentencepiece strips the leading "▁" of every piece at
  // the text's start until text appears, not just the first one's. A "▁" streamed alone
  // then decodes to nothing and leaves the next piece at the text's start; the
  // two-decode detokenizer dropped that piece's space, this one keeps it.
  const std::unique_ptr<Tokenizer> tokenizer = TrainTokenizer(/*remove_extra_whitespaces=*/true);
  ASSERT_NE(tokenizer, nullptr);
  auto stream = [&](std::span<const int> prompt, const std::vector<int>& output) {
    IncrementalDetokenizer detokenizer(tokenizer.get(), prompt);
    std::string streamed;
    for (int id : output) {
      const std::string chunk = detokenizer.Append(id);
      EXPECT_TRUE(IsValidUtf8(chunk)) << chunk;
      streamed += chunk;
    }
    return streamed + detokenizer.Flush();
  };
  auto in_context = [&](std::span<const int> prompt, const std::vector<int>& output) {
    std::vector<int> full(prompt.begin(), prompt.end());
    full.insert(full.end(), output.begin(), output.end());
    return tokenizer->Decode(full).substr(
        tokenizer->Decode(std::vector<int>(prompt.begin(), prompt.end())).size());
  };
  std::vector<int> spaces;  // Whitespace-only pieces: "▁", "▁▁", ...
  for (int id = 0; id < tokenizer->vocab_size(); ++id) {
    const std::string piece = tokenizer->Piece(id);
    if (!piece.empty() && absl::StrReplaceAll(piece, {{"\u2581", ""}}).empty()) {
      spaces.push_back(id);
    }
  }
  ASSERT_FALSE(spaces.empty());
  const int space = *tokenizer->Encode(" x")->begin();  // "▁", then "▁x".
  ASSERT_EQ(tokenizer->Piece(space), "\u2581");

  const std::vector<int> hello = *tokenizer->Encode("hello");
  std::vector<int> output = *tokenizer->Encode("and more");
  output.insert(output.begin(), space);
  EXPECT_EQ(in_context(hello, output), "  and more");
  EXPECT_EQ(stream(hello, output), "  and more");

  std::mt19937 rng(4242);
  const std::vector<int> prompt = *tokenizer->Encode("the café serves 你好");
  for (int round = 0; round < 1000; ++round) {
    std::vector<int> output = RandomIds(rng, tokenizer->vocab_size(), 1);
    // Whitespace-only pieces in front and in the middle, where the renderings differ.
    for (int i = round % 4; i > 0; --i) {
      output.insert(output.begin(), spaces[rng() % spaces.size()]);
      output.insert(output.begin() + static_cast<std::ptrdiff_t>(rng() % output.size()), space);
    }
    SCOPED_TRACE(absl::StrCat("output ids: ", absl::StrJoin(output, ",")));
    for (const std::vector<int>& context :
         {std::vector<int>(), prompt, hello, std::vector<int>{tokenizer->bos_id()}}) {
      EXPECT_EQ(stream(context, output), in_context(context, output));
    }
    if (HasFailure()) break;
  }
}

// --- tokenizer.json tokenizers ---------------------------------------------------------

// Byte-level BPE (GPT-2, Llama 3, Qwen2) and Metaspace ones (Llama 2, Mistral), made by
// HF's `tokenizers` (text/hf_tokenizer_test_util.h), with the reference's test strings
// and random id sequences as outputs to stream.
struct HfCase {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> texts;
  std::vector<std::vector<int>> random_ids;
};

std::vector<HfCase> LoadHfCases(const TestTempDir& dir) {
  std::vector<HfCase> cases;
  if (!MakeTokenizerReference(dir,
                              "--tokenizers gpt2,llama3,qwen2,llama2,mistral --strings 250 "
                              "--decodes 250 --sweeps no")) {
    return cases;
  }
  for (const char* name : {"gpt2", "llama3", "qwen2", "llama2", "mistral"}) {
    HfCase c{name, nullptr, {}, {}};
    auto tokenizer = Tokenizer::Load(absl::StrCat(dir.path(), "/", name));
    if (!tokenizer.ok()) {
      ADD_FAILURE() << tokenizer.status();
      return {};
    }
    c.tokenizer = *std::move(tokenizer);
    std::ifstream in(absl::StrCat(dir.path(), "/", name, "/cases.json"));
    const nlohmann::json reference = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (reference.is_discarded()) {
      ADD_FAILURE() << "cannot parse " << name << "/cases.json";
      return {};
    }
    for (const auto& e : reference["encode"]) c.texts.push_back(e["text"].get<std::string>());
    for (const auto& d : reference["decode"]) {
      c.random_ids.push_back(d["ids"].get<std::vector<int>>());
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// What `output` adds to `prompt`'s text when decoded after it; nullopt where the output
// changes the prompt's text instead (HF's ByteFallback renders a whole run of byte tokens
// as U+FFFD once one byte in it is stray, the prompt's bytes included).
std::optional<std::string> InContext(const Tokenizer& tokenizer, const std::vector<int>& prompt,
                                     const std::vector<int>& output) {
  std::vector<int> full = prompt;
  full.insert(full.end(), output.begin(), output.end());
  const std::string prompt_text = tokenizer.Decode(prompt);
  const std::string full_text = tokenizer.Decode(full);
  if (!full_text.starts_with(prompt_text)) return std::nullopt;
  return full_text.substr(prompt_text.size());
}

// Streams `output` after `prompt`; checks each chunk is whole UTF-8 and returns them all.
std::string StreamChecked(const Tokenizer& tokenizer, const std::vector<int>& prompt,
                          const std::vector<int>& output, size_t* decode_calls = nullptr) {
  IncrementalDetokenizer detokenizer(&tokenizer, prompt);
  std::string streamed;
  for (int id : output) {
    const std::string chunk = detokenizer.Append(id);
    EXPECT_TRUE(IsValidUtf8(chunk)) << chunk;
    streamed += chunk;
  }
  const std::string tail = detokenizer.Flush();
  EXPECT_TRUE(IsValidUtf8(tail)) << tail;
  if (decode_calls != nullptr) *decode_calls = detokenizer.decode_calls();
  return streamed + tail;
}

TEST(HfDetokenizerTest, StreamsEncodedTextAsDecodeDoes) {
  TestTempDir dir;
  const std::vector<HfCase> cases = LoadHfCases(dir);
  ASSERT_EQ(cases.size(), 5u);
  for (const HfCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Tokenizer& tokenizer = *c.tokenizer;
    const std::vector<std::vector<int>> prompts = {
        {}, *tokenizer.EncodeWithSpecialTokens("Say hello"), *tokenizer.Encode("the café 你好 ")};
    size_t tokens = 0, calls = 0;
    for (const std::string& text : c.texts) {
      const std::vector<int> output = *tokenizer.Encode(text);
      for (const std::vector<int>& prompt : prompts) {
        size_t decode_calls = 0;
        ASSERT_EQ(StreamChecked(tokenizer, prompt, output, &decode_calls),
                  InContext(tokenizer, prompt, output))
            << "text: " << text << "\nids: " << absl::StrJoin(output, ",");
        tokens += output.size();
        calls += decode_calls;
      }
    }
    std::cout << "[ detok    ] " << c.name << ": " << calls << " Decode calls for " << tokens
              << " tokens streamed\n";
    // Once an anchor is found, one Decode call per token: far below two per token.
    EXPECT_LT(calls, tokens * 13 / 10) << calls << " Decode calls for " << tokens << " tokens";
  }
}

TEST(HfDetokenizerTest, RandomIdsStreamAsDecodeDoes) {
  TestTempDir dir;
  const std::vector<HfCase> cases = LoadHfCases(dir);
  ASSERT_EQ(cases.size(), 5u);
  std::mt19937 rng(99);
  for (const HfCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Tokenizer& tokenizer = *c.tokenizer;
    // Byte-fallback tokens ("<0xE4>"), by byte; none with byte-level BPE.
    std::vector<int> byte_tokens(256, -1);
    for (int id = 0; id < tokenizer.vocab_size(); ++id) {
      const std::string piece = tokenizer.Piece(id);
      if (piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">")) {
        byte_tokens[std::stoi(piece.substr(3, 2), nullptr, 16)] = id;
      }
    }
    const bool byte_fallback = byte_tokens[0xE4] >= 0;
    // Byte-level BPE: tokens of one byte that is not a character on its own, to put
    // stray and incomplete UTF-8 among the random ids.
    std::vector<int> partial_bytes;
    for (int id = 0; id < tokenizer.vocab_size() && !byte_fallback; ++id) {
      if (tokenizer.Decode({id}) == "\uFFFD" && !tokenizer.IsSpecial(id)) {
        partial_bytes.push_back(id);
      }
    }
    ASSERT_TRUE(byte_fallback || !partial_bytes.empty());
    const std::vector<int> prompt = *tokenizer.Encode("the café serves 你好");
    size_t compared = 0;
    for (std::vector<int> output : c.random_ids) {
      if (byte_fallback) {
        // HF's ByteFallback renders a whole run of byte tokens as U+FFFD once any byte in
        // it is stray, so ill-formed runs change text already streamed (see detokenizer.h):
        // here only well-formed characters, as byte tokens, between the random pieces.
        std::erase_if(output, [&](int id) {
          return std::find(byte_tokens.begin(), byte_tokens.end(), id) != byte_tokens.end();
        });
        // Positions among the random pieces, last first, so no character lands inside
        // another.
        std::vector<size_t> at;
        at.reserve(4);
        for (int i = 0; i < 4; ++i) at.push_back(rng() % (output.size() + 1));
        std::sort(at.rbegin(), at.rend());
        for (int i = 0; i < 4; ++i) {
          std::vector<int> bytes;
          for (const char b : std::string_view(std::array{"🚀", "你", "é", "\u0800"}[i])) {
            bytes.push_back(byte_tokens[static_cast<unsigned char>(b)]);
          }
          output.insert(output.begin() + static_cast<std::ptrdiff_t>(at[i]), bytes.begin(),
                        bytes.end());
        }
      } else {
        for (int i = 0; i < 4; ++i) {
          output.insert(output.begin() + static_cast<std::ptrdiff_t>(rng() % (output.size() + 1)),
                        partial_bytes[rng() % partial_bytes.size()]);
        }
      }
      SCOPED_TRACE(absl::StrCat("output ids: ", absl::StrJoin(output, ",")));
      EXPECT_EQ(StreamChecked(tokenizer, {}, output), InContext(tokenizer, {}, output));
      const std::string streamed = StreamChecked(tokenizer, prompt, output);
      if (const std::optional<std::string> expected = InContext(tokenizer, prompt, output)) {
        EXPECT_EQ(streamed, *expected);
        ++compared;
      }
      if (HasFailure()) return;
    }
    EXPECT_EQ(compared, c.random_ids.size());
  }
}

TEST(HfDetokenizerTest, IllFormedByteRunKeepsTheStreamValidUtf8) {
  // HF's ByteFallback renders the whole run "a", C3 A9 ("é"), a stray A9, "b" as one
  // U+FFFD per byte, so the window's text no longer starts with the "é" streamed before:
  // cutting it at the streamed size fell inside a U+FFFD (found by
  // tests/fuzz/detokenizer_fuzzer). The stream differs from the full decode there, as the
  // header says, but every chunk must still be valid UTF-8.
  TestTempDir dir;
  const std::vector<HfCase> cases = LoadHfCases(dir);
  ASSERT_EQ(cases.size(), 5u);
  for (const HfCase& c : cases) {
    const Tokenizer& tokenizer = *c.tokenizer;
    std::vector<int> byte_tokens(256, -1);
    for (int id = 0; id < tokenizer.vocab_size(); ++id) {
      const std::string piece = tokenizer.Piece(id);
      if (piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">")) {
        byte_tokens[std::stoi(piece.substr(3, 2), nullptr, 16)] = id;
      }
    }
    if (byte_tokens[0xA9] < 0) continue;  // Byte-level BPE: no byte-fallback tokens.
    SCOPED_TRACE(c.name);
    std::vector<int> output;  // "a", "é" as its two bytes, a stray byte, "b".
    for (int byte : {0x61, 0xC3, 0xA9, 0xA9, 0x62}) output.push_back(byte_tokens[byte]);
    for (const std::vector<int>& prompt : {std::vector<int>(), *tokenizer.Encode("hello")}) {
      const std::string streamed = StreamChecked(tokenizer, prompt, output);
      EXPECT_TRUE(IsValidUtf8(streamed)) << streamed;
      EXPECT_THAT(streamed, ::testing::StartsWith("a")) << streamed;
    }
  }
}

TEST(HfDetokenizerTest, HoldsByteLevelPiecesOfACharacterBack) {
  TestTempDir dir;
  const std::vector<HfCase> cases = LoadHfCases(dir);
  ASSERT_EQ(cases.size(), 5u);
  for (const HfCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Tokenizer& tokenizer = *c.tokenizer;
    // Characters outside the training text: several tokens each.
    const std::vector<int> output = *tokenizer.Encode(" go 🚀🤖 ok");
    const std::vector<int> prompt = *tokenizer.Encode("rocket:");
    IncrementalDetokenizer detokenizer(&tokenizer, prompt);
    std::vector<std::string> chunks;
    chunks.reserve(output.size() + 1);
    for (int id : output) chunks.push_back(detokenizer.Append(id));
    chunks.push_back(detokenizer.Flush());
    EXPECT_GT(output.size(), 6u);
    for (const std::string& chunk : chunks) EXPECT_TRUE(IsValidUtf8(chunk)) << chunk;
    EXPECT_EQ(absl::StrJoin(chunks, ""), InContext(tokenizer, prompt, output));
    EXPECT_THAT(absl::StrJoin(chunks, ""), ::testing::EndsWith("go 🚀🤖 ok"));
    EXPECT_NE(std::find(chunks.begin(), chunks.end(), "🚀"), chunks.end());
  }
}

}  // namespace
}  // namespace conveyor::scheduler
