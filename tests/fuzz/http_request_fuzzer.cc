// Fuzzes the OpenAI-compatible HTTP front's request path: the input's first byte picks the
// endpoint (/v1/completions or /v1/chat/completions), the rest is the request body, which
// goes through what the server runs for every generation (scheduler/http/openai_request.h:
// the bounded JSON parse, the chat template of tests/jinja_ref/templates/qwen25_style.jinja
// with tools, BuildRequest with a real tokenizer).
//
// Differential: the bounded parser (text/bounded_json.h) against nlohmann's own parser
// with no bound, whose tree's depth is measured here with an explicit stack. A document the
// reference refuses must be refused; one deeper than the limit must be refused; one within
// the limits must be accepted and parse to the same value.
//
// The answer's contract: a refusal is 400 or 404 in OpenAI's error shape ({"error":
// {message, type, param, code}}) with a message short enough that it never echoes the
// body back; an accepted request fits the limits it was checked against.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/http/openai_request.h"
#include "scheduler/http/responses_api.h"
#include "tests/fuzz/fuzz_support.h"
#include "text/bounded_json.h"
#include "text/jinja/chat_template.h"

namespace conveyor::fuzz {
namespace {

using Json = nlohmann::ordered_json;
using scheduler::openai::Endpoint;

// Longest error message allowed: the longest fixed text plus a few short excerpts.
constexpr size_t kMaxMessageBytes = 600;

struct Context {
  std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer("llama3");
  std::unique_ptr<jinja::ChatTemplate> chat_template;
  scheduler::openai::ParseOptions options;
  scheduler::openai::ChatTemplating chat;
  scheduler::ServingLimits limits;

  Context() {
    std::ifstream in(CONVEYOR_FUZZ_CHAT_TEMPLATE);
    std::stringstream source;
    source << in.rdbuf();
    auto parsed = jinja::ChatTemplate::Parse(source.str());
    if (!parsed.ok()) InvariantViolated("the fuzz chat template", parsed.status().ToString());
    chat_template = *std::move(parsed);
    chat.chat_template = chat_template.get();
    chat.bos_token = "<|begin_of_text|>";
    chat.eos_token = "<|end_of_text|>";
    options.model_name = "tiny";
    options.model_aliases = {"/models/tiny"};
    limits.vocab_size = tokenizer->vocab_size() + 64;
    limits.max_context_tokens = 2048;
    limits.kv_capacity_tokens = 1024;
    limits.eos_token_ids = {tokenizer->eos_id()};
    limits.bos_token_id = tokenizer->bos_id();
  }
};

// Depth of arrays and objects in `value`, counted without recursion.
int Depth(const Json& value) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> stack = {{&value, 0}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const Json& child : *v) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}

void CheckJsonAgainstReference(std::string_view body, const JsonLimits& limits) {
  // nlohmann's parser takes a NUL byte for the end of its input; JSON never holds one.
  const bool has_nul = body.find('\0') != std::string_view::npos;
  const Json reference = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  const absl::StatusOr<Json> ours = ParseBoundedJson(body, limits, "the request body");
  if (reference.is_discarded() || has_nul) {
    if (ours.ok()) InvariantViolated("accepted JSON that nlohmann refuses", body);
    return;
  }
  const int depth = Depth(reference);
  if (depth > limits.max_depth) {
    if (ours.ok()) InvariantViolated("accepted JSON deeper than the limit", body);
    return;
  }
  if (!ours.ok()) {
    // Fuzz inputs are far below the value-count limit.
    InvariantViolated("refused JSON within the limits", ours.status().ToString());
  }
  if (*ours != reference) InvariantViolated("parsed differently from nlohmann", body);
}

void CheckRefusal(const absl::Status& status, std::string_view body) {
  const int http = scheduler::openai::HttpStatusFor(status);
  if (http != 400 && http != 404) {
    InvariantViolated(absl::StrCat("a refusal answered ", http), status.ToString());
  }
  const Json answer = Json::parse(scheduler::openai::ErrorBody(status), nullptr, false);
  const bool shaped =
      answer.is_object() && answer.size() == 1 && answer.contains("error") &&
      answer["error"].is_object() && answer["error"]["message"].is_string() &&
      answer["error"]["type"].is_string() &&
      (answer["error"]["param"].is_string() || answer["error"]["param"].is_null()) &&
      (answer["error"]["code"].is_string() || answer["error"]["code"].is_null());
  if (!shaped) InvariantViolated("an error answer not in OpenAI's shape", status.ToString());
  const std::string& message = answer["error"]["message"].get_ref<const std::string&>();
  if (message.empty() || message.size() > kMaxMessageBytes) {
    InvariantViolated("an empty or overlong error message", message);
  }
  if (!IsWellFormedUtf8(message)) InvariantViolated("an error message that is not UTF-8", message);
  (void)body;
}

// Formats an answer to the accepted request, whole and streamed: a message of text that may
// hold reasoning or tool-call syntax, then the final one. Nothing may throw, and the whole
// answer must be JSON.
void FormatAnswer(const scheduler::openai::ParsedRequest& parsed, int prompt_tokens) {
  v1::GenerateResponse first;
  first.add_token_ids(5);
  first.set_text("<think>a</think>x <tool_call>\n{\"name\": \"f\", \"arguments\": {}}");
  v1::GenerateResponse last;
  last.add_token_ids(6);
  last.set_text("\n</tool_call>");
  last.set_finish_reason(v1::FINISH_REASON_EOS);
  last.mutable_usage()->set_prompt_tokens(prompt_tokens);
  last.mutable_usage()->set_generated_tokens(2);
  auto whole = scheduler::openai::MakeAnswerFormatter(parsed, "id-1", 1, "tiny", 0, prompt_tokens);
  whole->Add(first);
  whole->Add(last);
  if (Json::parse(whole->WholeBody({whole.get()}), nullptr, false).is_discarded()) {
    InvariantViolated("a whole answer that is not JSON", "");
  }
  auto streamed =
      scheduler::openai::MakeAnswerFormatter(parsed, "id-1", 1, "tiny", 0, prompt_tokens);
  std::string sse;
  streamed->AppendStart(&sse);
  streamed->AppendEvents(first, &sse);
  streamed->AppendEvents(last, &sse);
  streamed->AppendEnd(last.usage(), &sse);
  if (sse.empty()) InvariantViolated("a stream with no events", "");
}

void CheckAccepted(const scheduler::Request& r, const scheduler::ServingLimits& limits) {
  if (r.tokens.empty() || r.num_prompt_tokens != r.num_tokens()) {
    InvariantViolated("prompt tokens", "");
  }
  for (int32_t id : r.tokens) {
    if (id < 0 || id >= limits.vocab_size) InvariantViolated("a token outside the vocabulary", "");
  }
  if (r.max_new_tokens < 1 || r.num_prompt_tokens + r.max_new_tokens > limits.max_context_tokens ||
      r.num_prompt_tokens + r.max_new_tokens > limits.kv_capacity_tokens) {
    InvariantViolated("an accepted request exceeds the context or the KV cache", "");
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  static const Context* context = new Context();
  if (size == 0) return;
  constexpr Endpoint kEndpoints[] = {Endpoint::kCompletions, Endpoint::kChatCompletions,
                                     Endpoint::kResponses, Endpoint::kMessages};
  const Endpoint endpoint = kEndpoints[data[0] % 4];
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  CheckJsonAgainstReference(body, context->options.json_limits);
  scheduler::openai::ParsedRequest parsed;
  auto built =
      scheduler::openai::BuildOpenAiRequest(endpoint, body, context->options, context->chat,
                                            context->limits, *context->tokenizer, &parsed);
  if (!built.ok()) return CheckRefusal(built.status(), body);
  for (const std::unique_ptr<scheduler::Request>& r : *built) CheckAccepted(*r, context->limits);
  FormatAnswer(parsed, built->front()->num_prompt_tokens);
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
