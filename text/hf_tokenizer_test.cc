// HfTokenizer against HF's `tokenizers` package, and its load errors.
//
// The differential tests run tests/tokenizer_ref/make_tokenizers.py with the test venv's
// Python (scripts/install-deps.sh makes it): it trains six tokenizers in the style of
// GPT-2, Llama 3, Qwen2, Llama 2, Mistral and a mix of the remaining components, and
// records what `tokenizers` makes of thousands of strings and random id sequences. Every
// id and every decoded text must be identical. Without the venv they fail, saying so.
#include "text/hf_tokenizer.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/test_temp_dir.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer_components.h"
#include "text/hf_tokenizer_test_util.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr const char* kTokenizerNames[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral", "misc"};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

json ReadJson(const std::string& path) {
  json parsed = json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(parsed.is_discarded()) << path;
  return parsed;
}

std::vector<int> Ids(const json& array) { return array.get<std::vector<int>>(); }

// Counts a case and, for the first few mismatches, says what differed.
class Tally {
 public:
  explicit Tally(std::string what) : what_(std::move(what)) {}
  ~Tally() {
    std::cout << "[ tally    ] " << what_ << ": " << total_ - mismatches_ << "/" << total_
              << " identical (" << (total_ == 0 ? 0.0 : 100.0 * (total_ - mismatches_) / total_)
              << " %)\n";
    EXPECT_EQ(mismatches_, 0) << what_;
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

std::string Show(const std::vector<int>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

TEST(HfTokenizerReferenceTest, EncodesAndDecodesAsTokenizersDoes) {
  TestTempDir dir;
  // CONVEYOR_TOKENIZER_REF_STRINGS=N compares N strings per tokenizer (default 2000).
  const char* strings = std::getenv("CONVEYOR_TOKENIZER_REF_STRINGS");
  ASSERT_TRUE(MakeTokenizerReference(
      dir,
      absl::StrCat("--sweeps no", strings != nullptr ? absl::StrCat(" --strings ", strings) : "")));
  const json names = ReadJson(dir.path() + "/names.json");
  ASSERT_EQ(names.size(), std::size(kTokenizerNames));
  for (const char* name : kTokenizerNames) {
    SCOPED_TRACE(name);
    const std::string tokenizer_dir = absl::StrCat(dir.path(), "/", name);
    auto tokenizer = HfTokenizer::Load(tokenizer_dir + "/tokenizer.json",
                                       tokenizer_dir + "/tokenizer_config.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const json cases = ReadJson(tokenizer_dir + "/cases.json");
    ASSERT_GE(cases["encode"].size(), 1000u);
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
        const std::string text_back = (*tokenizer)->Decode(Ids(c["ids"]));
        decoded.Check(text_back, c["decoded"].get<std::string>(),
                      absl::StrCat("ids ", Show(Ids(c["ids"])), ": \"", text_back,
                                   "\" vs tokenizers \"", c["decoded"].get<std::string>(), "\""));
      }
    }
    Tally random(absl::StrCat(name, " decode of random ids"));
    for (const json& c : cases["decode"]) {
      const std::string text = (*tokenizer)->Decode(Ids(c["ids"]));
      random.Check(text, c["text"].get<std::string>(),
                   absl::StrCat("ids ", Show(Ids(c["ids"])), ": \"", text, "\" vs tokenizers \"",
                                c["text"].get<std::string>(), "\""));
    }

    // bos/eos/pad as tokenizer_config.json names them (-1 where it does not).
    const json config = ReadJson(tokenizer_dir + "/tokenizer_config.json");
    const auto expected_id = [&](const char* key) {
      if (!config.contains(key) || config[key].is_null()) return -1;
      const json& v = config[key];
      return (*tokenizer)
          ->TokenToId(v.is_string() ? v.get<std::string>() : v["content"].get<std::string>());
    };
    EXPECT_EQ((*tokenizer)->bos_id(), expected_id("bos_token"));
    EXPECT_EQ((*tokenizer)->eos_id(), expected_id("eos_token"));
    EXPECT_EQ((*tokenizer)->pad_id(), expected_id("pad_token"));
    // Special tokens as the file marks them.
    const json file = ReadJson(tokenizer_dir + "/tokenizer.json");
    for (const json& added : file["added_tokens"]) {
      EXPECT_EQ((*tokenizer)->IsSpecial(added["id"].get<int>()), added["special"].get<bool>())
          << added["content"];
      EXPECT_EQ((*tokenizer)->Piece(added["id"].get<int>()), added["content"].get<std::string>());
    }
  }
}

// The Unicode tables behind the regexes, predicates and normalizers, code point by code
// point, against what `tokenizers` does with them.
TEST(HfTokenizerReferenceTest, UnicodeTablesMatchTokenizers) {
  TestTempDir dir;
  ASSERT_TRUE(MakeTokenizerReference(dir, "--sweeps only"));
  const json sweeps = ReadJson(dir.path() + "/sweeps.json");
  std::vector<char32_t> code_points;
  for (const json& range : sweeps["code_points"]) {
    for (int c = range[0].get<int>(); c <= range[1].get<int>(); ++c) code_points.push_back(c);
  }
  ASSERT_GT(code_points.size(), 80000u);
  const auto member_set = [](const json& ranges) {
    std::vector<bool> set(0x110000);
    for (const json& r : ranges) {
      for (int c = r[0].get<int>(); c <= r[1].get<int>(); ++c) set[c] = true;
    }
    return set;
  };
  std::string all;
  std::vector<size_t> offsets;  // Byte offset of each code point in `all`.
  for (const char32_t c : code_points) {
    offsets.push_back(all.size());
    AppendUtf8(c, &all);
  }
  for (const json& c : sweeps["classes"]) {
    const std::string pattern = c["pattern"].get<std::string>();
    SCOPED_TRACE(pattern);
    auto regex = hf::Regex::Compile(pattern);
    ASSERT_TRUE(regex.ok()) << regex.status();
    std::vector<hf::Match> matches;
    ASSERT_TRUE((*regex)->FindAll(all, &matches).ok());
    std::vector<bool> ours(0x110000);
    size_t k = 0;
    for (const hf::Match& m : matches) {
      while (k < offsets.size() && offsets[k] < m.first) ++k;
      for (; k < offsets.size() && offsets[k] < m.second; ++k) ours[code_points[k]] = true;
    }
    const std::vector<bool> want = member_set(c["members"]);
    Tally tally(absl::StrCat("regex class ", pattern, " (PCRE2 ", (*regex)->pcre_pattern(), ")"));
    for (const char32_t cp : code_points) {
      tally.Check(static_cast<bool>(ours[cp]), static_cast<bool>(want[cp]),
                  absl::StrCat("U+", absl::Hex(cp)));
    }
  }
  for (const json& p : sweeps["predicates"]) {
    const std::string name = p["name"].get<std::string>();
    bool (*predicate)(char32_t) = name == "is_whitespace" ? hf::IsWhitespace
                                  : name == "is_numeric"  ? hf::IsNumeric
                                                          : hf::IsRegexWordChar;
    const std::vector<bool> want = member_set(p["members"]);
    Tally tally(name);
    for (const char32_t cp : code_points) {
      tally.Check(predicate(cp), static_cast<bool>(want[cp]), absl::StrCat("U+", absl::Hex(cp)));
    }
  }
  for (const json& n : sweeps["normalizers"]) {
    const std::string type = n["type"].get<std::string>();
    auto normalizer = hf::ParseNormalizer(json{{"type", type}}, "normalizer");
    ASSERT_TRUE(normalizer.ok()) << normalizer.status();
    std::vector<std::string> want(0x110000);
    for (const json& change : n["changed"])
      want[change[0].get<int>()] = change[1].get<std::string>();
    Tally tally(absl::StrCat("normalizer ", type));
    for (const char32_t cp : code_points) {
      std::string text;
      AppendUtf8(cp, &text);
      std::string expected = want[cp].empty() ? text : want[cp];
      ASSERT_TRUE((*normalizer)->Normalize(&text).ok());
      tally.Check(text, expected, absl::StrCat("U+", absl::Hex(cp)));
    }
  }
}

// --- Without the reference: load errors and the API's edges ----------------------------

// A tiny valid byte-level tokenizer.json, with `patch` merged over it.
std::string TinyTokenizer(const json& patch = json::object()) {
  json tokenizer = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 5},
         {"content", "<|end|>"},
         {"special", true},
         {"normalized", false},
         {"lstrip", false},
         {"rstrip", false},
         {"single_word", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"a", 0},
          {"b", 1},
          {"ab", 2},
          {"\xC4\xA0", 3},
          {"\xC4\xA0"
           "ab",
           4}}},
        {"merges", {"a b", {"\xC4\xA0", "ab"}}}}}};
  tokenizer.merge_patch(patch);
  return tokenizer.dump();
}

TEST(HfTokenizerTest, TinyTokenizerEncodesAndDecodes) {
  auto tokenizer = HfTokenizer::Parse(TinyTokenizer(), "tiny.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode("ab ab<|end|>");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int>{2, 4, 5}));
  EXPECT_EQ((*tokenizer)->Decode(*ids), "ab ab<|end|>");
  EXPECT_EQ((*tokenizer)->kind(), "tokenizer.json");
  EXPECT_EQ((*tokenizer)->vocab_size(), 6);
  EXPECT_EQ((*tokenizer)->Piece(4),
            "\xC4\xA0"
            "ab");
  EXPECT_EQ((*tokenizer)->Piece(99), "");
  EXPECT_TRUE((*tokenizer)->IsSpecial(5));
  EXPECT_FALSE((*tokenizer)->IsSpecial(2));
  EXPECT_EQ((*tokenizer)->bos_id(), -1);  // No tokenizer_config.json.
  EXPECT_EQ((*tokenizer)->Decode({2, -1, 99, 2}), "abab");
}

TEST(HfTokenizerTest, RejectsInvalidUtf8Text) {
  auto tokenizer = HfTokenizer::Parse(TinyTokenizer(), "tiny.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode("ab\xC3");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("byte 2"));
}

TEST(HfTokenizerTest, UnknownComponentsNameTheirTypeAndFile) {
  struct Case {
    json patch;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"normalizer", {{"type", "Precompiled"}}}},
       "normalizer: unknown or unsupported normalizer type \"Precompiled\""},
      {{{"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers", {{{"type", "Digits"}}, {{"type", "UnicodeScripts"}}}}}}},
       "pre_tokenizer.pretokenizers[1]: unknown or unsupported pre_tokenizer type "
       "\"UnicodeScripts\""},
      {{{"decoder", {{"type", "WordPiece"}}}},
       "decoder: unknown or unsupported decoder type \"WordPiece\""},
      {{{"post_processor", {{"type", "Fancy"}}}},
       "post_processor: unknown or unsupported post_processor type \"Fancy\""},
      {{{"model", {{"type", "Unigram"}}}}, "model: unknown or unsupported model type \"Unigram\""},
      {{{"normalizer", {{"kind", "NFC"}}}}, "normalizer has no \"type\""},
      {{{"model", {{"merges", {"a c"}}}}}, "merges[0] uses \"c\", which is not in the vocabulary"},
      {{{"model", {{"merges", {"a b c"}}}}}, "merges[0] \"a b c\" is not two tokens"},
      {{{"model", {{"dropout", 0.1}}}}, "dropout is not supported"},
      {{{"pre_tokenizer",
         {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}}}},
       "pre_tokenizer: regex \"(a\""},
      {{{"pre_tokenizer",
         {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}}}},
       "unknown split behavior \"Sideways\""},
      {{{"post_processor",
         {{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", "<s>"}}}}}}}}},
       "the template uses \"<s>\", missing from special_tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.patch.dump());
    auto tokenizer = HfTokenizer::Parse(TinyTokenizer(c.patch), "/models/x/tokenizer.json");
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokenizer.status().message(), HasSubstr("/models/x/tokenizer.json: "));
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(c.message));
  }
}

TEST(HfTokenizerTest, MalformedFilesAreErrorsNamingThem) {
  TestTempDir dir;
  EXPECT_EQ(HfTokenizer::Load(dir.path() + "/tokenizer.json", "").status().code(),
            absl::StatusCode::kNotFound);
  const std::string json_path = dir.WriteFile("tokenizer.json", "{\"model\": ");
  auto truncated = HfTokenizer::Load(json_path, "");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(truncated.status().message(), HasSubstr(json_path));
  dir.WriteFile("tokenizer.json", TinyTokenizer());
  const std::string config_path = dir.WriteFile("tokenizer_config.json", "[not json");
  auto bad_config = HfTokenizer::Load(json_path, config_path);
  EXPECT_EQ(bad_config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_config.status().message(), HasSubstr(config_path));
}

TEST(HfTokenizerTest, LoadPrefersTokenizerJsonAndReadsTheConfig) {
  TestTempDir dir;
  dir.WriteFile("tokenizer.model", "not a sentencepiece model");
  dir.WriteFile("tokenizer.json", TinyTokenizer());
  dir.WriteFile("tokenizer_config.json",
                R"({"bos_token": {"content": "ab", "lstrip": false}, "eos_token": "<|end|>",
                    "pad_token": null, "unk_token": "nowhere"})");
  auto tokenizer = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->kind(), "tokenizer.json");
  EXPECT_EQ((*tokenizer)->bos_id(), 2);
  EXPECT_EQ((*tokenizer)->eos_id(), 5);
  EXPECT_EQ((*tokenizer)->pad_id(), -1);
}

TEST(HfTokenizerTest, LoadWithoutAnyTokenizerIsNotFound) {
  TestTempDir dir;
  auto tokenizer = Tokenizer::Load(dir.path());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(dir.path() + "/tokenizer.json"));
}

TEST(HfTokenizerTest, PostProcessorOnlyWithSpecialTokens) {
  const json patch = {{"post_processor",
                       {{"type", "TemplateProcessing"},
                        {"single", "<|end|> $A <|end|>"},
                        {"special_tokens", {{"<|end|>", {{"id", "<|end|>"}, {"ids", {5}}}}}}}}};
  auto tokenizer = HfTokenizer::Parse(TinyTokenizer(patch), "tiny.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*(*tokenizer)->Encode("ab"), (std::vector<int>{2}));
  EXPECT_EQ(*(*tokenizer)->EncodeWithSpecialTokens("ab"), (std::vector<int>{5, 2, 5}));
  EXPECT_EQ(*(*tokenizer)->EncodeWithSpecialTokens(""), (std::vector<int>{5, 5}));
}

TEST(HfTokenizerTest, ConcurrentEncodesAgree) {
  auto tokenizer = HfTokenizer::Parse(TinyTokenizer(), "tiny.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::string text;
  for (int i = 0; i < 2000; ++i)
    absl::StrAppend(&text, i % 3 == 0 ? " ab" : "ab", i % 7 == 0 ? "b" : "");
  const std::vector<int> expected = *(*tokenizer)->Encode(text);
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::vector<char> same(4);  // Not vector<bool>: each thread writes its own byte.
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int i = 0; i < 20; ++i) ok &= *(*tokenizer)->Encode(text) == expected;
      same[t] = ok;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(same[t]) << t;
}

TEST(HfRegexTest, TranslatesOnigurumaClasses) {
  EXPECT_EQ(*hf::OnigurumaToPcre2(R"(\s+(?!\S))"), R"(\p{White_Space}+(?!\P{White_Space}))");
  EXPECT_EQ(*hf::OnigurumaToPcre2(R"([^\s\p{L}])"), R"([^\p{White_Space}\p{L}])");
  EXPECT_EQ(
      *hf::OnigurumaToPcre2(R"(\w\h\u00e9)"),
      R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE}][0-9a-fA-F]\x{00e9})");
  EXPECT_EQ(*hf::OnigurumaToPcre2(R"([]a\]])"), R"([]a\]])");
  EXPECT_FALSE(hf::OnigurumaToPcre2("[a[b]]").ok());
  EXPECT_FALSE(hf::OnigurumaToPcre2(R"([\W])").ok());
}

TEST(HfRegexTest, SkipsEmptyMatchesAfterAMatchAsOniguruma) {
  auto regex = hf::Regex::Compile("a*");
  ASSERT_TRUE(regex.ok());
  std::vector<hf::Match> matches;
  ASSERT_TRUE((*regex)->FindAll("baab", &matches).ok());
  // Oniguruma: "" at 0, "aa" at 1..3, then "" at 4 (the "" at 3 follows the match).
  EXPECT_EQ(matches, (std::vector<hf::Match>{{0, 0}, {1, 3}, {4, 4}}));
}

TEST(HfTextTest, LossyUtf8ReplacesMaximalSubparts) {
  std::string out;
  hf::AppendLossyUtf8(
      "a\xE4\xBD"
      "b\x80\xED\xA0\x80\xF0\x9F\x9A",
      &out);
  EXPECT_EQ(out,
            "a\uFFFD"
            "b\uFFFD\uFFFD\uFFFD\uFFFD\uFFFD");
}

}  // namespace
}  // namespace conveyor
