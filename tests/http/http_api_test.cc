// The OpenAI-compatible HTTP API end to end: a real conveyor-scheduler (--http_port) and
// conveyor-worker on the tiny test model, driven by the real `openai` Python package and
// curl. tests/http/openai_client_test.py holds the client-side checks, one method per test
// here; this side starts the processes and checks what only the server knows (metrics:
// KV blocks freed after a client disconnects, the `api` label).
//
// The package comes from the test venv that scripts/install-deps.sh creates
// ($CONVEYOR_TEST_VENV, default /opt/conveyor-test-venv); without it these tests fail and
// say so.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include "common/test_temp_dir.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;

// openai_client_test.py expects this template: its messages render as its RENDERED.
constexpr char kChatTemplate[] =
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

std::string VenvPython() {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  return std::string(venv != nullptr ? venv : "/opt/conveyor-test-venv") + "/bin/python";
}

// The value of `name`'s sample whose labels include every `label="value"` in `labels`,
// or -1 if there is none.
double Sample(const std::string& page, const std::string& name,
              const std::vector<std::string>& labels) {
  const std::regex line("^" + name + "\\{([^}]*)\\} ([0-9.e+-]+)$", std::regex::multiline);
  for (auto it = std::sregex_iterator(page.begin(), page.end(), line); it != std::sregex_iterator();
       ++it) {
    const std::string found = (*it)[1];
    bool all = true;
    for (const std::string& label : labels) all = all && found.find(label) != std::string::npos;
    if (all) return std::stod((*it)[2]);
  }
  return -1;
}

// A copy of the test model (its files linked) in `dir`, whose tokenizer_config.json carries
// `chat_template`.
void MakeModelDir(const TestTempDir& dir, const char* chat_template, const char* tool_use) {
  const std::filesystem::path source = TestModelDir("llama3_gqa");
  nlohmann::json config = nlohmann::json::object();
  for (const auto& entry : std::filesystem::directory_iterator(source)) {
    if (entry.path().filename() == "tokenizer_config.json") {
      std::ifstream in(entry.path());
      config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      continue;
    }
    std::filesystem::create_symlink(entry.path(),
                                    std::filesystem::path(dir.path()) / entry.path().filename());
  }
  config["chat_template"] = chat_template;
  if (tool_use != nullptr) {
    config["chat_template"] =
        nlohmann::json::array({{{"name", "default"}, {"template", chat_template}},
                               {{"name", "tool_use"}, {"template", tool_use}}});
  }
  config["bos_token"] = "<s>";
  config["eos_token"] = "</s>";
  dir.WriteFile("tokenizer_config.json", config.dump());
}

// A copy of the test model (its files linked) whose tokenizer_config.json carries
// `kTemplate` (with `kToolUse`: as the named templates "default" and "tool_use"), served
// with the HTTP API on, once per test suite.
template <const char* kTemplate, const char* kToolUse = nullptr>
class ServedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new TestTempDir();
    MakeModelDir(*model_dir_, kTemplate, kToolUse);
    http_port_ = FreePort();
    server_ = new Server({"--model=" + model_dir_->path(),
                          "--http_port=" + std::to_string(http_port_), "--max_num_seqs=64"});
    ASSERT_TRUE(server_->WaitReady());
  }

  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete model_dir_;
    model_dir_ = nullptr;
  }

  // The served model's name: the model directory's base name.
  static std::string ModelName() {
    return std::filesystem::path(model_dir_->path()).filename().string();
  }

  static inline TestTempDir* model_dir_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int http_port_ = 0;
};

class HttpApiTest : public ServedModelTest<kChatTemplate> {
 protected:
  double MetricWithLabels(const std::string& name, const std::vector<std::string>& labels) {
    const auto page = server_->MetricsPage();
    return page.has_value() ? Sample(*page, name, labels) : -1;
  }

  // Waits (up to a limit that only ends a hung test) until `name` reads `value`.
  bool MetricReaches(const std::string& name, double value) {
    for (int i = 0; i < 600; ++i) {
      if (server_->Metric(name) == value) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
};

// Runs openai_client_test.py's `test` against the server on `port`; the test fails with
// the script's verdict (its report is on stderr). `on_streaming`, when given, runs when the
// script says its stream is under way.
void RunClientTest(int port, const std::string& model, const std::string& test,
                   const std::function<void()>& on_streaming = {}) {
  const std::string python = VenvPython();
  ASSERT_TRUE(std::filesystem::exists(python))
      << "the test venv is missing (" << python
      << "): run scripts/install-deps.sh, which creates it with the `openai` package";
  auto client =
      Subprocess::Start({python, CONVEYOR_HTTP_CLIENT_TEST, "--base-url",
                         "http://127.0.0.1:" + std::to_string(port), "--model", model, test});
  ASSERT_TRUE(client.has_value());
  if (on_streaming) {
    ASSERT_TRUE(client->WaitForLine("conveyor-http-test-streaming", 600s).has_value());
    on_streaming();
  }
  const auto verdict = client->WaitForLine("conveyor-http-test:", 600s);
  const auto exit_code = client->Wait(60s);
  ASSERT_TRUE(verdict.has_value())
      << test << " gave no verdict (exit " << exit_code.value_or(-1)
      << "); if it says `No module named 'openai'`, run scripts/install-deps.sh";
  EXPECT_NE(verdict->find("PASS"), std::string::npos) << test << ": " << *verdict;
  EXPECT_EQ(exit_code, 0) << test;
}

TEST_F(HttpApiTest, ModelsAndHealth) {
  RunClientTest(http_port_, ModelName(), "test_models_and_health");
}

TEST_F(HttpApiTest, CompletionWholeAndStreamedAgree) {
  RunClientTest(http_port_, ModelName(), "test_completion_whole_and_streamed_agree");
}

TEST_F(HttpApiTest, DefaultMaxTokensIsOpenAis16) {
  RunClientTest(http_port_, ModelName(), "test_default_max_tokens_is_openais_16");
}

TEST_F(HttpApiTest, ChatWholeAndStreamedAgreeWithTheRenderedPrompt) {
  RunClientTest(http_port_, ModelName(),
                "test_chat_whole_and_streamed_agree_with_the_rendered_prompt");
}

TEST_F(HttpApiTest, StopStrings) { RunClientTest(http_port_, ModelName(), "test_stop_strings"); }

TEST_F(HttpApiTest, Logprobs) { RunClientTest(http_port_, ModelName(), "test_logprobs"); }

TEST_F(HttpApiTest, LogitBias) { RunClientTest(http_port_, ModelName(), "test_logit_bias"); }

TEST_F(HttpApiTest, MetricsForRouters) {
  RunClientTest(http_port_, ModelName(), "test_metrics_for_routers");
}

TEST_F(HttpApiTest, RouterEndpoints) {
  RunClientTest(http_port_, ModelName(), "test_router_endpoints");
}

TEST_F(HttpApiTest, ResponsesApi) { RunClientTest(http_port_, ModelName(), "test_responses_api"); }

TEST_F(HttpApiTest, MessagesApi) { RunClientTest(http_port_, ModelName(), "test_messages_api"); }

TEST_F(HttpApiTest, EchoAndPromptLogprobs) {
  RunClientTest(http_port_, ModelName(), "test_echo_and_prompt_logprobs");
}

TEST_F(HttpApiTest, NChoices) { RunClientTest(http_port_, ModelName(), "test_n_choices"); }

TEST_F(HttpApiTest, SeedMakesSamplingReproducible) {
  RunClientTest(http_port_, ModelName(), "test_seed_makes_sampling_reproducible");
}

TEST_F(HttpApiTest, BadRequestsAreCountedAsRejectedHttpRequests) {
  RunClientTest(http_port_, ModelName(), "test_bad_requests");
  EXPECT_GT(MetricWithLabels("conveyor_requests_rejected_total",
                             {"code=\"invalid_argument\"", "api=\"http\""}),
            0);
  EXPECT_GT(
      MetricWithLabels("conveyor_requests_rejected_total", {"code=\"not_found\"", "api=\"http\""}),
      0);
  EXPECT_EQ(MetricWithLabels("conveyor_requests_rejected_total",
                             {"code=\"invalid_argument\"", "api=\"grpc\""}),
            0);
}

TEST_F(HttpApiTest, DisconnectMidStreamCancelsTheRequestAndFreesItsKvBlocks) {
  const std::vector<std::string> cancelled = {"reason=\"cancelled\"", "api=\"http\""};
  const double cancelled_before = MetricWithLabels("conveyor_requests_finished_total", cancelled);
  RunClientTest(http_port_, ModelName(), "test_disconnect_mid_stream");
  EXPECT_TRUE(MetricReaches("conveyor_requests_running", 0));
  EXPECT_TRUE(MetricReaches("conveyor_kv_blocks_used", 0));
  // Cancelled, not run to its 1500 tokens.
  EXPECT_EQ(MetricWithLabels("conveyor_requests_finished_total", cancelled), cancelled_before + 1);
}

TEST_F(HttpApiTest, CurlStreamsServerSentEvents) {
  RunClientTest(http_port_, ModelName(), "test_curl_streams_server_sent_events");
}

TEST_F(HttpApiTest, StructuredOutputValidates) {
  RunClientTest(http_port_, ModelName(), "test_structured_output_validates");
}

TEST_F(HttpApiTest, StructuredOutputStreamsAsItAnswersWhole) {
  RunClientTest(http_port_, ModelName(), "test_structured_output_streams_as_it_answers_whole");
}

TEST_F(HttpApiTest, JsonObject) { RunClientTest(http_port_, ModelName(), "test_json_object"); }

TEST_F(HttpApiTest, ParseHelperRoundTripsAPydanticModel) {
  RunClientTest(http_port_, ModelName(), "test_parse_helper_round_trips_a_pydantic_model");
}

TEST_F(HttpApiTest, BadSchemasAre400sThatNameTheKeyword) {
  RunClientTest(http_port_, ModelName(), "test_bad_schemas_are_400s_that_name_the_keyword");
}

TEST_F(HttpApiTest, ToolsNeedATemplateThatRendersThem) {
  RunClientTest(http_port_, ModelName(), "test_tools_need_a_template_that_renders_them");
}

// A template in Qwen2.5's (Hermes') style: tools in the system turn, calls in <tool_call>.
constexpr char kToolTemplate[] =
    "{{ bos_token }}{% if tools %}<|system|>You may call these tools:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Call one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call>{{ eos_token }}"
    "{% endif %}{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message.tool_calls or [] %}<tool_call>\n{{ call.function | tojson }}"
    "\n</tool_call>{% endfor %}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

// Tool calling against a model whose template renders tools (hermes syntax, recognised
// from the template).
using HttpToolsTest = ServedModelTest<kToolTemplate>;

TEST_F(HttpToolsTest, RequiredCallsAlwaysParseAndMatchTheirSchemas) {
  RunClientTest(http_port_, ModelName(), "test_tools_required");
}

TEST_F(HttpToolsTest, ANamedFunctionIsTheOneCalled) {
  RunClientTest(http_port_, ModelName(), "test_tools_named");
}

TEST_F(HttpToolsTest, StreamedCallsEqualTheWholeAnswer) {
  RunClientTest(http_port_, ModelName(), "test_tools_streamed_equal_whole");
}

TEST_F(HttpToolsTest, ResponsesAndMessagesCallTheToolsChatWould) {
  RunClientTest(http_port_, ModelName(), "test_responses_and_messages_tools");
}

TEST_F(HttpToolsTest, AutoAnswersAndToolMessagesComeBack) {
  RunClientTest(http_port_, ModelName(), "test_tools_auto_and_tool_messages");
}

// A model with named templates, as Command R and Hermes 2 Pro ship them: a plain
// "default" that ignores tools and a "tool_use" one. Requests with tools render through
// "tool_use" (kChatTemplate does not render tools: they would be a 400), the others
// through "default" (the prompt the client test expects of kChatTemplate).
using HttpNamedTemplatesTest = ServedModelTest<kChatTemplate, kToolTemplate>;

TEST_F(HttpNamedTemplatesTest, ToolsRenderThroughToolUseAndChatsThroughDefault) {
  RunClientTest(http_port_, ModelName(), "test_tools_required");
  RunClientTest(http_port_, ModelName(),
                "test_chat_whole_and_streamed_agree_with_the_rendered_prompt");
}

TEST_F(HttpApiTest, NoReasoningParserRefusesABudget) {
  RunClientTest(http_port_, ModelName(), "test_no_reasoning_parser_refuses_a_budget");
}

// kChatTemplate, with the generation prompt opening <think> (as DeepSeek-R1's and
// Qwen3-Thinking's do) unless enable_thinking is false, when it closes it (as Qwen3's
// does). The server recognises the qwen3 reasoning parser in it.
constexpr char kThinkTemplate[] =
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}";

using HttpReasoningTest = ServedModelTest<kThinkTemplate>;

TEST_F(HttpReasoningTest, ReasoningComesApartWholeAndStreamed) {
  RunClientTest(http_port_, ModelName(), "test_reasoning_whole_and_streamed");
}

TEST_F(HttpReasoningTest, ChatTemplateKwargsTurnThinkingOff) {
  RunClientTest(http_port_, ModelName(), "test_chat_template_kwargs_turn_thinking_off");
}

TEST_F(HttpReasoningTest, ABudgetClosesTheThinkingAndTheAnswerFollows) {
  RunClientTest(http_port_, ModelName(), "test_reasoning_budget_closes_the_thinking");
}

TEST_F(HttpReasoningTest, AConstraintMakesTheOutputTheAnswer) {
  RunClientTest(http_port_, ModelName(), "test_reasoning_and_constraints");
}

// --chat_template: a model whose own template opens <think> after the generation prompt,
// served with a file holding kChatTemplate. Chat requests render through the file: the
// prompt the client test expects of kChatTemplate. A file that does not parse stops the
// scheduler at start (exit 2; jinja_unit_test checks the message names the file and line).
TEST(HttpChatTemplateFlagTest, AFileReplacesTheModelsTemplate) {
  TestTempDir model_dir;
  MakeModelDir(model_dir, kThinkTemplate, nullptr);
  TestTempDir files;
  const std::string mine = files.WriteFile("mine.jinja", kChatTemplate);
  const int port = FreePort();
  {
    Server server({"--model=" + model_dir.path(), "--http_port=" + std::to_string(port),
                   "--chat_template=" + mine});
    ASSERT_TRUE(server.WaitReady());
    RunClientTest(port, std::filesystem::path(model_dir.path()).filename().string(),
                  "test_chat_whole_and_streamed_agree_with_the_rendered_prompt");
  }
  const std::string broken = files.WriteFile("broken.jinja", "ok\n{% if %}");
  std::optional<Subprocess> refused =
      Subprocess::Start({SchedulerBinary(), "--model=" + model_dir.path(), "--port=0",
                         "--metrics_port=0", "--chat_template=" + broken});
  ASSERT_TRUE(refused.has_value());
  refused->DrainStdout();  // The error (naming the file and line) goes to stderr.
  EXPECT_EQ(refused->Wait(30s), 2);
}

TEST_F(HttpApiTest, SixtyFourConcurrentStreamsMatchRunsAlone) {
  const std::vector<std::string> finished = {"reason=\"length\"", "api=\"http\""};
  const double before = MetricWithLabels("conveyor_requests_finished_total", finished);
  RunClientTest(http_port_, ModelName(), "test_64_concurrent_streams");
  // 64 streams and the 4 requests run alone first.
  EXPECT_EQ(MetricWithLabels("conveyor_requests_finished_total", finished), before + 68);
  EXPECT_EQ(
      MetricWithLabels("conveyor_requests_finished_total", {"reason=\"length\"", "api=\"grpc\""}),
      0);
}

TEST(HttpApiNotReadyTest, AnswersUnavailableUntilTheWorkersAreReady) {
  const int http_port = FreePort();
  Server server({"--http_port=" + std::to_string(http_port)}, /*start_worker=*/false);
  RunClientTest(http_port, "llama3_gqa", "test_not_ready");
  const auto page = server.MetricsPage();
  ASSERT_TRUE(page.has_value());
  EXPECT_EQ(
      Sample(*page, "conveyor_requests_rejected_total", {"code=\"unavailable\"", "api=\"http\""}),
      1);
}

TEST(HttpApiQueueFullTest, AFullQueueIs429) {
  const int http_port = FreePort();
  Server server({"--http_port=" + std::to_string(http_port), "--max_queue=0"});
  ASSERT_TRUE(server.WaitReady());
  RunClientTest(http_port, "llama3_gqa", "test_queue_full");
  const auto page = server.MetricsPage();
  ASSERT_TRUE(page.has_value());
  EXPECT_EQ(Sample(*page, "conveyor_requests_rejected_total",
                   {"code=\"resource_exhausted\"", "api=\"http\""}),
            1);
}

TEST(HttpApiWorkerFailureTest, AFailureMidStreamEndsItWithAnErrorEvent) {
  const int http_port = FreePort();
  // The worker does not come back: the request ends once recovery gives up.
  Server server({"--http_port=" + std::to_string(http_port), "--worker_recovery_timeout_s=1"});
  ASSERT_TRUE(server.WaitReady());
  RunClientTest(http_port, "llama3_gqa", "test_error_mid_stream",
                [&] { server.worker().Signal(SIGKILL); });
}

}  // namespace
}  // namespace conveyor::testing
