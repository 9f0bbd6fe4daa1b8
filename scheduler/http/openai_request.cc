#include "scheduler/http/openai_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "scheduler/http/responses_api.h"

namespace conveyor::scheduler::openai {
namespace {

absl::Status RenderChat(const ChatTemplating& chat, ParsedRequest* parsed) {
  const jinja::ChatTemplate* chat_template =
      parsed->tools.is_null() || chat.tool_template == nullptr ? chat.chat_template
                                                               : chat.tool_template;
  if (chat_template == nullptr) {
    return WithParam(
        absl::InvalidArgumentError(
            "the model has no chat template (no chat_template.jinja, and no chat_template in "
            "tokenizer_config.json); use /v1/completions"),
        "messages");
  }
  absl::StatusOr<std::string> prompt =
      chat_template->Render(ChatTemplateContext(*parsed, chat.bos_token, chat.eos_token));
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

// With tools on: refuses them where the template would drop them or the output could not
// be parsed, sets the syntax the output is parsed with, and for "required" or a named
// function constrains the output to calls.
absl::Status ApplyTools(const ChatTemplating& chat, ParsedRequest* parsed) {
  if (parsed->tool_choice == ToolChoice::kNone) return absl::OkStatus();
  if (!chat.renders_tools) {
    return WithParam(absl::InvalidArgumentError(
                         "the model's chat template does not render tools, so the model would "
                         "never see them; send the request without tools, or serve a template "
                         "that renders them"),
                     "tools");
  }
  if (!chat.tool_call_format.has_value()) {
    return WithParam(absl::InvalidArgumentError(
                         "the server does not know the syntax this model writes tool calls in; "
                         "start it with --tool_call_format (llama3_json, hermes or mistral)"),
                     "tools");
  }
  parsed->tool_call_format = chat.tool_call_format;
  if (parsed->tool_choice == ToolChoice::kAuto) return absl::OkStatus();
  if (parsed->generate.has_constraint()) {
    return WithParam(absl::InvalidArgumentError(
                         "tool_choice \"required\" or a named function constrains the output "
                         "to tool calls; it cannot be combined with response_format or regex"),
                     "tool_choice");
  }
  absl::StatusOr<std::string> grammar =
      ToolCallGrammar(*chat.tool_call_format, parsed->tools,
                      parsed->tool_choice == ToolChoice::kFunction ? parsed->tool_function : "",
                      parsed->parallel_tool_calls);
  if (!grammar.ok()) return WithParam(grammar.status(), "tools");
  parsed->generate.mutable_constraint()->set_grammar(*std::move(grammar));
  return absl::OkStatus();
}

// Chooses how the output is split into reasoning and answer, and the reasoning budget.
// A constraint (response_format, regex, tool_choice "required" or a named function)
// covers the whole output, so it is the answer: no split, and a budget is refused.
absl::Status ApplyReasoning(const ChatTemplating& chat, ParsedRequest* parsed) {
  const bool constrained = parsed->generate.has_constraint();
  if (parsed->max_reasoning_tokens.has_value()) {
    if (chat.reasoning_format == ReasoningFormat::kNone) {
      return WithParam(absl::InvalidArgumentError(
                           "max_reasoning_tokens needs a reasoning model: the server splits no "
                           "reasoning from this model's output (see --reasoning_parser)"),
                       "max_reasoning_tokens");
    }
    if (constrained) {
      return WithParam(absl::InvalidArgumentError(
                           "max_reasoning_tokens cannot be combined with response_format, regex "
                           "or a tool_choice that forces calls: the constraint applies to the "
                           "whole output, which then has no reasoning part"),
                       "max_reasoning_tokens");
    }
  }
  if (constrained || chat.reasoning_format == ReasoningFormat::kNone) return absl::OkStatus();
  parsed->reasoning_format = chat.reasoning_format;
  parsed->prompt_thinking = PromptThinkingState(parsed->generate.text());
  // A prompt that closed the block (thinking turned off) has nothing to budget.
  if (parsed->prompt_thinking != PromptThinking::kClosed) {
    parsed->reasoning_budget_tokens =
        parsed->max_reasoning_tokens.value_or(chat.default_max_reasoning_tokens);
  }
  return absl::OkStatus();
}

}  // namespace

bool TemplateRendersTools(const jinja::ChatTemplate& chat_template, std::string_view bos_token,
                          std::string_view eos_token) {
  ParsedRequest probe;
  probe.endpoint = Endpoint::kChatCompletions;
  probe.messages = Json::array({{{"role", "user"}, {"content", "What is the weather?"}}});
  const absl::StatusOr<std::string> without =
      chat_template.Render(ChatTemplateContext(probe, bos_token, eos_token));
  probe.tools = Json::array({{{"type", "function"},
                              {"function",
                               {{"name", "get_weather"},
                                {"description", "The weather in a city."},
                                {"parameters",
                                 {{"type", "object"},
                                  {"properties", {{"city", {{"type", "string"}}}}},
                                  {"required", {"city"}}}}}}}});
  const absl::StatusOr<std::string> with =
      chat_template.Render(ChatTemplateContext(probe, bos_token, eos_token));
  return without.ok() && with.ok() && *with != *without;
}

absl::StatusOr<std::vector<std::unique_ptr<Request>>> BuildOpenAiRequest(
    Endpoint endpoint, std::string_view body, const ParseOptions& options,
    const ChatTemplating& chat, const ServingLimits& limits, const Tokenizer& tokenizer,
    ParsedRequest* parsed) {
  ASSIGN_OR_RETURN(*parsed, ParseRequest(endpoint, body, options));
  if (endpoint != Endpoint::kCompletions) {  // Chat, and the APIs parsed as chat.
    RETURN_IF_ERROR(ApplyTools(chat, parsed));
    RETURN_IF_ERROR(RenderChat(chat, parsed));
    RETURN_IF_ERROR(ApplyReasoning(chat, parsed));
  }
  absl::StatusOr<std::vector<std::unique_ptr<Request>>> built =
      BuildChoices(parsed->generate, limits, tokenizer);
  if (!built.ok()) {
    const absl::Status renamed = RenameBuildError(built.status());
    return endpoint == Endpoint::kResponses || endpoint == Endpoint::kMessages
               ? RenameChatError(renamed, endpoint)
               : renamed;
  }
  if (parsed->echo) {
    const v1::GenerateRequest& g = parsed->generate;
    parsed->echo_text = g.has_text()
                            ? g.text()
                            : ValidUtf8(tokenizer.Decode(std::vector<int>(
                                  g.token_ids().ids().begin(), g.token_ids().ids().end())));
  }
  // The first generation ends at the budget; the HTTP server continues it (http_server.cc).
  const int max_new_tokens = built->front()->max_new_tokens;
  if (parsed->reasoning_budget_tokens > 0 && parsed->reasoning_budget_tokens < max_new_tokens) {
    parsed->total_max_tokens = max_new_tokens;
    for (std::unique_ptr<Request>& r : *built) r->max_new_tokens = parsed->reasoning_budget_tokens;
  } else {
    parsed->reasoning_budget_tokens = 0;
  }
  return built;
}

}  // namespace conveyor::scheduler::openai
