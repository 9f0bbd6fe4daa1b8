#include "scheduler/http/openai_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::scheduler::openai {
namespace {

absl::Status RenderChat(const ChatTemplating& chat, ParsedRequest* parsed) {
  if (chat.chat_template == nullptr) {
    return WithParam(
        absl::InvalidArgumentError(
            "the model has no chat template (no chat_template.jinja, and no chat_template in "
            "tokenizer_config.json); use /v1/completions"),
        "messages");
  }
  absl::StatusOr<std::string> prompt =
      chat.chat_template->Render(ChatTemplateContext(*parsed, chat.bos_token, chat.eos_token));
  if (!prompt.ok()) {
    // Templates reject conversations they cannot format (raise_exception): the client's
    // to fix.
    return WithParam(absl::Status(prompt.status().code(), absl::StrCat("the chat template failed: ",
                                                                       prompt.status().message())),
                     "messages");
  }
  SetChatPrompt(*std::move(prompt), &parsed->generate);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Request>> BuildOpenAiRequest(
    Endpoint endpoint, std::string_view body, const ParseOptions& options,
    const ChatTemplating& chat, const ServingLimits& limits, const Tokenizer& tokenizer,
    ParsedRequest* parsed) {
  ASSIGN_OR_RETURN(*parsed, ParseRequest(endpoint, body, options));
  if (endpoint == Endpoint::kChatCompletions) RETURN_IF_ERROR(RenderChat(chat, parsed));
  absl::StatusOr<std::unique_ptr<Request>> built =
      BuildRequest(parsed->generate, limits, tokenizer);
  if (!built.ok()) return RenameBuildError(built.status());
  return built;
}

}  // namespace conveyor::scheduler::openai
