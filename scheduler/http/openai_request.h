// An OpenAI request body all the way to the engine's Request: parsed within JsonLimits
// (openai_protocol.h), a chat rendered through the model's template, then checked and
// tokenized by BuildRequest exactly as a gRPC request is. What the HTTP server runs for
// every generation off its I/O threads, and what tests/fuzz/http_request_fuzzer.cc drives.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "scheduler/http/openai_protocol.h"
#include "scheduler/request.h"
#include "scheduler/request_builder.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer.h"

namespace conveyor::scheduler::openai {

// What a chat request is rendered with.
struct ChatTemplating {
  // The model's template; null when it has none, which makes chat requests 400.
  const jinja::ChatTemplate* chat_template = nullptr;
  // What requests with tools render through: the model's "tool_use" template where it has
  // one (as transformers and llama.cpp choose); null: chat_template.
  const jinja::ChatTemplate* tool_template = nullptr;
  // The template's bos_token and eos_token variables.
  std::string bos_token;
  std::string eos_token;
  // Whether tool_template renders `tools` (a request with tools against one that does not
  // is refused: they would be silently dropped), and the syntax the model writes calls
  // in (from --tool_call_format, or recognised in the template; unset: unknown, and
  // requests with tools are refused saying so).
  bool renders_tools = false;
  std::optional<ToolCallFormat> tool_call_format;
  // How chat outputs are split into reasoning and answer (--reasoning_parser, or
  // recognised in the template), and the reasoning budget of requests that set none
  // (--max_reasoning_tokens; 0: none).
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;
  int default_max_reasoning_tokens = 0;
};

// Whether `chat_template` renders `tools`: a conversation rendered with a tool differs
// from the same without.
bool TemplateRendersTools(const jinja::ChatTemplate& chat_template, std::string_view bos_token,
                          std::string_view eos_token);

// Parses `body`, renders it (chat) and builds the request: one per choice (n). Errors are the
// client's answer: INVALID_ARGUMENT naming the field in this API's terms, NOT_FOUND for an unknown
// model. `parsed` gets what the answer's formatting needs.
absl::StatusOr<std::vector<std::unique_ptr<Request>>> BuildOpenAiRequest(
    Endpoint endpoint, std::string_view body, const ParseOptions& options,
    const ChatTemplating& chat, const ServingLimits& limits, const Tokenizer& tokenizer,
    ParsedRequest* parsed);

}  // namespace conveyor::scheduler::openai
