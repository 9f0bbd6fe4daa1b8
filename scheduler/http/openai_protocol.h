// The wire format of the OpenAI-compatible HTTP API (docs/http-api.md): turns the JSON
// bodies of POST /v1/completions and /v1/chat/completions into the scheduler's
// GenerateRequest, and the engine's GenerateResponse messages back into OpenAI's objects,
// whole or as Server-Sent Events. Pure logic: no sockets, engine or threads, so every field
// rule is tested on its own (openai_protocol_test.cc); http_server.h does the transport.
//
// Errors are absl::Status values up to the HTTP boundary, where HttpStatusFor and
// ErrorBody turn them into OpenAI's {"error": {message, type, param, code}} with the
// matching HTTP status. A status may carry the request field at fault ("param") and an
// OpenAI error code as payloads (WithParam, WithCode).
//
// JSON is nlohmann::ordered_json throughout: the chat template must see the message and
// tool objects' keys in the order the client sent them (as Python would), and responses
// read best with "id" first. Nothing here throws: bodies are parsed with exceptions off
// and every value's type is checked before it is read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "conveyor.pb.h"
#include "nlohmann/json.hpp"
#include "scheduler/http/reasoning.h"
#include "scheduler/http/tool_calls.h"
#include "text/bounded_json.h"

namespace conveyor::scheduler::openai {

using Json = nlohmann::ordered_json;

// The HTTP route: OpenAI's completions and chat completions, OpenAI's Responses API and
// Anthropic's Messages API (both parsed as the chat request they mean, responses_api.h).
enum class Endpoint { kCompletions, kChatCompletions, kResponses, kMessages };

// What a chat request's tool_choice asks of the model.
enum class ToolChoice {
  kNone,      // No tools (none given, or "none": the template does not see them).
  kAuto,      // The model may call them; its output is parsed for calls.
  kRequired,  // It must call one or more: the output is constrained to calls.
  kFunction,  // It must call the named one (ParsedRequest::tool_function).
};

// What a request is checked against.
struct ParseOptions {
  // The served model: what responses and /v1/models call it.
  std::string model_name;
  // Other names a request's `model` may use for it (the --model path as given).
  std::vector<std::string> model_aliases;
  // The most alternatives `logprobs` / `top_logprobs` may ask for (ServingLimits').
  int max_logprobs = 20;
  // How deep and how large a body may be (checked before the body is parsed).
  JsonLimits json_limits;
};

// OpenAI's default for /v1/completions when max_tokens is absent (chat requests without a
// limit get the server's --default_max_new_tokens, as gRPC ones do).
inline constexpr int kCompletionsDefaultMaxTokens = 16;

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // The engine's request: sampling, stopping, logprobs and, for completions, the prompt.
  // A chat request's prompt is set by SetChatPrompt once the template has rendered it.
  v1::GenerateRequest generate;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities as the client asked for them: none, or the chosen token's plus
  // `top_logprobs` alternatives. generate.logprobs asks the engine for at least one,
  // because the engine reports the chosen token's only together with alternatives.
  bool logprobs = false;
  int top_logprobs = 0;
  // Completions only: the answer starts with the prompt (its text, set by
  // BuildOpenAiRequest, and with logprobs its tokens' scores: generate.prompt_logprobs).
  bool echo = false;
  std::string echo_text;
  // Responses API: the request fields its response object repeats.
  Json api_fields;
  // Chat only: the messages (content parts joined into one string; tool calls'
  // arguments as objects, as templates expect) and the tools (null when absent or
  // tool_choice is "none"), in the client's key order.
  Json messages;
  Json tools;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_function;  // kFunction: the function's name.
  bool parallel_tool_calls = true;
  // Set by BuildOpenAiRequest when tools are on: the syntax the output is parsed with.
  std::optional<ToolCallFormat> tool_call_format;
  // Chat only: extra variables for the chat template (vLLM's chat_template_kwargs, e.g.
  // {"enable_thinking": false} for Qwen3); null when absent.
  Json chat_template_kwargs;
  // Chat only: the client's budget of reasoning tokens (docs/reasoning.md).
  std::optional<int> max_reasoning_tokens;
  // Set by BuildOpenAiRequest: how the output is split into reasoning and answer (kNone:
  // not at all), and where the rendered prompt left the <think> block.
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;
  PromptThinking prompt_thinking = PromptThinking::kNone;
  // Set by BuildOpenAiRequest when a reasoning budget applies: the engine's request is
  // limited to `reasoning_budget_tokens` and the answer continues in a second generation
  // (http_server.cc) up to `total_max_tokens` in all.
  int reasoning_budget_tokens = 0;
  int total_max_tokens = 0;
};

// Parses and checks a request body. INVALID_ARGUMENT names the field (also as the param
// payload); an unknown model is NOT_FOUND with code "model_not_found". Sampling ranges and
// the limits that depend on the model are left to BuildRequest, as for gRPC requests.
absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           const ParseOptions& options);

// Whether a request's `model` names the served model (its name or an alias).
bool ServesModel(const ParseOptions& options, std::string_view model);
// NOT_FOUND "model_not_found" for a `model` this server does not serve.
absl::Status ModelNotFoundError(std::string_view model, const ParseOptions& options);

// The chat template's variables for `request`: messages, tools (when given),
// add_generation_prompt = true, bos_token and eos_token, and the request's
// chat_template_kwargs, which may set any variable but `messages` (as vLLM's and
// transformers' keyword arguments override the defaults).
Json ChatTemplateContext(const ParsedRequest& request, std::string_view bos_token,
                         std::string_view eos_token);

// Makes the rendered chat prompt the request's text, with add_bos false: a template that
// wants a BOS writes its text itself, and the tokenizer turns special-token text into its
// id (text/tokenizer.h), as Hugging Face's apply_chat_template + encode(...,
// add_special_tokens=False) does. Adding BOS again would double it.
void SetChatPrompt(std::string rendered, v1::GenerateRequest* generate);

// BuildRequest names the gRPC fields in its messages (max_new_tokens, token_ids, text);
// returns `status` with the names this API's clients know instead.
absl::Status RenameBuildError(const absl::Status& status);

// --- Errors ---

// `status` with the request field at fault, reported as the error's "param".
absl::Status WithParam(absl::Status status, absl::string_view param);
// The request field `status` names (WithParam), if any.
std::optional<std::string> ParamPayload(const absl::Status& status);
// `status` with an OpenAI error code ("model_not_found", "unknown_url", ...).
absl::Status WithCode(absl::Status status, absl::string_view code);
// 400 for bad input, 401/403 for credentials, 404, 429 (queue full), 503 (not ready,
// draining or failed workers), 500 otherwise.
int HttpStatusFor(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}} for a non-OK `status`.
std::string ErrorBody(const absl::Status& status);
// The same shape for an answer the HTTP transport or router gives by itself (400, 405, 408,
// 413, 431, 503): the type follows the status, the code names the condition
// ("request_timeout", "request_too_large", ...).
std::string HttpErrorBody(int http_status, std::string_view message);
// The same as one SSE event, for an error after a stream has started.
std::string ErrorEvent(const absl::Status& status);

// --- Responses ---

// GET /v1/models, and GET /v1/models/{model} (ModelObject).
std::string ModelList(std::string_view model_name, int64_t created_unix_s);
std::string ModelObject(std::string_view model_name, int64_t created_unix_s);

// Writes one request's answer in OpenAI's shape, either as SSE events (AppendStart, then
// AppendEvents per engine message) or as one body (Add per message, then Body).
// How one choice's answer is written for its client: whole (Add, then WholeBody) or as
// Server-Sent Events (AppendStart, AppendEvents per engine message, AppendEnd once every
// choice has ended). ResponseFormatter writes OpenAI's completions and chat objects;
// responses_api.h the Responses API's and Anthropic's Messages API's.
class AnswerFormatter {
 public:
  virtual ~AnswerFormatter() = default;
  virtual void AppendStart(std::string* sse) = 0;
  virtual void AppendEvents(const v1::GenerateResponse& message, std::string* sse) = 0;
  // `usage`: every choice's (ResponseFormatter::SumUsage).
  virtual void AppendEnd(const v1::Usage& usage, std::string* sse) = 0;
  // The events that end a stream that failed after it started.
  virtual std::string ErrorEvents(const absl::Status& status) { return ErrorEvent(status); }
  virtual void Add(const v1::GenerateResponse& message) = 0;
  // The whole answer of `choices` (this one first; all of this formatter's type).
  virtual std::string WholeBody(const std::vector<const AnswerFormatter*>& choices) const = 0;
  // Whether the output so far is inside its reasoning (false without a reasoning parser).
  virtual bool reasoning_open() const = 0;
  // The choice's usage, once its final message was formatted.
  virtual const v1::Usage& usage() const = 0;
};

class ResponseFormatter final : public AnswerFormatter {
 public:
  // `id`: "cmpl-N" or "chatcmpl-N"; `model`: the served model's name; `index`: the
  // choice it formats (one formatter per choice when n > 1).
  ResponseFormatter(const ParsedRequest& request, std::string_view id, int64_t created_unix_s,
                    std::string_view model, int index = 0);

  // The events that open a stream (chat: the assistant role's delta; completions: none).
  void AppendStart(std::string* sse) override;
  // The events for one engine message. Messages with no text and nothing else to say
  // (text held back for a stop string) produce none; the final one ends with the
  // choice's finish chunk.
  void AppendEvents(const v1::GenerateResponse& message, std::string* sse) override;
  // The events that end a stream once every choice has: the usage chunk (all choices'),
  // when asked for, and "data: [DONE]".
  void AppendEnd(const v1::Usage& usage, std::string* sse) override;

  // Non-streaming: collects one engine message.
  void Add(const v1::GenerateResponse& message) override;
  bool reasoning_open() const override {
    return reasoning_parser_ != nullptr && reasoning_parser_->reasoning_open();
  }
  std::string WholeBody(const std::vector<const AnswerFormatter*>& choices) const override;

  // A chat message's next part: its reasoning, content and tool-call fragments, as the
  // reasoning and tool-call parsers decide them (the final message flushes both).
  struct ChatDelta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCallDelta> tool_calls;
  };
  ChatDelta NextChatDelta(const v1::GenerateResponse& message);
  // The text_completion / chat.completion object, once the final message was added.
  std::string Body() const { return Body({this}); }
  // The same for n choices, one formatter each (in index order), the usage summed.
  static std::string Body(const std::vector<const ResponseFormatter*>& choices);
  // The usage of n choices: the prompt's once, every choice's generated tokens.
  static v1::Usage SumUsage(const std::vector<v1::Usage>& choices);
  const v1::Usage& usage() const override { return usage_; }

 private:
  // Appends `message`'s token log-probabilities to `out`: completions' parallel arrays
  // (tokens, token_logprobs, top_logprobs, text_offset) or chat's content list.
  void AppendLogprobs(const v1::GenerateResponse& message, Json* out);
  Json EmptyLogprobs() const;
  std::string Chunk(absl::string_view choice) const;
  // The choice's entry in a whole body's choices.
  Json ChoiceJson() const;
  // Completions' logprobs arrays, one entry more: `lp` (`scored` false: the prompt's first
  // token, which has no logprob).
  void AppendCompletionLogprob(const v1::TokenLogprobs& lp, bool scored, Json* out);

  const Endpoint endpoint_;
  const bool include_usage_;
  const bool logprobs_;
  const int top_logprobs_;
  const int index_;
  const std::string index_field_;  // {"index":N, as every chunk's choice opens.
  // Echo: the prompt's text, sent before the first message's; then empty.
  std::string echo_text_;
  // `message`'s text, after the echoed prompt the first time (then built in `scratch`).
  const std::string& TextWithEcho(const v1::GenerateResponse& message, std::string* scratch);
  const Json head_;         // id, object, created, model.
  std::string chunk_head_;  // A chunk's JSON up to its choices: {"id":...,"choices":[
  int text_offset_ = 0;     // Completions' text_offset of the next token.
  // Finishes the tool-call parse of a whole response (non-streaming).
  void FinishToolCalls();
  // A streamed chunk's tool_calls array for `calls`.
  static Json ToolCallDeltas(const std::vector<ToolCallDelta>& calls);

  // `text` split into reasoning and content (all content without a reasoning parser);
  // `final`: the output ends with it.
  ReasoningDelta SplitReasoning(const std::string& text, bool final);
  // Non-null when the output is split into reasoning and answer.
  std::unique_ptr<ReasoningParser> reasoning_parser_;
  std::string reasoning_;  // Non-streaming: the reasoning so far.

  // Non-null when the output is parsed for tool calls.
  std::unique_ptr<ToolCallParser> tool_parser_;
  int tool_calls_made_ = 0;
  // Non-streaming state.
  std::string text_;
  ParsedToolCalls parsed_calls_;
  Json logprobs_json_;
  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;
  Json stop_reason_;  // vLLM's stop_reason (StopReasonJson).
  v1::Usage usage_;
};

}  // namespace conveyor::scheduler::openai
