// Differential test: a chat template rendered and tokenized by Conveyor against Hugging
// Face's apply_chat_template(tokenize=True) on the real templates of the families served
// (tests/chat_ref/templates/, sources in SOURCES.md).
//
// tokenizer.json kinds: tests/chat_ref/make_chat_cases.py renders every case with Python's
// jinja2 and tokenizes it with the `tokenizers` package, at test time, with the test
// venv's Python (scripts/install-deps.sh); without it the test fails, saying so.
// sentencepiece: tests/chat_ref/spm_cases.json holds ids recorded once with transformers
// (tests/chat_ref/record_spm_cases.py, see tests/chat_ref/README.md) from a tokenizer.model
// that this test trains again with spm_train and checks by its SHA-256.
//
// Special-token text inside a message ("<|im_start|>" typed by a user) becomes the special
// token's id on both sides: that is what HF does, so Conveyor does it too.
#include <openssl/evp.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/test_temp_dir.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/jinja/chat_template.h"
#include "text/tokenizer.h"

namespace conveyor {
namespace {

using Json = nlohmann::ordered_json;

std::string SourceRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `command`; on failure adds a failure with its output (in `log`) and returns false.
bool RunLogged(const std::string& command, const std::string& log) {
  if (std::system(absl::StrCat(command, " > '", log, "' 2>&1").c_str()) == 0) return true;
  ADD_FAILURE() << command << " failed:\n" << ReadFile(log);
  return false;
}

// Renders `c["context"]` with the template `c["template"]` and tokenizes the text as
// apply_chat_template(tokenize=True) does (no framing tokens); compares text and ids.
void CheckCase(const Json& c, const Tokenizer& tokenizer) {
  const std::string name =
      absl::StrCat(c["template"].get<std::string>(), " / ", c["conversation"].get<std::string>(),
                   " / ", c["context"].dump());
  SCOPED_TRACE(name);
  absl::StatusOr<std::unique_ptr<jinja::ChatTemplate>> chat_template =
      jinja::ChatTemplate::Parse(ReadFile(absl::StrCat(
          SourceRoot(), "/tests/chat_ref/templates/", c["template"].get<std::string>(), ".jinja")));
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  absl::StatusOr<std::string> text = (*chat_template)->Render(c["context"]);
  if (c.contains("raise")) {
    ASSERT_FALSE(text.ok()) << *text;
    EXPECT_EQ(text.status().message(), c["raise"].get<std::string>());
    return;
  }
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_EQ(*text, c["text"].get<std::string>());
  absl::StatusOr<std::vector<int>> ids = tokenizer.Encode(*text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  const std::vector<int> expected = c["ids"].get<std::vector<int>>();
  EXPECT_EQ(*ids, expected) << "conveyor: " << absl::StrJoin(*ids, " ")
                            << "\nhf:       " << absl::StrJoin(expected, " ");
}

TEST(ChatTokensTest, TokenizerJsonMatchesJinja2AndTokenizers) {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  const std::string python = absl::StrCat(
      venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv", "/bin/python");
  ASSERT_TRUE(std::filesystem::exists(python))
      << "no Python with HF tokenizers and jinja2 at " << python
      << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
  TestTempDir dir;
  ASSERT_TRUE(RunLogged(absl::StrCat("'", python, "' '", SourceRoot(),
                                     "/tests/chat_ref/make_chat_cases.py' '", dir.path(), "'"),
                        dir.path() + "/make_chat_cases.log"));
  const Json reference = Json::parse(ReadFile(dir.path() + "/cases.json"));
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers;
  for (const Json& c : reference["cases"]) {
    const std::string name = c["tokenizer"].get<std::string>();
    if (!tokenizers.contains(name)) {
      absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
          Tokenizer::Load(absl::StrCat(dir.path(), "/", name));
      ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
      tokenizers[name] = *std::move(tokenizer);
    }
    CheckCase(c, *tokenizers[name]);
  }
  EXPECT_GE(reference["cases"].size(), 60u);
}

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < size; ++i)
    absl::StrAppend(&hex, absl::Hex(digest[i], absl::kZeroPad2));
  return hex;
}

// The fixtures' tokenizer.model files, trained again exactly as record_spm_cases.py did.
TEST(ChatTokensTest, SentencePieceMatchesRecordedTransformers) {
  const Json fixture = Json::parse(ReadFile(SourceRoot() + "/tests/chat_ref/spm_cases.json"));
  TestTempDir dir;
  std::filesystem::copy_file(SourceRoot() + "/tests/model_gen/corpus.txt",
                             dir.path() + "/corpus.txt");
  for (const auto& [model, spec] : fixture["models"].items()) {
    std::vector<std::string> args;
    for (const Json& arg : spec["spm_train"]) args.push_back("'" + arg.get<std::string>() + "'");
    ASSERT_TRUE(RunLogged(absl::StrCat("cd '", dir.path(), "' && ", absl::StrJoin(args, " ")),
                          dir.path() + "/spm_train.log"));
    const std::string model_dir = absl::StrCat(dir.path(), "/", model);
    std::filesystem::create_directories(model_dir);
    std::filesystem::rename(dir.path() + "/tokenizer.model", model_dir + "/tokenizer.model");
    ASSERT_EQ(Sha256Hex(ReadFile(model_dir + "/tokenizer.model")), spec["sha256"])
        << model << ": spm_train made another tokenizer.model than the ids were recorded "
        << "from (another sentencepiece version?); record them again (tests/chat_ref/README.md)";
  }
  int checked = 0;
  for (const Json& config : fixture["configs"]) {
    SCOPED_TRACE(config["name"].get<std::string>());
    const std::string model_dir = absl::StrCat(dir.path(), "/", config["model"].get<std::string>());
    std::ofstream(model_dir + "/tokenizer_config.json") << config["tokenizer_config"].dump();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(model_dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    ASSERT_EQ((*tokenizer)->kind(), "sentencepiece");
    for (const Json& c : config["texts"]) {
      absl::StatusOr<std::vector<int>> ids = (*tokenizer)->Encode(c["text"].get<std::string>());
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, c["ids"].get<std::vector<int>>()) << "text: " << c["text"].dump();
      ++checked;
    }
    for (const Json& c : config["chats"]) {
      CheckCase(c, **tokenizer);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace conveyor
