#include "scheduler/http/openai_protocol.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "scheduler/http/json_fields.h"
#include "scheduler/http/responses_api.h"
#include "scheduler/output_constraint.h"
#include "scheduler/request_builder.h"
#include "text/bounded_json.h"

namespace conveyor::scheduler::openai {
namespace {

constexpr absl::string_view kParamPayload = "type.conveyor/openai.param";
constexpr absl::string_view kCodePayload = "type.conveyor/openai.code";

absl::Status CheckModel(const Json& body, const ParseOptions& options) {
  ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(body, "model"));
  // A missing model means the one served (curl users need not know its name).
  if (!model.has_value() || ServesModel(options, *model)) return absl::OkStatus();
  return ModelNotFoundError(*model, options);
}

// One prompt: a string or a list of token ids.
absl::Status SetPrompt(const Json& prompt, v1::GenerateRequest* g) {
  if (prompt.is_string()) {
    if (prompt.get_ref<const std::string&>().empty()) return Invalid("prompt", "prompt is empty");
    g->set_text(prompt.get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt.is_array() || prompt.empty()) {
    return Invalid("prompt", "prompt must be a non-empty string or list of token ids");
  }
  for (const Json& id : prompt) {
    if (!id.is_number_integer() ||
        (id.is_number_unsigned() ? id.get<uint64_t>() > std::numeric_limits<int32_t>::max()
                                 : id.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
                                       id.get<int64_t>() > std::numeric_limits<int32_t>::max())) {
      return Invalid("prompt",
                     absl::StrCat("prompt's token ids must be integers, got ", JsonExcerpt(id)));
    }
    g->mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

absl::Status ParseCompletionPrompt(const Json& body, v1::GenerateRequest* g) {
  const Json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "prompt is required");
  // A batch (a list of prompts) of one is the same request as its only prompt.
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    if (prompt->size() > 1) {
      return Unsupported("prompt", absl::StrCat("prompt holds ", prompt->size(),
                                                " prompts; only one prompt per request is "
                                                "supported (send one request per prompt)"));
    }
    return SetPrompt((*prompt)[0], g);
  }
  return SetPrompt(*prompt, g);
}

constexpr std::string_view kRoles[] = {"system", "user", "assistant", "tool"};

// Checks one chat message and returns it with its content as one string.
absl::StatusOr<Json> ParseMessage(const Json& message, size_t index) {
  const std::string where = absl::StrCat("messages[", index, "]");
  if (!message.is_object()) return WrongType(where, "an object with a role and a content");
  ASSIGN_OR_RETURN(std::optional<std::string> role, GetString(message, "role"));
  if (!role.has_value()) return Invalid(where + ".role", where + ".role is required");
  if (std::find(std::begin(kRoles), std::end(kRoles), *role) == std::end(kRoles)) {
    return Invalid(where + ".role", absl::StrCat(where,
                                                 ".role must be system, user, assistant "
                                                 "or tool, got '",
                                                 TextExcerpt(*role), "'"));
  }
  Json out = message;
  if (const Json* calls = Field(message, "tool_calls"); calls != nullptr) {
    if (*role != "assistant" || !calls->is_array()) {
      return WrongType(where + ".tool_calls", "a list of calls, on an assistant message");
    }
    // Templates write arguments with `tojson` (transformers passes them as dicts): a
    // JSON-text argument string, as clients send it back, becomes its object.
    for (Json& call : out["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
        return WrongType(where + ".tool_calls", "calls {id, type, function: {name, arguments}}");
      }
      Json& arguments = call["function"]["arguments"];
      if (!arguments.is_string()) continue;
      absl::StatusOr<Json> parsed =
          ParseBoundedJson(arguments.get_ref<const std::string&>(), JsonLimits(), "arguments");
      if (parsed.ok() && parsed->is_object()) arguments = *std::move(parsed);
    }
  }
  const Json* content = Field(message, "content");
  if (content == nullptr) {
    // An assistant turn that only calls tools has no content.
    if (*role != "assistant") return Invalid(where + ".content", where + ".content is required");
    return out;
  }
  if (content->is_string()) return out;
  if (!content->is_array()) {
    return WrongType(where + ".content", "a string or a list of text parts");
  }
  // Parts are joined with newlines, as vLLM does for templates that expect a string.
  std::vector<std::string> texts;
  for (size_t i = 0; i < content->size(); ++i) {
    const Json& part = (*content)[i];
    const std::string part_where = absl::StrCat(where, ".content[", i, "]");
    if (!part.is_object()) return WrongType(part_where, "an object {type, text}");
    ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(part, "type"));
    if (type != "text") {
      return Unsupported(part_where + ".type",
                         absl::StrCat(part_where, ".type is '", TextExcerpt(type.value_or("")),
                                      "'; only text parts are supported"));
    }
    ASSIGN_OR_RETURN(std::optional<std::string> text, GetString(part, "text"));
    if (!text.has_value()) return Invalid(part_where + ".text", part_where + ".text is required");
    texts.push_back(*std::move(text));
  }
  out["content"] = absl::StrJoin(texts, "\n");
  return out;
}

// A tool of `tools`: {"type": "function", "function": {"name", "description"?,
// "parameters"?}}. Its parameters are compiled (and refused, naming the tool) once the
// output is constrained to calls.
absl::Status CheckTool(const Json& tool, size_t index) {
  const std::string where = absl::StrCat("tools[", index, "]");
  if (!tool.is_object()) return WrongType(where, "an object {type: \"function\", function}");
  ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(tool, "type"));
  if (type != "function") {
    return Unsupported(where + ".type", absl::StrCat(where, ".type must be \"function\""));
  }
  const Json* function = Field(tool, "function");
  if (function == nullptr || !function->is_object()) {
    return WrongType(where + ".function", "an object with a name");
  }
  ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(*function, "name"));
  if (!name.has_value() || name->empty()) {
    return Invalid(where + ".function.name", where + ".function.name is required");
  }
  if (const Json* parameters = Field(*function, "parameters");
      parameters != nullptr && !parameters->is_object()) {
    return WrongType(where + ".function.parameters", "a JSON Schema object");
  }
  return absl::OkStatus();
}

// tools, tool_choice ("none", "auto", "required" or {"type": "function", "function":
// {"name"}}) and parallel_tool_calls.
absl::Status ParseTools(const Json& body, ParsedRequest* r) {
  const Json* tools = Field(body, "tools");
  if (tools != nullptr) {
    if (!tools->is_array()) return WrongType("tools", "a list of tools");
    for (size_t i = 0; i < tools->size(); ++i) RETURN_IF_ERROR(CheckTool((*tools)[i], i));
  }
  const bool have_tools = tools != nullptr && !tools->empty();
  r->tool_choice = have_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  if (const Json* choice = Field(body, "tool_choice"); choice != nullptr) {
    if (*choice == "none") {
      r->tool_choice = ToolChoice::kNone;
    } else if (*choice == "auto") {
      // As given: auto without tools is no tools.
    } else if (*choice == "required") {
      r->tool_choice = ToolChoice::kRequired;
    } else if (choice->is_object() && choice->value("type", Json()) == "function" &&
               choice->contains("function") && (*choice)["function"].is_object() &&
               (*choice)["function"].value("name", Json()).is_string()) {
      r->tool_choice = ToolChoice::kFunction;
      r->tool_function = (*choice)["function"]["name"].get<std::string>();
      const bool known =
          have_tools && std::any_of(tools->begin(), tools->end(), [&](const Json& t) {
            return t["function"]["name"] == r->tool_function;
          });
      if (!known) {
        return Invalid("tool_choice", absl::StrCat("tool_choice names the function '",
                                                   TextExcerpt(r->tool_function),
                                                   "', which is not among the request's tools"));
      }
    } else {
      return Invalid("tool_choice",
                     "tool_choice must be \"none\", \"auto\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (r->tool_choice == ToolChoice::kRequired && !have_tools) {
      return Invalid("tool_choice", "tool_choice is \"required\" but the request has no tools");
    }
  }
  ASSIGN_OR_RETURN(std::optional<bool> parallel, GetBool(body, "parallel_tool_calls"));
  r->parallel_tool_calls = parallel.value_or(true);
  if (r->tool_choice != ToolChoice::kNone) r->tools = *tools;
  return absl::OkStatus();
}

absl::Status ParseChat(const Json& body, const ParseOptions& options, ParsedRequest* r) {
  const Json* messages = Field(body, "messages");
  if (messages == nullptr) return Invalid("messages", "messages is required");
  if (!messages->is_array() || messages->empty()) {
    return WrongType("messages", "a non-empty list of messages");
  }
  r->messages = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    ASSIGN_OR_RETURN(Json message, ParseMessage((*messages)[i], i));
    r->messages.push_back(std::move(message));
  }

  RETURN_IF_ERROR(ParseTools(body, r));

  ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(body, "logprobs"));
  r->logprobs = logprobs.value_or(false);
  ASSIGN_OR_RETURN(std::optional<int64_t> top,
                   GetInteger(body, "top_logprobs", 0, options.max_logprobs));
  if (top.has_value() && !r->logprobs) {
    return Invalid("top_logprobs", "top_logprobs needs logprobs set to true");
  }
  r->top_logprobs = static_cast<int>(top.value_or(0));

  // max_completion_tokens replaced max_tokens in OpenAI's chat API; either works.
  ASSIGN_OR_RETURN(
      std::optional<int64_t> max_completion,
      GetInteger(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max()));
  ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens,
                   GetInteger(body, "max_tokens", 1, std::numeric_limits<int32_t>::max()));
  if (max_completion.has_value()) max_tokens = max_completion;
  if (max_tokens.has_value()) r->generate.set_max_new_tokens(static_cast<int32_t>(*max_tokens));

  // vLLM's extensions for reasoning models (docs/reasoning.md).
  if (const Json* kwargs = Field(body, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) {
      return WrongType("chat_template_kwargs",
                       "an object of extra chat template variables, e.g. "
                       "{\"enable_thinking\": false}");
    }
    r->chat_template_kwargs = *kwargs;
  }
  ASSIGN_OR_RETURN(
      std::optional<int64_t> reasoning_budget,
      GetInteger(body, "max_reasoning_tokens", 1, std::numeric_limits<int32_t>::max()));
  if (reasoning_budget.has_value()) r->max_reasoning_tokens = static_cast<int>(*reasoning_budget);
  return absl::OkStatus();
}

absl::Status ParseCompletions(const Json& body, const ParseOptions& options, ParsedRequest* r) {
  RETURN_IF_ERROR(ParseCompletionPrompt(body, &r->generate));
  ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(body, "echo"));
  r->echo = echo.value_or(false);
  ASSIGN_OR_RETURN(std::optional<int64_t> best_of,
                   GetInteger(body, "best_of", 0, std::numeric_limits<int32_t>::max()));
  const int n = r->generate.has_n() ? r->generate.n() : 1;
  if (best_of.value_or(n) != n) {
    return Unsupported("best_of", absl::StrCat("best_of must equal n (", n,
                                               "): every choice generated is returned"));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> suffix, GetString(body, "suffix"));
  if (!suffix.value_or("").empty()) return Unsupported("suffix", "suffix is not supported");

  // Completions' logprobs is the number of alternatives; 0 still returns the chosen
  // token's log-probability.
  ASSIGN_OR_RETURN(std::optional<int64_t> logprobs,
                   GetInteger(body, "logprobs", 0, options.max_logprobs));
  r->logprobs = logprobs.has_value();
  r->top_logprobs = static_cast<int>(logprobs.value_or(0));
  // Echo with logprobs scores the prompt too (what evaluation harnesses ask for).
  if (r->echo && r->logprobs) r->generate.set_prompt_logprobs(r->top_logprobs);

  ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens,
                   GetInteger(body, "max_tokens", 1, std::numeric_limits<int32_t>::max()));
  r->generate.set_max_new_tokens(
      static_cast<int32_t>(max_tokens.value_or(kCompletionsDefaultMaxTokens)));
  // Extension (vLLM's name): false sends a text prompt without the special tokens the
  // model's tokenizer frames it with (its BOS), e.g. text a chat template rendered. True
  // is the usual framing, which the engine's request leaves unset.
  ASSIGN_OR_RETURN(std::optional<bool> add_special_tokens, GetBool(body, "add_special_tokens"));
  if (add_special_tokens.has_value() && !*add_special_tokens) r->generate.set_add_bos(false);
  return absl::OkStatus();
}

// Structured output: OpenAI's response_format (text, json_object, json_schema) and, as
// SGLang and vLLM take it, a top-level `regex`. Compiled here, so a schema the compiler
// refuses is a 400 naming response_format (the engine then finds it in the cache).
absl::Status ParseResponseFormat(const Json& body, v1::GenerateRequest* g) {
  const Json* format = Field(body, "response_format");
  const Json* regex = Field(body, "regex");
  if (regex != nullptr) {
    if (!regex->is_string()) return WrongType("regex", "a string");
    g->mutable_constraint()->set_regex(regex->get<std::string>());
  }
  if (format != nullptr) {
    if (!format->is_object()) return WrongType("response_format", "an object");
    ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(*format, "type"));
    if (type == "json_object") {
      g->mutable_constraint()->set_json_object(true);
    } else if (type == "json_schema") {
      const Json* spec = Field(*format, "json_schema");
      if (spec == nullptr || !spec->is_object()) {
        return WrongType("response_format.json_schema",
                         "an object with the schema in `schema` (and a `name`)");
      }
      const Json* schema = Field(*spec, "schema");
      if (schema == nullptr) {
        return Invalid("response_format.json_schema.schema",
                       "response_format.json_schema.schema is missing: give the JSON Schema "
                       "the output must follow");
      }
      if (!schema->is_object() && !schema->is_boolean()) {
        return WrongType("response_format.json_schema.schema", "a JSON Schema object");
      }
      g->mutable_constraint()->set_json_schema(Dump(*schema));
    } else if (type != "text") {
      return Invalid("response_format.type",
                     absl::StrCat("response_format.type must be \"text\", \"json_object\" or "
                                  "\"json_schema\", got ",
                                  JsonExcerpt(format->value("type", Json()))));
    }
    if (type != "text" && regex != nullptr) {
      return Invalid("regex", "give either regex or a response_format other than text, not both");
    }
  }
  if (!g->has_constraint()) return absl::OkStatus();
  if (absl::StatusOr<std::shared_ptr<const std::string>> grammar =
          scheduler::CompileConstraint(g->constraint());
      !grammar.ok()) {
    const absl::string_view param = regex != nullptr ? "regex" : "response_format";
    return Invalid(param, absl::StrCat(param, ": ", grammar.status().message()));
  }
  return absl::OkStatus();
}

// What both endpoints share: streaming, sampling, stopping, n.
absl::Status ParseCommon(const Json& body, ParsedRequest* r) {
  v1::GenerateRequest& g = r->generate;
  RETURN_IF_ERROR(ParseResponseFormat(body, &g));
  ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(body, "stream"));
  r->stream = stream.value_or(false);
  if (const Json* options = Field(body, "stream_options"); options != nullptr) {
    if (!options->is_object()) return WrongType("stream_options", "an object");
    ASSIGN_OR_RETURN(std::optional<bool> usage, GetBool(*options, "include_usage"));
    r->include_usage = usage.value_or(false);
  }

  ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInteger(body, "n", 1, kMaxChoices));
  if (n.has_value()) r->generate.set_n(static_cast<int32_t>(*n));
  if (const Json* bias = Field(body, "logit_bias"); bias != nullptr && !bias->is_null()) {
    // {"token id": bias}: OpenAI's keys are token ids written as strings.
    if (!bias->is_object()) return WrongType("logit_bias", "an object");
    for (const auto& [key, value] : bias->items()) {
      int32_t token = 0;
      if (!absl::SimpleAtoi(key, &token)) {
        return WrongType("logit_bias", "an object whose keys are token ids");
      }
      if (!value.is_number()) return WrongType("logit_bias", "an object of numbers");
      (*g.mutable_logit_bias())[token] = value.get<float>();
    }
  }

  // Floats: ranges are BuildRequest's, the same as for gRPC.
  struct FloatField {
    const char* name;
    void (v1::GenerateRequest::*set)(float);
  };
  static constexpr FloatField kFloats[] = {
      {"temperature", &v1::GenerateRequest::set_temperature},
      {"top_p", &v1::GenerateRequest::set_top_p},
      {"presence_penalty", &v1::GenerateRequest::set_presence_penalty},
      {"frequency_penalty", &v1::GenerateRequest::set_frequency_penalty},
      // Extensions (vLLM's names), sent by OpenAI clients through extra_body.
      {"min_p", &v1::GenerateRequest::set_min_p},
      {"repetition_penalty", &v1::GenerateRequest::set_repetition_penalty},
  };
  for (const FloatField& f : kFloats) {
    ASSIGN_OR_RETURN(std::optional<double> value, GetNumber(body, f.name));
    if (value.has_value()) (g.*f.set)(static_cast<float>(*value));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> top_k,
                   GetInteger(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (top_k.has_value()) g.set_top_k(static_cast<int32_t>(std::max<int64_t>(*top_k, 0)));
  ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, GetBool(body, "ignore_eos"));
  g.set_ignore_eos(ignore_eos.value_or(false));

  // OpenAI's seed is a signed 64-bit integer; the engine's is unsigned: same bits.
  if (const Json* seed = Field(body, "seed"); seed != nullptr) {
    if (!seed->is_number_integer()) return WrongType("seed", "an integer");
    g.set_seed(seed->is_number_unsigned() ? seed->get<uint64_t>()
                                          : static_cast<uint64_t>(seed->get<int64_t>()));
  }

  if (const Json* stop = Field(body, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      g.add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const Json& s : *stop) {
        if (!s.is_string()) return WrongType("stop", "a string or a list of strings");
        g.add_stop(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or a list of strings");
    }
  }
  return absl::OkStatus();
}

std::string_view FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP:
      return "stop";
    default:
      return "";
  }
}

Json FinishReasonJson(v1::FinishReason reason) {
  const std::string_view name = FinishReasonName(reason);
  return name.empty() ? Json() : Json(name);
}

// vLLM's stop_reason: the stop string that ended the answer, or the stop token id, or null.
Json StopReasonJson(const v1::GenerateResponse& last) {
  switch (last.stop_reason_case()) {
    case v1::GenerateResponse::kStopString:
      return last.stop_string();
    case v1::GenerateResponse::kStopTokenId:
      return last.stop_token_id();
    default:
      return nullptr;
  }
}

// A chat answer that called tools ends with "tool_calls" where the model ended it.
Json ChatFinishReasonJson(v1::FinishReason reason, bool called_tools) {
  if (called_tools && (reason == v1::FINISH_REASON_EOS || reason == v1::FINISH_REASON_STOP)) {
    return "tool_calls";
  }
  return FinishReasonJson(reason);
}

Json UsageJson(const v1::Usage& usage) {
  Json u = Json::object();
  u["prompt_tokens"] = usage.prompt_tokens();
  u["completion_tokens"] = usage.generated_tokens();
  u["total_tokens"] = usage.prompt_tokens() + usage.generated_tokens();
  u["prompt_tokens_details"] = {{"cached_tokens", usage.cached_prompt_tokens()}};
  return u;
}

Json Bytes(std::string_view text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

std::string_view ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
    case 405:
    case 408:
    case 413:
    case 431:
      return "invalid_request_error";
    case 401:
    case 403:
      return "authentication_error";
    case 429:
      return "rate_limit_error";
    default:
      return "server_error";
  }
}

Json ErrorJson(const absl::Status& status) {
  const std::optional<std::string> param = ParamPayload(status);
  const absl::optional<absl::Cord> code = status.GetPayload(kCodePayload);
  Json error = Json::object();
  error["message"] = std::string{status.message()};
  error["type"] = ErrorType(HttpStatusFor(status));
  error["param"] = param.has_value() ? Json(*param) : Json();
  error["code"] = code.has_value() ? Json(std::string{*code}) : Json();
  return Json{{"error", std::move(error)}};
}

Json ModelJson(std::string_view model_name, int64_t created_unix_s) {
  Json model = Json::object();
  model["id"] = model_name;
  model["object"] = "model";
  model["created"] = created_unix_s;
  model["owned_by"] = "conveyor";
  return model;
}

absl::StatusOr<ParsedRequest> ParseJson(Endpoint endpoint, const Json& json,
                                        const ParseOptions& options) {
  ParsedRequest r;
  r.endpoint = endpoint;
  RETURN_IF_ERROR(ParseCommon(json, &r));
  RETURN_IF_ERROR(endpoint == Endpoint::kChatCompletions ? ParseChat(json, options, &r)
                                                         : ParseCompletions(json, options, &r));
  if (r.logprobs) r.generate.set_logprobs(std::max(1, r.top_logprobs));
  return r;
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           const ParseOptions& options) {
  // Bounded before anything walks it: nothing below (nor the chat template) recurses
  // deeper than options.json_limits.max_depth.
  ASSIGN_OR_RETURN(const Json json,
                   ParseBoundedJson(body, options.json_limits, "the request body"));
  if (!json.is_object()) return absl::InvalidArgumentError("the request body must be an object");
  RETURN_IF_ERROR(CheckModel(json, options));
  if (endpoint == Endpoint::kResponses || endpoint == Endpoint::kMessages) {
    // The chat request it means (responses_api.h), parsed as one.
    ASSIGN_OR_RETURN(const Json chat, endpoint == Endpoint::kResponses ? ResponsesToChat(json)
                                                                       : MessagesToChat(json));
    absl::StatusOr<ParsedRequest> r = ParseJson(Endpoint::kChatCompletions, chat, options);
    if (!r.ok()) return RenameChatError(r.status(), endpoint);
    r->endpoint = endpoint;
    if (endpoint == Endpoint::kResponses) r->api_fields = ResponsesEchoFields(json);
    return r;
  }
  return ParseJson(endpoint, json, options);
}

bool ServesModel(const ParseOptions& options, std::string_view model) {
  return model == options.model_name ||
         std::find(options.model_aliases.begin(), options.model_aliases.end(), model) !=
             options.model_aliases.end();
}

absl::Status ModelNotFoundError(std::string_view model, const ParseOptions& options) {
  const absl::Status status = absl::NotFoundError(
      absl::StrCat("The model '", TextExcerpt(model), "' does not exist; this server serves '",
                   options.model_name, "'"));
  return WithCode(WithParam(status, "model"), "model_not_found");
}

Json ChatTemplateContext(const ParsedRequest& request, std::string_view bos_token,
                         std::string_view eos_token) {
  Json context = Json::object();
  context["messages"] = request.messages;
  if (!request.tools.is_null()) context["tools"] = request.tools;
  context["add_generation_prompt"] = true;
  context["bos_token"] = bos_token;
  context["eos_token"] = eos_token;
  if (request.chat_template_kwargs.is_object()) {
    for (const auto& [key, value] : request.chat_template_kwargs.items()) {
      if (key != "messages") context[key] = value;
    }
  }
  return context;
}

void SetChatPrompt(std::string rendered, v1::GenerateRequest* generate) {
  generate->set_add_bos(false);
  generate->set_text(std::move(rendered));
}

absl::Status RenameBuildError(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) return status;
  // At one position the longer match wins, so whole sentences come before "text is ".
  std::string message = absl::StrReplaceAll(
      status.message(), {{"text is empty; give a prompt", "the prompt is empty"},
                         {"the prompt is empty; set text or token_ids", "the prompt is empty"},
                         {"text is ", "the prompt is "},
                         {"max_new_tokens", "max_tokens"},
                         {"token_ids", "prompt"}});
  absl::Status renamed(status.code(), message);
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { renamed.SetPayload(url, payload); });
  return renamed;
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::optional<std::string> ParamPayload(const absl::Status& status) {
  const absl::optional<absl::Cord> param = status.GetPayload(kParamPayload);
  if (!param.has_value()) return std::nullopt;
  return std::string(*param);
}

absl::Status WithCode(absl::Status status, absl::string_view code) {
  status.SetPayload(kCodePayload, absl::Cord(code));
  return status;
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

std::string ErrorBody(const absl::Status& status) { return Dump(ErrorJson(status)); }

std::string HttpErrorBody(int http_status, std::string_view message) {
  std::string_view code;
  switch (http_status) {
    case 400:
      code = "malformed_request";
      break;
    case 405:
      code = "method_not_allowed";
      break;
    case 408:
      code = "request_timeout";
      break;
    case 413:
      code = "request_too_large";
      break;
    case 431:
      code = "headers_too_large";
      break;
    case 503:
      code = "server_busy";
      break;
    default:
      break;
  }
  Json error = Json::object();
  error["message"] = message;
  error["type"] = ErrorType(http_status);
  error["param"] = Json();
  error["code"] = code.empty() ? Json() : Json(code);
  return Dump(Json{{"error", std::move(error)}});
}

std::string ErrorEvent(const absl::Status& status) {
  return absl::StrCat("data: ", ErrorBody(status), "\n\n");
}

std::string ModelObject(std::string_view model_name, int64_t created_unix_s) {
  return Dump(ModelJson(model_name, created_unix_s));
}

std::string ModelList(std::string_view model_name, int64_t created_unix_s) {
  Json list = Json::object();
  list["object"] = "list";
  list["data"] = Json::array({ModelJson(model_name, created_unix_s)});
  return Dump(list);
}

ResponseFormatter::ResponseFormatter(const ParsedRequest& request, std::string_view id,
                                     int64_t created_unix_s, std::string_view model, int index)
    : endpoint_(request.endpoint),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      top_logprobs_(request.top_logprobs),
      index_(index),
      index_field_(absl::StrCat("{\"index\":", index)),
      echo_text_(request.echo ? request.echo_text : ""),
      head_{{"id", id},
            {"object", request.endpoint == Endpoint::kChatCompletions ? "chat.completion"
                                                                      : "text_completion"},
            {"created", created_unix_s},
            {"model", model}} {
  Json chunk_head = head_;
  if (endpoint_ == Endpoint::kChatCompletions) chunk_head["object"] = "chat.completion.chunk";
  // The constant part of every chunk, serialised once: a chunk then costs one escaped
  // string, not a JSON tree (CPU per streamed token is what the front end spends).
  chunk_head_ = Dump(chunk_head);
  chunk_head_.pop_back();  // The closing brace.
  chunk_head_ += ",\"choices\":[";
  logprobs_json_ = EmptyLogprobs();
  if (request.tool_call_format.has_value()) {
    tool_parser_ = MakeToolCallParser(*request.tool_call_format, RandomToolCallIdSource());
  }
  if (request.reasoning_format != ReasoningFormat::kNone) {
    reasoning_parser_ =
        std::make_unique<ReasoningParser>(request.reasoning_format, request.prompt_thinking);
  }
}

ReasoningDelta ResponseFormatter::SplitReasoning(const std::string& text, bool final) {
  if (reasoning_parser_ == nullptr) return {.reasoning = "", .content = text};
  ReasoningDelta delta = reasoning_parser_->Feed(text);
  if (final) {
    ReasoningDelta rest = reasoning_parser_->Finish();
    delta.reasoning += rest.reasoning;
    delta.content += rest.content;
  }
  return delta;
}

Json ResponseFormatter::ToolCallDeltas(const std::vector<ToolCallDelta>& calls) {
  Json out = Json::array();
  for (const ToolCallDelta& call : calls) {
    Json delta = {{"index", call.index}};
    Json function = Json::object();
    if (!call.id.empty()) {
      delta["id"] = call.id;
      delta["type"] = "function";
      function["name"] = call.name;
    }
    function["arguments"] = call.arguments;
    delta["function"] = std::move(function);
    out.push_back(std::move(delta));
  }
  return out;
}

void ResponseFormatter::FinishToolCalls() {
  parsed_calls_ = ParseToolCalls(*tool_parser_, text_);
  tool_calls_made_ = static_cast<int>(parsed_calls_.tool_calls.size());
}

Json ResponseFormatter::EmptyLogprobs() const {
  if (endpoint_ == Endpoint::kChatCompletions) return Json{{"content", Json::array()}};
  return Json{{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
}

void ResponseFormatter::AppendLogprobs(const v1::GenerateResponse& message, Json* out) {
  if (endpoint_ == Endpoint::kCompletions) {  // Echo: the prompt's first.
    for (int i = 0; i < message.prompt_logprobs_size(); ++i) {
      AppendCompletionLogprob(message.prompt_logprobs(i), i > 0, out);
    }
  }
  for (const v1::TokenLogprobs& lp : message.logprobs()) {
    const int top = std::min(top_logprobs_, lp.top_size());
    if (endpoint_ == Endpoint::kChatCompletions) {
      Json entry = Json::object();
      entry["token"] = lp.token().text();
      entry["logprob"] = lp.token().logprob();
      entry["bytes"] = Bytes(lp.token().text());
      Json alternatives = Json::array();
      for (int i = 0; i < top; ++i) {
        alternatives.push_back({{"token", lp.top(i).text()},
                                {"logprob", lp.top(i).logprob()},
                                {"bytes", Bytes(lp.top(i).text())}});
      }
      entry["top_logprobs"] = std::move(alternatives);
      (*out)["content"].push_back(std::move(entry));
      continue;
    }
    AppendCompletionLogprob(lp, true, out);
  }
}

void ResponseFormatter::AppendCompletionLogprob(const v1::TokenLogprobs& lp, bool scored,
                                                Json* out) {
  const int top = std::min(top_logprobs_, lp.top_size());
  (*out)["tokens"].push_back(lp.token().text());
  (*out)["token_logprobs"].push_back(scored ? Json(lp.token().logprob()) : Json());
  // A dict keyed by token text, as OpenAI's: alternatives with the same text keep the
  // most likely one's value.
  Json alternatives = Json::object();
  for (int i = 0; i < top; ++i) {
    if (!alternatives.contains(lp.top(i).text())) {
      alternatives[lp.top(i).text()] = lp.top(i).logprob();
    }
  }
  (*out)["top_logprobs"].push_back(top_logprobs_ > 0 && scored ? std::move(alternatives) : Json());
  // Offsets count the bytes of the tokens before this one; held-back stop-string text
  // is not subtracted.
  (*out)["text_offset"].push_back(text_offset_);
  text_offset_ += static_cast<int>(lp.token().text().size());
}

std::string ResponseFormatter::Chunk(absl::string_view choice) const {
  return absl::StrCat("data: ", chunk_head_, choice, include_usage_ ? "],\"usage\":null}" : "]}",
                      "\n\n");
}

void ResponseFormatter::AppendStart(std::string* sse) {
  if (endpoint_ != Endpoint::kChatCompletions) return;
  sse->append(Chunk(absl::StrCat(
      index_field_,
      R"(,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null})")));
}

ResponseFormatter::ChatDelta ResponseFormatter::NextChatDelta(const v1::GenerateResponse& message) {
  // With a reasoning parser, the text is split into reasoning and answer first; with
  // tools on, the answer goes through the call parser: content and calls come out as
  // they are decided.
  const bool final = message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  ReasoningDelta split = SplitReasoning(message.text(), final);
  ChatDelta delta{.reasoning = std::move(split.reasoning), .content = std::move(split.content)};
  if (tool_parser_ != nullptr) {
    ToolCallStreamDelta calls = tool_parser_->Feed(delta.content);
    if (final) {
      ToolCallStreamDelta rest = tool_parser_->Finish();
      calls.content += rest.content;
      for (ToolCallDelta& call : rest.tool_calls) calls.tool_calls.push_back(std::move(call));
    }
    delta.content = std::move(calls.content);
    delta.tool_calls = std::move(calls.tool_calls);
    tool_calls_made_ = tool_parser_->num_calls();
  }
  return delta;
}

void ResponseFormatter::AppendEvents(const v1::GenerateResponse& message, std::string* sse) {
  const bool final = message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  const bool has_logprobs = logprobs_ && message.logprobs_size() > 0;
  std::string logprobs = "null";
  if (has_logprobs) {
    Json lp = EmptyLogprobs();
    AppendLogprobs(message, &lp);
    logprobs = Dump(lp);
  }
  const std::string finish = Dump(FinishReasonJson(message.finish_reason()));
  if (endpoint_ == Endpoint::kCompletions) {
    std::string scratch;
    const std::string& text = TextWithEcho(message, &scratch);
    if (!text.empty() || has_logprobs || final) {
      sse->append(Chunk(absl::StrCat(
          index_field_, R"(,"text":)", Dump(Json(text)), R"(,"logprobs":)", logprobs,
          R"(,"finish_reason":)", finish,
          final ? absl::StrCat(R"(,"stop_reason":)", Dump(StopReasonJson(message))) : "", "}")));
    }
  } else {
    ChatDelta split = NextChatDelta(message);
    const std::string& content = split.content;
    Json calls;
    if (!split.tool_calls.empty()) calls = ToolCallDeltas(split.tool_calls);
    const bool reasoning = !split.reasoning.empty();
    if (reasoning || !content.empty() || has_logprobs || !calls.is_null()) {
      // A delta of reasoning alone has no content (vLLM's shape); both reasoning names
      // carry the same text.
      std::string fields;
      if (reasoning) {
        const std::string text = Dump(Json(split.reasoning));
        absl::StrAppend(&fields, R"("reasoning_content":)", text, R"(,"reasoning":)", text);
      }
      if (!content.empty() || !reasoning) {
        absl::StrAppend(&fields, reasoning ? "," : "", R"("content":)", Dump(Json(content)));
      }
      if (!calls.is_null()) absl::StrAppend(&fields, R"(,"tool_calls":)", Dump(calls));
      sse->append(Chunk(absl::StrCat(index_field_, R"(,"delta":{)", fields, R"(},"logprobs":)",
                                     logprobs, R"(,"finish_reason":null})")));
    }
    // OpenAI ends a chat stream's choice with an empty delta carrying the reason.
    if (final) {
      sse->append(Chunk(
          absl::StrCat(index_field_, R"(,"delta":{},"logprobs":null,"finish_reason":)",
                       Dump(ChatFinishReasonJson(message.finish_reason(), tool_calls_made_ > 0)),
                       R"(,"stop_reason":)", Dump(StopReasonJson(message)), "}")));
    }
  }
  if (final) usage_ = message.usage();
}

void ResponseFormatter::AppendEnd(const v1::Usage& usage, std::string* sse) {
  if (include_usage_) {
    absl::StrAppend(sse, "data: ", chunk_head_, "],\"usage\":", Dump(UsageJson(usage)), "}\n\n");
  }
  sse->append("data: [DONE]\n\n");
}

v1::Usage ResponseFormatter::SumUsage(const std::vector<v1::Usage>& choices) {
  v1::Usage sum = choices.front();
  for (size_t i = 1; i < choices.size(); ++i) {
    sum.set_generated_tokens(sum.generated_tokens() + choices[i].generated_tokens());
  }
  return sum;
}

const std::string& ResponseFormatter::TextWithEcho(const v1::GenerateResponse& message,
                                                   std::string* scratch) {
  if (echo_text_.empty()) return message.text();
  *scratch = std::exchange(echo_text_, "") + message.text();
  return *scratch;
}

void ResponseFormatter::Add(const v1::GenerateResponse& message) {
  const bool final = message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
  std::string scratch;
  ReasoningDelta split = SplitReasoning(TextWithEcho(message, &scratch), final);
  reasoning_ += split.reasoning;
  text_ += split.content;
  if (logprobs_) AppendLogprobs(message, &logprobs_json_);
  if (final) {
    finish_reason_ = message.finish_reason();
    stop_reason_ = StopReasonJson(message);
    usage_ = message.usage();
    if (tool_parser_ != nullptr) FinishToolCalls();
  }
}

Json ResponseFormatter::ChoiceJson() const {
  Json choice = Json::object();
  choice["index"] = index_;
  if (endpoint_ == Endpoint::kChatCompletions && tool_parser_ != nullptr) {
    const std::vector<ParsedToolCall>& calls = parsed_calls_.tool_calls;
    Json message = {{"role", "assistant"}};
    // OpenAI's shape: no text beside the calls is a null content.
    message["content"] =
        calls.empty() || !parsed_calls_.content.empty() ? Json(parsed_calls_.content) : Json();
    if (!calls.empty()) {
      Json out = Json::array();
      for (const ParsedToolCall& call : calls) {
        out.push_back({{"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      message["tool_calls"] = std::move(out);
    }
    choice["message"] = std::move(message);
  } else if (endpoint_ == Endpoint::kChatCompletions) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  if (reasoning_parser_ != nullptr) {
    // Both names, as vLLM's releases have used them; null when the model did not reason.
    Json& message = choice["message"];
    message["reasoning_content"] = reasoning_.empty() ? Json() : Json(reasoning_);
    message["reasoning"] = message["reasoning_content"];
  }
  choice["logprobs"] = logprobs_ ? logprobs_json_ : Json();
  choice["finish_reason"] = endpoint_ == Endpoint::kChatCompletions
                                ? ChatFinishReasonJson(finish_reason_, tool_calls_made_ > 0)
                                : FinishReasonJson(finish_reason_);
  choice["stop_reason"] = stop_reason_;
  return choice;
}

std::string ResponseFormatter::WholeBody(const std::vector<const AnswerFormatter*>& choices) const {
  std::vector<const ResponseFormatter*> mine;
  mine.reserve(choices.size());
  for (const AnswerFormatter* choice : choices) {
    mine.push_back(static_cast<const ResponseFormatter*>(choice));
  }
  return Body(mine);
}

std::string ResponseFormatter::Body(const std::vector<const ResponseFormatter*>& choices) {
  Json body = choices.front()->head_;
  body["choices"] = Json::array();
  std::vector<v1::Usage> usage;
  for (const ResponseFormatter* choice : choices) {
    body["choices"].push_back(choice->ChoiceJson());
    usage.push_back(choice->usage_);
  }
  body["usage"] = UsageJson(SumUsage(usage));
  return Dump(body);
}

}  // namespace conveyor::scheduler::openai
