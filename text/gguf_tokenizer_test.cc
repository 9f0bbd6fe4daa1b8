// The tokenizer of a GGUF file (gguf_tokenizer.h) against HF's `tokenizers`, and its
// errors.
//
// The differential test runs tests/gguf_ref/make_gguf_tokenizers.py with the test venv's
// Python: it writes GGUF files holding byte-level vocabularies (pre-tokenizers gpt2,
// llama-bpe, qwen2, smollm, tekken), each trained with `tokenizers` whose tokenizer.json is
// the reference, and sentencepiece-style ones (with and without the space prefix), whose
// reference is the tokenizer transformers' GGUF loader builds; then what `tokenizers` makes
// of thousands of strings and random id sequences. Every id and every decoded text must be
// identical. Without the venv the test fails, saying so.
#include "text/gguf_tokenizer.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/gguf.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer_test_util.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

json ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  json parsed = json::parse(contents.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(parsed.is_discarded()) << path;
  return parsed;
}

std::vector<int> Ids(const json& array) { return array.get<std::vector<int>>(); }

std::string Show(const std::vector<int>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

// Counts a case and, for the first few mismatches, says what differed.
class Tally {
 public:
  explicit Tally(std::string what) : what_(std::move(what)) {}
  ~Tally() {
    std::cout << "[ tally    ] " << what_ << ": " << total_ - mismatches_ << "/" << total_
              << " identical\n";
    EXPECT_EQ(mismatches_, 0) << what_;
    EXPECT_GT(total_, 0) << what_;
  }
  template <typename T>
  void Check(const T& got, const T& want, const std::string& context) {
    ++total_;
    if (got == want) return;
    if (++mismatches_ <= 5) ADD_FAILURE() << what_ << " differs for " << context;
  }

 private:
  std::string what_;
  int total_ = 0;
  int mismatches_ = 0;
};

constexpr const char* kNames[] = {"gpt2",      "llama-bpe",         "qwen2", "smollm", "tekken",
                                  "llama-spm", "llama-spm-noprefix"};

TEST(GgufTokenizerReferenceTest, EncodesAndDecodesAsTokenizersDoes) {
  TestTempDir dir;
  // CONVEYOR_TOKENIZER_REF_STRINGS=N compares N strings per tokenizer (default 2000).
  const char* strings = std::getenv("CONVEYOR_TOKENIZER_REF_STRINGS");
  ASSERT_TRUE(
      RunTokenizerReferenceScript(dir, "tests/gguf_ref/make_gguf_tokenizers.py",
                                  strings != nullptr ? absl::StrCat("--strings ", strings) : ""));
  ASSERT_EQ(ReadJson(dir.path() + "/names.json").size(), std::size(kNames));
  for (const char* name : kNames) {
    SCOPED_TRACE(name);
    const std::string gguf = absl::StrCat(dir.path(), "/", name, "/tokenizer.gguf");
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(gguf);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const json cases = ReadJson(absl::StrCat(dir.path(), "/", name, "/cases.json"));
    EXPECT_EQ((*tokenizer)->kind(), "gguf");
    EXPECT_EQ((*tokenizer)->vocab_size(), cases["vocab_size"].get<int>());
    EXPECT_EQ((*tokenizer)->bos_id(), cases["bos"].get<int>());
    EXPECT_EQ((*tokenizer)->eos_id(), cases["eos"].get<int>());
    EXPECT_EQ((*tokenizer)->pad_id(), cases["pad"].get<int>());
    if ((*tokenizer)->eos_id() >= 0) EXPECT_TRUE((*tokenizer)->IsSpecial((*tokenizer)->eos_id()));
    ASSERT_GE(cases["encode"].size(), 100u);
    {
      Tally plain(absl::StrCat(name, " encode"));
      Tally framed(absl::StrCat(name, " encode with special tokens"));
      Tally decoded(absl::StrCat(name, " decode of encoded ids"));
      for (const json& c : cases["encode"]) {
        const std::string& text = c["text"].get_ref<const std::string&>();
        const std::string context = absl::StrCat("text \"", text, "\"");
        const auto ids = (*tokenizer)->Encode(text);
        const auto ids_special = (*tokenizer)->EncodeWithSpecialTokens(text);
        ASSERT_TRUE(ids.ok() && ids_special.ok()) << ids.status() << ids_special.status();
        plain.Check(
            *ids, Ids(c["ids"]),
            absl::StrCat(context, ": ", Show(*ids), " vs tokenizers ", Show(Ids(c["ids"]))));
        framed.Check(*ids_special, Ids(c["ids_special"]),
                     absl::StrCat(context, ": ", Show(*ids_special), " vs tokenizers ",
                                  Show(Ids(c["ids_special"]))));
        const std::string back = (*tokenizer)->Decode(Ids(c["ids"]));
        decoded.Check(back, c["decoded"].get<std::string>(),
                      absl::StrCat("ids ", Show(Ids(c["ids"])), ": \"", back, "\" vs tokenizers \"",
                                   c["decoded"].get<std::string>(), "\""));
      }
    }
    Tally random(absl::StrCat(name, " decode of random ids"));
    for (const json& c : cases["decode"]) {
      const std::string text = (*tokenizer)->Decode(Ids(c["ids"]));
      random.Check(text, c["text"].get<std::string>(),
                   absl::StrCat("ids ", Show(Ids(c["ids"])), ": \"", text, "\" vs tokenizers \"",
                                c["text"].get<std::string>(), "\""));
    }

    // The chat template and the tokenizer_config.json the file implies.
    absl::StatusOr<jinja::ChatTemplates> templates = jinja::LoadChatTemplates(gguf);
    ASSERT_TRUE(templates.ok()) << templates.status();
    const std::unique_ptr<jinja::ChatTemplate>* chat_template = &templates->chat;
    absl::StatusOr<json> config = LoadGgufTokenizerConfig(gguf);
    ASSERT_TRUE(config.ok()) << config.status();
    const int bos = (*tokenizer)->bos_id();
    EXPECT_EQ((*config)["bos_token"], bos >= 0 ? json((*tokenizer)->Piece(bos)) : json(nullptr));
    if (cases["chat_template"].is_null()) {
      EXPECT_EQ(*chat_template, nullptr);
      EXPECT_FALSE(config->contains("chat_template"));
      continue;
    }
    ASSERT_NE(*chat_template, nullptr);
    EXPECT_EQ((*chat_template)->source(), cases["chat_template"].get<std::string>());
    EXPECT_EQ((*config)["chat_template"], cases["chat_template"]);
    const absl::StatusOr<std::string> rendered =
        (*chat_template)
            ->Render(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                          {"add_generation_prompt", true},
                          {"bos_token", (*config)["bos_token"]}});
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(*rendered,
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    // The rendered prompt's control tokens are matched whole.
    const absl::StatusOr<std::vector<int>> ids = (*tokenizer)->Encode(*rendered);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(ids->front(), bos);
  }
}

// --- Errors, on hand-made files ----------------------------------------------------------

template <typename T>
std::string Le(T value) {
  std::string bytes(sizeof(T), '\0');
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}
std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }

constexpr uint32_t kU8 = 0, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9;

std::string StringArray(const std::vector<std::string>& items) {
  std::string bytes = Le(kString) + Le<uint64_t>(items.size());
  for (const std::string& item : items) bytes += Str(item);
  return bytes;
}
std::string I32Array(const std::vector<int32_t>& items) {
  std::string bytes = Le(kI32) + Le<uint64_t>(items.size());
  for (const int32_t item : items) bytes += Le(item);
  return bytes;
}
std::string F32Array(const std::vector<float>& items) {
  std::string bytes = Le(kF32) + Le<uint64_t>(items.size());
  for (const float item : items) bytes += Le(item);
  return bytes;
}

// The metadata of a small valid vocabulary, any key of which a test replaces or drops.
class GgufMetadata {
 public:
  // A byte-level vocabulary: "a", "b", "ab", "Ġ", "<|end|>" (control); merges "a b".
  static GgufMetadata Gpt2() {
    GgufMetadata m;
    m.Set("tokenizer.ggml.model", kString, Str("gpt2"));
    m.Set("tokenizer.ggml.pre", kString, Str("gpt2"));
    m.Set("tokenizer.ggml.tokens", kArray, StringArray({"a", "b", "ab", "\xC4\xA0", "<|end|>"}));
    m.Set("tokenizer.ggml.token_type", kArray, I32Array({1, 1, 1, 1, 3}));
    m.Set("tokenizer.ggml.merges", kArray, StringArray({"a b"}));
    m.Set("tokenizer.ggml.eos_token_id", kI32, Le<int32_t>(4));
    return m;
  }
  // A sentencepiece-style vocabulary with scores and no merges.
  static GgufMetadata Llama() {
    GgufMetadata m;
    m.Set("tokenizer.ggml.model", kString, Str("llama"));
    m.Set("tokenizer.ggml.tokens", kArray,
          StringArray({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab", "\u2581ab"}));
    m.Set("tokenizer.ggml.token_type", kArray, I32Array({2, 3, 3, 1, 1, 1, 1, 1}));
    m.Set("tokenizer.ggml.scores", kArray, F32Array({0, 0, 0, -1, -2, -3, -4, -5}));
    m.Set("tokenizer.ggml.bos_token_id", kI32, Le<int32_t>(1));
    m.Set("tokenizer.ggml.eos_token_id", kI32, Le<int32_t>(2));
    m.Set("tokenizer.ggml.unknown_token_id", kI32, Le<int32_t>(0));
    return m;
  }

  GgufMetadata& Set(const std::string& key, uint32_t type, const std::string& value) {
    Drop(key);
    kvs_.emplace_back(key, Le(type) + value);
    return *this;
  }
  GgufMetadata& Drop(const std::string& key) {
    std::erase_if(kvs_, [&](const auto& kv) { return kv.first == key; });
    return *this;
  }
  std::string Image() const {
    std::string image = "GGUF" + Le<uint32_t>(3) + Le<uint64_t>(0) + Le<uint64_t>(kvs_.size());
    for (const auto& [key, value] : kvs_) image += Str(key) + value;
    image.resize((image.size() + 31) / 32 * 32, '\0');
    return image;
  }

 private:
  std::vector<std::pair<std::string, std::string>> kvs_;
};

absl::Status LoadStatus(const GgufMetadata& metadata) {
  const std::string image = metadata.Image();
  absl::StatusOr<std::unique_ptr<GgufFile>> file =
      GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
  if (!file.ok()) return file.status();
  return LoadGgufTokenizer(**file).status();
}

void ExpectError(const GgufMetadata& metadata, absl::StatusCode code,
                 const std::vector<std::string>& texts) {
  const absl::Status status = LoadStatus(metadata);
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(status.message(), HasSubstr("test.gguf"));
  for (const std::string& text : texts) EXPECT_THAT(status.message(), HasSubstr(text));
}

TEST(GgufTokenizerTest, TheHandMadeVocabulariesLoadAndEncode) {
  for (const GgufMetadata& m : {GgufMetadata::Gpt2(), GgufMetadata::Llama()}) {
    const std::string image = m.Image();
    auto file = GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
    ASSERT_TRUE(file.ok()) << file.status();
    auto tokenizer = LoadGgufTokenizer(**file);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    EXPECT_EQ((*tokenizer)->kind(), "gguf");
  }
  const std::string image = GgufMetadata::Llama().Image();
  auto file = GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
  auto llama = LoadGgufTokenizer(**file);
  ASSERT_TRUE(llama.ok());
  // "▁ab" from the merges the scores imply; BOS in front (the llama default).
  EXPECT_THAT(*(*llama)->EncodeWithSpecialTokens("ab</s>"), ::testing::ElementsAre(1, 7, 2));
  EXPECT_EQ((*llama)->Decode({1, 7, 4}), "<s> aba");
  EXPECT_TRUE((*llama)->IsSpecial(0));
  EXPECT_FALSE((*llama)->IsSpecial(7));
}

TEST(GgufTokenizerTest, MissingAndIllTypedKeysAreNamed) {
  ExpectError(GgufMetadata::Gpt2().Drop("tokenizer.ggml.model"), absl::StatusCode::kInvalidArgument,
              {"tokenizer.ggml.model", "missing"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.model", kI32, Le<int32_t>(1)),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.model", "string"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.model", kString, Str("bert")),
              absl::StatusCode::kUnimplemented, {"\"bert\"", "gpt2", "llama"});
  ExpectError(GgufMetadata::Gpt2().Drop("tokenizer.ggml.tokens"),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.tokens", "missing"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.tokens", kArray, I32Array({1, 2})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.tokens", "strings"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.tokens", kArray, StringArray({})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.tokens", "empty"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.token_type", kArray, I32Array({1})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.token_type", "1 entries"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.token_type", kString, Str("x")),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.token_type", "array"});
  ExpectError(GgufMetadata::Gpt2().Drop("tokenizer.ggml.merges"),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.merges", "missing"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.add_bos_token", kU8, Le<uint8_t>(1)),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.add_bos_token", "bool"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.add_bos_token", kBool, Le<uint8_t>(1)),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.add_bos_token", "bos_token_id"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.chat_template", kI32, Le<int32_t>(0)),
              absl::StatusCode::kInvalidArgument, {"tokenizer.chat_template", "string"});
  ExpectError(GgufMetadata::Llama().Drop("tokenizer.ggml.scores"),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.scores", "missing"});
  ExpectError(GgufMetadata::Llama().Set("tokenizer.ggml.scores", kArray, F32Array({0, 1})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.scores", "2 entries"});
  ExpectError(GgufMetadata::Llama().Set("tokenizer.ggml.scores", kArray,
                                        F32Array({0, 0, 0, 0, 0, 0, 0, NAN})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.scores[7]", "finite"});
  ExpectError(
      GgufMetadata::Llama().Set("tokenizer.ggml.tokens", kArray,
                                StringArray({"<unk>", "\xFF", "</s>", "a", "b", "c", "d", "e"})),
      absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.tokens[1]", "UTF-8"});
}

TEST(GgufTokenizerTest, IdsOutOfRangeAreRefused) {
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}) {
    ExpectError(GgufMetadata::Gpt2().Set(key, kI32, Le<int32_t>(5)),
                absl::StatusCode::kInvalidArgument, {key, "is 5", "5 tokens"});
    ExpectError(GgufMetadata::Gpt2().Set(key, kI32, Le<int32_t>(-1)),
                absl::StatusCode::kInvalidArgument, {key, "is -1"});
    ExpectError(GgufMetadata::Gpt2().Set(key, kString, Str("0")),
                absl::StatusCode::kInvalidArgument, {key, "integer"});
  }
}

TEST(GgufTokenizerTest, BadMergesAreNamed) {
  ExpectError(
      GgufMetadata::Gpt2().Set("tokenizer.ggml.merges", kArray, StringArray({"a b", "a c"})),
      absl::StatusCode::kInvalidArgument,
      {"tokenizer.ggml.merges[1]", "\"c\"", "not in tokenizer.ggml.tokens"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.merges", kArray, StringArray({"b a"})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.merges[0]", "\"ba\""});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.merges", kArray, StringArray({"ab"})),
              absl::StatusCode::kInvalidArgument,
              {"tokenizer.ggml.merges[0]", "two tokens separated by a space"});
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.merges", kArray, I32Array({0})),
              absl::StatusCode::kInvalidArgument, {"tokenizer.ggml.merges", "strings"});
}

TEST(GgufTokenizerTest, UnknownPreTokenizersAreRefusedListingTheKnownOnes) {
  ExpectError(GgufMetadata::Gpt2().Set("tokenizer.ggml.pre", kString, Str("jais")),
              absl::StatusCode::kUnimplemented,
              {"tokenizer.ggml.pre", "\"jais\"", "llama-bpe", "qwen2", "smollm", "gpt2"});
  // No name: GPT-2's.
  EXPECT_TRUE(LoadStatus(GgufMetadata::Gpt2().Drop("tokenizer.ggml.pre")).ok());
  for (const std::string& name : KnownGgufPreTokenizers()) {
    EXPECT_TRUE(LoadStatus(GgufMetadata::Gpt2().Set("tokenizer.ggml.pre", kString, Str(name))).ok())
        << name;
  }
}

TEST(GgufTokenizerTest, LoadNamesAMissingFile) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load("/nonexistent/x.gguf");
  EXPECT_FALSE(tokenizer.ok());
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("/nonexistent/x.gguf"));
  EXPECT_TRUE(IsGgufPath("a/b.gguf"));
  EXPECT_FALSE(IsGgufPath("a/b.gguf/"));
}

}  // namespace
}  // namespace conveyor
