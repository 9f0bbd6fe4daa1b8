// `--model FILE.gguf` end to end: a real conveyor-scheduler and conveyor-worker serving a
// GGUF file on its own (weights, config, tokenizer and chat template all from the file),
// against the same checkpoint served from its Hugging Face directory.
//
// The file is the tied_mha_bf16_sharded test checkpoint written by
// tests/gguf_ref/hf_to_gguf.py as convert_hf_to_gguf would (F32 tensors, the
// tokenizer.model's pieces, scores and types as a "llama" vocabulary, a chat template).
// F32 weights give the directory's logits bit for bit (gguf_model_test), so a text prompt
// must stream the same tokens and text through gRPC when the GGUF file's tokenizer encodes
// it as the directory's sentencepiece model does, which is checked first over the test
// corpus. Then the OpenAI HTTP endpoints, chat included, with tests/http's client script.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"
#include "text/tokenizer.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;

constexpr char kVariant[] = "tied_mha_bf16_sharded";
// openai_client_test.py's chat test expects this template (http_api_test.cc's), with
// bos_token "<s>" and eos_token "</s>": the GGUF's bos/eos ids name those pieces.
constexpr char kChatTemplate[] =
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

std::string SourceRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

std::string VenvPython() {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  return std::string(venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv") +
         "/bin/python";
}

// The test checkpoint as one GGUF file, written once per test suite.
class GgufServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TestTempDir();
    gguf_ = dir_->path() + "/tiny.gguf";
    const std::string python = VenvPython();
    if (!std::filesystem::exists(python)) {
      ADD_FAILURE() << "no Python with the gguf package at " << python
                    << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
      return;
    }
    const std::string command =
        absl::StrCat("'", python, "' '", SourceRoot(), "/tests/gguf_ref/hf_to_gguf.py' --model '",
                     TestModelDir(kVariant), "' --out '", gguf_, "' --type f32 --chat-template \"",
                     kChatTemplate, "\"");
    if (std::system(command.c_str()) != 0) ADD_FAILURE() << command << " failed";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(std::filesystem::exists(gguf_)) << gguf_; }

  static inline TestTempDir* dir_ = nullptr;
  static inline std::string gguf_;
};

std::vector<std::string> CorpusLines() {
  std::ifstream in(SourceRoot() + "/tests/model_gen/corpus.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> lines = absl::StrSplit(text.str(), '\n', absl::SkipEmpty());
  lines.insert(lines.end(),
               {" leading space", "two  spaces", "tabs\tand\nnewlines\n", "digits 12345 and 3.14",
                "<s>[INST] hi [/INST]</s>", "emoji 🚀 ok", "naïve café", "  "});
  return lines;
}

TEST_F(GgufServingTest, TheFilesTokenizerEncodesLikeTheModelsSentencepiece) {
  auto spm = Tokenizer::Load(TestModelDir(kVariant));
  auto gguf = Tokenizer::Load(gguf_);
  ASSERT_TRUE(spm.ok() && gguf.ok()) << spm.status() << gguf.status();
  ASSERT_EQ((*spm)->kind(), "sentencepiece");
  ASSERT_EQ((*gguf)->kind(), "gguf");
  EXPECT_EQ((*gguf)->vocab_size(), (*spm)->vocab_size());
  EXPECT_EQ((*gguf)->bos_id(), (*spm)->bos_id());
  EXPECT_EQ((*gguf)->eos_id(), (*spm)->eos_id());
  int same = 0, total = 0;
  for (const std::string& line : CorpusLines()) {
    const auto want = (*spm)->EncodeWithSpecialTokens(line);
    const auto got = (*gguf)->EncodeWithSpecialTokens(line);
    ASSERT_TRUE(want.ok() && got.ok());
    ++total;
    if (*got == *want) {
      ++same;
    } else if (total - same <= 5) {
      ADD_FAILURE() << "\"" << line << "\" encodes differently";
    }
    // Decoding text's tokens gives the same text. (Not control tokens: HF's decode writes
    // "<s>", sentencepiece's nothing; text/tokenizer.h. So they are skipped, as
    // skip_special_tokens does.)
    std::vector<int> plain;
    for (const int id : *got) {
      if (!(*gguf)->IsSpecial(id)) plain.push_back(id);
    }
    EXPECT_EQ((*gguf)->Decode(plain), (*spm)->Decode(plain)) << line;
  }
  std::cout << "[ tally    ] " << same << "/" << total << " lines encode identically\n";
}

// Streams a greedy text generation from a server on `model`; also returns its model info,
// and checks the streamed text is the model's tokenizer's decoding of the tokens unless
// they hold byte tokens (a random model's stray bytes stream as U+FFFD where the whole
// decode of HF's ByteFallback may differ: scheduler/detokenizer.h).
Stream GenerateFrom(const std::string& model, v1::ModelInfoResponse* info) {
  auto tokenizer = Tokenizer::Load(model);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  Server server({"--model=" + model});
  EXPECT_TRUE(server.WaitReady());
  grpc::ClientContext context;
  auto stub = v1::Conveyor::NewStub(server.channel());
  EXPECT_TRUE(stub->GetModelInfo(&context, v1::ModelInfoRequest(), info).ok());
  v1::GenerateRequest request;
  request.set_text("Once upon a time, the conveyor");
  request.set_max_new_tokens(24);
  request.set_temperature(0);
  request.set_ignore_eos(true);
  Stream stream = server.Generate(request);
  if (tokenizer.ok() && std::none_of(stream.tokens.begin(), stream.tokens.end(), [&](int id) {
        return absl::StartsWith((*tokenizer)->Piece(id), "<0x");
      })) {
    EXPECT_EQ(stream.text, (*tokenizer)->Decode({stream.tokens.begin(), stream.tokens.end()}))
        << model;
  }
  return stream;
}

TEST_F(GgufServingTest, StreamsOverGrpcWhatTheDirectoryStreams) {
  v1::ModelInfoResponse dir_info, gguf_info;
  const Stream from_dir = GenerateFrom(TestModelDir(kVariant), &dir_info);
  const Stream from_gguf = GenerateFrom(gguf_, &gguf_info);
  ASSERT_TRUE(from_dir.status.ok()) << from_dir.status.error_message();
  ASSERT_TRUE(from_gguf.status.ok()) << from_gguf.status.error_message();
  EXPECT_EQ(gguf_info.tokenizer(), "gguf");
  EXPECT_EQ(gguf_info.vocab_size(), dir_info.vocab_size());
  EXPECT_EQ(from_gguf.tokens.size(), 24u);
  // The same tokens; their texts are each tokenizer's decoding (checked above), which
  // differ where this random model emits the unknown token (sentencepiece writes " ⁇ ",
  // HF's decode "<unk>") or byte tokens that are not UTF-8.
  EXPECT_EQ(from_gguf.tokens, from_dir.tokens);
  EXPECT_FALSE(from_gguf.text.empty());
  EXPECT_EQ(from_gguf.last.usage().prompt_tokens(), from_dir.last.usage().prompt_tokens());
  EXPECT_GT(from_gguf.last.usage().prompt_tokens(), 1);
}

// Runs openai_client_test.py's `test` against the server on `port`.
void RunClientTest(int port, const std::string& model, const std::string& test) {
  const std::string python = VenvPython();
  ASSERT_TRUE(std::filesystem::exists(python)) << "the test venv is missing (" << python << ")";
  auto client =
      Subprocess::Start({python, SourceRoot() + "/tests/http/openai_client_test.py", "--base-url",
                         "http://127.0.0.1:" + std::to_string(port), "--model", model, test});
  ASSERT_TRUE(client.has_value());
  const auto verdict = client->WaitForLine("conveyor-http-test:", 600s);
  const auto exit_code = client->Wait(60s);
  ASSERT_TRUE(verdict.has_value())
      << test << " gave no verdict (exit " << exit_code.value_or(-1) << ")";
  EXPECT_NE(verdict->find("PASS"), std::string::npos) << test << ": " << *verdict;
  EXPECT_EQ(exit_code, 0) << test;
}

TEST_F(GgufServingTest, ServesTheOpenAiEndpointsWithTheFilesChatTemplate) {
  const int http_port = FreePort();
  Server server({"--model=" + gguf_, "--http_port=" + std::to_string(http_port)});
  ASSERT_TRUE(server.WaitReady());
  // The served model's name is the file's.
  for (const char* test : {"test_models_and_health", "test_completion_whole_and_streamed_agree",
                           "test_chat_whole_and_streamed_agree_with_the_rendered_prompt",
                           "test_curl_streams_server_sent_events"}) {
    SCOPED_TRACE(test);
    RunClientTest(http_port, "tiny.gguf", test);
  }
}

}  // namespace
}  // namespace conveyor::testing
