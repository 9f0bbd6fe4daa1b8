// POST /v1/responses (OpenAI's Responses API, stateless) and POST /v1/messages (Anthropic's
// Messages API) over the chat machinery (docs/http-api.md): a request is translated into
// the Chat Completions request it means and parsed as one, so the chat template, tools,
// structured output and reasoning all apply as they do to /v1/chat/completions; the answer
// is written in the API's own objects and stream events (ResponsesFormatter,
// MessagesFormatter). Pure logic, like openai_protocol.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "conveyor.pb.h"
#include "scheduler/http/openai_protocol.h"

namespace conveyor::scheduler::openai {

// The Chat Completions body a Responses API body means: `input` (a string, or message,
// function_call and function_call_output items) and `instructions` as messages,
// max_output_tokens, function tools (flat), tool_choice, text.format as response_format,
// the sampling fields. What needs stored state (previous_response_id, conversation,
// background) or hosted tools is INVALID_ARGUMENT naming the field.
absl::StatusOr<Json> ResponsesToChat(const Json& body);

// The request fields a Responses API response object repeats (instructions, tools,
// temperature, ...), with the API's defaults for those not given.
Json ResponsesEchoFields(const Json& body);

// The same for an Anthropic Messages API body: `system`, `messages` with text, tool_use and
// tool_result blocks, max_tokens (required), stop_sequences, tools with input_schema,
// tool_choice (auto, any, tool, none), thinking.
absl::StatusOr<Json> MessagesToChat(const Json& body);

// What the chat parser's errors name, in the API's terms (messages -> input,
// max_completion_tokens -> max_output_tokens / max_tokens, response_format -> text.format).
absl::Status RenameChatError(const absl::Status& status, Endpoint endpoint);

// The answer of a chat request as a sequence of blocks (reasoning, text, one per tool call),
// opened, extended and closed as the chat parsers decide them; the subclasses write each
// change as their API's events (streaming) and the whole answer from the blocks.
class BlockFormatter : public AnswerFormatter {
 public:
  void AppendEvents(const v1::GenerateResponse& message, std::string* sse) override;
  void Add(const v1::GenerateResponse& message) override;
  bool reasoning_open() const override { return chat_.reasoning_open(); }
  const v1::Usage& usage() const override { return usage_; }

 protected:
  // `request` is the parsed chat request (endpoint kResponses or kMessages).
  explicit BlockFormatter(const ParsedRequest& request);

  struct Block {
    enum class Kind { kReasoning, kText, kToolCall } kind;
    std::string text;  // Reasoning or text; a call's arguments (JSON text).
    std::string call_id;
    std::string name;
  };
  // The events for a block opened (with no text yet), extended by `delta`, closed.
  virtual void OnOpen(const Block& block, int index, std::string* sse) = 0;
  virtual void OnDelta(const Block& block, int index, std::string_view delta, std::string* sse) = 0;
  virtual void OnClose(const Block& block, int index, std::string* sse) = 0;

  const std::vector<Block>& blocks() const { return blocks_; }
  v1::FinishReason finish_reason() const { return finish_reason_; }
  // The stop string that ended the answer ("" when none did).
  const std::string& stop_string() const { return stop_string_; }
  bool called_tools() const;

 private:
  // Applies one message; events go to `sse` when it is not null.
  void Feed(const v1::GenerateResponse& message, std::string* sse);
  void Extend(Block::Kind kind, std::string_view text, std::string* sse);
  void Open(Block block, std::string* sse);
  void Close(std::string* sse);

  ResponseFormatter chat_;  // The reasoning and tool-call parsers.
  std::vector<Block> blocks_;
  bool open_ = false;  // Whether the last block is open.
  v1::FinishReason finish_reason_ = v1::FINISH_REASON_UNSPECIFIED;
  std::string stop_string_;
  v1::Usage usage_;
};

// The Responses API's response object and its stream (response.created, ...
// response.output_text.delta ..., response.completed or response.incomplete).
class ResponsesFormatter final : public BlockFormatter {
 public:
  // `id`: "resp_N". The response object repeats request.api_fields.
  ResponsesFormatter(const ParsedRequest& request, std::string_view id, int64_t created_unix_s,
                     std::string_view model);

  void AppendStart(std::string* sse) override;
  void AppendEnd(const v1::Usage& usage, std::string* sse) override;
  std::string ErrorEvents(const absl::Status& status) override;
  std::string WholeBody(const std::vector<const AnswerFormatter*>& choices) const override;

 private:
  void OnOpen(const Block& block, int index, std::string* sse) override;
  void OnDelta(const Block& block, int index, std::string_view delta, std::string* sse) override;
  void OnClose(const Block& block, int index, std::string* sse) override;
  // An output item: in progress (while streaming) or done.
  Json Item(const Block& block, int index, bool done) const;
  // The response object: in progress, or as it ended with `usage`.
  Json Object(const v1::Usage* usage) const;
  void Event(std::string_view type, Json data, std::string* sse);

  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const Json fields_;
  int sequence_number_ = 0;
};

// Anthropic's message object and its stream (message_start, content_block_start / delta /
// stop, message_delta, message_stop).
class MessagesFormatter final : public BlockFormatter {
 public:
  // `id`: "msg_N"; `prompt_tokens`: the prompt's, for message_start's usage.
  MessagesFormatter(const ParsedRequest& request, std::string_view id, std::string_view model,
                    int prompt_tokens);

  void AppendStart(std::string* sse) override;
  void AppendEnd(const v1::Usage& usage, std::string* sse) override;
  std::string ErrorEvents(const absl::Status& status) override;
  std::string WholeBody(const std::vector<const AnswerFormatter*>& choices) const override;

 private:
  void OnOpen(const Block& block, int index, std::string* sse) override;
  void OnDelta(const Block& block, int index, std::string_view delta, std::string* sse) override;
  void OnClose(const Block& block, int index, std::string* sse) override;
  Json ContentBlock(const Block& block, bool done) const;
  std::string StopReason() const;
  // The stop_sequence that ended the message, or null.
  Json StopSequence() const;

  const std::string id_;
  const std::string model_;
  const int prompt_tokens_;
};

// The formatter of choice `index` of an answer to `request`, for its endpoint. `id` names
// the answer; `prompt_tokens` is the prompt's length (the Messages API's first event says it).
std::unique_ptr<AnswerFormatter> MakeAnswerFormatter(const ParsedRequest& request,
                                                     std::string_view id, int64_t created_unix_s,
                                                     std::string_view model, int index,
                                                     int prompt_tokens);

// Anthropic's error body {"type": "error", "error": {"type", "message"}}.
std::string MessagesErrorBody(const absl::Status& status);

}  // namespace conveyor::scheduler::openai
