#include "scheduler/http/responses_api.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "scheduler/http/json_fields.h"
#include "text/bounded_json.h"

namespace conveyor::scheduler::openai {
namespace {

// Sampling and serving fields both APIs pass through under the chat names they share.
constexpr const char* kPassThrough[] = {"stream",
                                        "temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "seed",
                                        "stop",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "repetition_penalty",
                                        "logit_bias",
                                        "ignore_eos",
                                        "user",
                                        "chat_template_kwargs",
                                        "max_reasoning_tokens",
                                        "regex",
                                        "parallel_tool_calls"};

void PassThrough(const Json& body, Json* chat) {
  for (const char* key : kPassThrough) {
    if (const Json* value = Field(body, key); value != nullptr) (*chat)[key] = *value;
  }
}

// A refusal of a field that needs what this server does not keep.
absl::Status Stateless(absl::string_view param, absl::string_view what) {
  return Unsupported(param, absl::StrCat(param, " is not supported: ", what));
}

// The text of a Responses content value: a string, or parts whose text is read
// (input_text, output_text, text, refusal); other parts (images, files) are refused.
absl::StatusOr<Json> ResponsesContent(const Json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) return WrongType(where, "a string or a list of content parts");
  Json parts = Json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string part_where = absl::StrCat(where, "[", i, "]");
    if (!part.is_object()) return WrongType(part_where, "an object {type, text}");
    ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(part, "type"));
    const std::string text_key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal") {
      return Unsupported(part_where + ".type",
                         absl::StrCat(part_where, ".type is '", TextExcerpt(type.value_or("")),
                                      "'; only text parts are supported (the model reads text)"));
    }
    ASSIGN_OR_RETURN(std::optional<std::string> text, GetString(part, text_key));
    if (!text.has_value()) {
      const std::string field = absl::StrCat(part_where, ".", text_key);
      return Invalid(field, absl::StrCat(field, " is required"));
    }
    parts.push_back({{"type", "text"}, {"text", *std::move(text)}});
  }
  return parts;
}

// Appends a call to the assistant message that ends `messages`, or to a new one.
void AddToolCall(Json call, Json* messages) {
  if (messages->empty() || messages->back()["role"] != "assistant" ||
      !messages->back().contains("tool_calls")) {
    messages->push_back(
        {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array()}});
  }
  messages->back()["tool_calls"].push_back(std::move(call));
}

Json ToolCall(std::string id, std::string name, Json arguments) {
  return {{"id", std::move(id)},
          {"type", "function"},
          {"function", {{"name", std::move(name)}, {"arguments", std::move(arguments)}}}};
}

absl::Status ResponsesInput(const Json& input, Json* messages) {
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input}});
    return absl::OkStatus();
  }
  if (!input.is_array()) return WrongType("input", "a string or a list of input items");
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    const std::string where = absl::StrCat("input[", i, "]");
    if (!item.is_object()) return WrongType(where, "an object (a message or a function call item)");
    ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(item, "type"));
    if (!type.has_value() || *type == "message") {
      ASSIGN_OR_RETURN(std::optional<std::string> role, GetString(item, "role"));
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        return Invalid(
            where + ".role",
            absl::StrCat(where, ".role must be user, assistant, system or developer, got '",
                         TextExcerpt(role.value_or("")), "'"));
      }
      const Json* content = Field(item, "content");
      if (content == nullptr) return Invalid(where + ".content", where + ".content is required");
      ASSIGN_OR_RETURN(Json text, ResponsesContent(*content, where + ".content"));
      // The developer role is the system prompt of the chat templates.
      messages->push_back({{"role", *role == "developer" ? "system" : *role}, {"content", text}});
    } else if (*type == "function_call") {
      ASSIGN_OR_RETURN(std::optional<std::string> call_id, GetString(item, "call_id"));
      ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(item, "name"));
      ASSIGN_OR_RETURN(std::optional<std::string> arguments, GetString(item, "arguments"));
      if (!call_id.has_value() || !name.has_value()) {
        return Invalid(where, where + " (a function_call) needs call_id and name");
      }
      AddToolCall(ToolCall(*call_id, *name, arguments.value_or("{}")), messages);
    } else if (*type == "function_call_output") {
      ASSIGN_OR_RETURN(std::optional<std::string> call_id, GetString(item, "call_id"));
      const Json* output = Field(item, "output");
      if (!call_id.has_value() || output == nullptr) {
        return Invalid(where, where + " (a function_call_output) needs call_id and output");
      }
      ASSIGN_OR_RETURN(Json text, ResponsesContent(*output, where + ".output"));
      messages->push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", text}});
    } else if (*type == "reasoning") {
      continue;  // Earlier reasoning: templates drop it from the history.
    } else {
      return Unsupported(where + ".type",
                         absl::StrCat(where, ".type '", TextExcerpt(*type),
                                      "' is not supported; send message, function_call and "
                                      "function_call_output items"));
    }
  }
  return absl::OkStatus();
}

absl::Status ResponsesTools(const Json& body, Json* chat) {
  if (const Json* tools = Field(body, "tools"); tools != nullptr) {
    if (!tools->is_array()) return WrongType("tools", "a list of function tools");
    Json out = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& tool = (*tools)[i];
      const std::string where = absl::StrCat("tools[", i, "]");
      if (!tool.is_object()) return WrongType(where, "a function tool {type, name, parameters}");
      ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(tool, "type"));
      if (type != "function") {
        return Unsupported(where + ".type",
                           absl::StrCat(where, ".type is '", TextExcerpt(type.value_or("")),
                                        "'; only function tools are served (hosted tools run "
                                        "at OpenAI)"));
      }
      Json function = Json::object();
      for (const char* key : {"name", "description", "parameters", "strict"}) {
        if (const Json* value = Field(tool, key); value != nullptr) function[key] = *value;
      }
      out.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    (*chat)["tools"] = std::move(out);
  }
  if (const Json* choice = Field(body, "tool_choice"); choice != nullptr) {
    if (choice->is_string()) {
      (*chat)["tool_choice"] = *choice;
    } else if (choice->is_object() && choice->value("type", "") == "function" &&
               choice->contains("name")) {
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      return Unsupported("tool_choice",
                         "tool_choice must be \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"name\": ...}");
    }
  }
  return absl::OkStatus();
}

absl::Status ResponsesTextFormat(const Json& body, Json* chat) {
  const Json* text = Field(body, "text");
  if (text == nullptr) return absl::OkStatus();
  if (!text->is_object()) return WrongType("text", "an object {format}");
  const Json* format = Field(*text, "format");
  if (format == nullptr) return absl::OkStatus();
  if (!format->is_object()) return WrongType("text.format", "an object {type, ...}");
  const std::string type = format->value("type", "");
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    (*chat)["response_format"] = {{"type", "json_object"}};
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Unsupported("text.format.type",
                       "text.format.type must be text, json_object or json_schema");
  }
  Json schema = Json::object();
  for (const char* key : {"name", "schema", "strict", "description"}) {
    if (const Json* value = Field(*format, key); value != nullptr) schema[key] = *value;
  }
  (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return absl::OkStatus();
}

Json UsageJson(const v1::Usage& usage, bool anthropic) {
  if (anthropic) {
    return {{"input_tokens", usage.prompt_tokens()},
            {"output_tokens", usage.generated_tokens()},
            {"cache_read_input_tokens", usage.cached_prompt_tokens()}};
  }
  return {{"input_tokens", usage.prompt_tokens()},
          {"input_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens()}}},
          {"output_tokens", usage.generated_tokens()},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", usage.prompt_tokens() + usage.generated_tokens()}};
}

// A tool call's arguments as an object (Anthropic's input); {} when they are not one.
Json ArgumentsObject(const std::string& arguments) {
  absl::StatusOr<Json> parsed = ParseBoundedJson(arguments, JsonLimits(), "arguments");
  return parsed.ok() && parsed->is_object() ? *std::move(parsed) : Json::object();
}

std::string Sse(std::string_view event, const Json& data) {
  return absl::StrCat("event: ", absl::string_view(event.data(), event.size()),
                      "\ndata: ", Dump(data), "\n\n");
}

}  // namespace

absl::StatusOr<Json> ResponsesToChat(const Json& body) {
  if (Field(body, "previous_response_id") != nullptr) {
    return Stateless("previous_response_id",
                     "this server stores no responses (store is false); send the whole "
                     "conversation as input, with the earlier output items");
  }
  if (Field(body, "conversation") != nullptr) {
    return Stateless("conversation",
                     "this server stores no conversations; send the whole conversation as input");
  }
  ASSIGN_OR_RETURN(std::optional<bool> background, GetBool(body, "background"));
  if (background.value_or(false)) {
    return Stateless("background", "this server stores no responses to fetch later");
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> top_logprobs, GetInteger(body, "top_logprobs", 0, 20));
  if (top_logprobs.value_or(0) > 0) {
    return Unsupported("top_logprobs",
                       "top_logprobs is not supported on /v1/responses; use /v1/chat/completions");
  }
  Json chat = Json::object();
  if (const Json* model = Field(body, "model"); model != nullptr) chat["model"] = *model;
  Json messages = Json::array();
  ASSIGN_OR_RETURN(std::optional<std::string> instructions, GetString(body, "instructions"));
  if (instructions.has_value())
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  const Json* input = Field(body, "input");
  if (input == nullptr) return Invalid("input", "input is required");
  RETURN_IF_ERROR(ResponsesInput(*input, &messages));
  chat["messages"] = std::move(messages);
  if (const Json* max = Field(body, "max_output_tokens"); max != nullptr) {
    chat["max_completion_tokens"] = *max;
  }
  PassThrough(body, &chat);
  RETURN_IF_ERROR(ResponsesTools(body, &chat));
  RETURN_IF_ERROR(ResponsesTextFormat(body, &chat));
  return chat;
}

Json ResponsesEchoFields(const Json& body) {
  Json fields = Json::object();
  fields["instructions"] = body.value("instructions", Json());
  fields["max_output_tokens"] = body.value("max_output_tokens", Json());
  fields["metadata"] = body.value("metadata", Json::object());
  fields["parallel_tool_calls"] = body.value("parallel_tool_calls", Json(true));
  fields["temperature"] = body.value("temperature", Json(1.0));
  fields["text"] = body.value("text", Json{{"format", {{"type", "text"}}}});
  fields["tool_choice"] = body.value("tool_choice", Json("auto"));
  fields["tools"] = body.value("tools", Json::array());
  fields["top_p"] = body.value("top_p", Json(1.0));
  fields["user"] = body.value("user", Json());
  return fields;
}

absl::StatusOr<Json> MessagesToChat(const Json& body) {
  Json chat = Json::object();
  if (const Json* model = Field(body, "model"); model != nullptr) chat["model"] = *model;
  // Anthropic requires max_tokens.
  const Json* max_tokens = Field(body, "max_tokens");
  if (max_tokens == nullptr) return Invalid("max_tokens", "max_tokens is required");
  chat["max_completion_tokens"] = *max_tokens;
  Json messages = Json::array();
  if (const Json* system = Field(body, "system"); system != nullptr) {
    if (system->is_string()) {
      messages.push_back({{"role", "system"}, {"content", *system}});
    } else {
      ASSIGN_OR_RETURN(Json parts, ResponsesContent(*system, "system"));
      messages.push_back({{"role", "system"}, {"content", std::move(parts)}});
    }
  }
  const Json* turns = Field(body, "messages");
  if (turns == nullptr || !turns->is_array()) {
    return WrongType("messages", "a list of {role, content} messages");
  }
  for (size_t i = 0; i < turns->size(); ++i) {
    const Json& turn = (*turns)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!turn.is_object()) return WrongType(where, "an object {role, content}");
    ASSIGN_OR_RETURN(std::optional<std::string> role, GetString(turn, "role"));
    if (role != "user" && role != "assistant") {
      return Invalid(where + ".role", absl::StrCat(where, ".role must be user or assistant, got '",
                                                   TextExcerpt(role.value_or("")), "'"));
    }
    const Json* content = Field(turn, "content");
    if (content == nullptr) return Invalid(where + ".content", where + ".content is required");
    if (content->is_string()) {
      messages.push_back({{"role", *role}, {"content", *content}});
      continue;
    }
    if (!content->is_array()) return WrongType(where + ".content", "a string or a list of blocks");
    Json texts = Json::array();
    for (size_t b = 0; b < content->size(); ++b) {
      const Json& block = (*content)[b];
      const std::string block_where = absl::StrCat(where, ".content[", b, "]");
      if (!block.is_object()) return WrongType(block_where, "an object {type, ...}");
      const std::string type = block.value("type", "");
      if (type == "text") {
        ASSIGN_OR_RETURN(std::optional<std::string> text, GetString(block, "text"));
        texts.push_back({{"type", "text"}, {"text", text.value_or("")}});
      } else if (type == "tool_use" && *role == "assistant") {
        ASSIGN_OR_RETURN(std::optional<std::string> id, GetString(block, "id"));
        ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(block, "name"));
        if (!id.has_value() || !name.has_value()) {
          return Invalid(block_where, block_where + " (tool_use) needs id and name");
        }
        const Json* input = Field(block, "input");
        AddToolCall(ToolCall(*id, *name, input != nullptr ? *input : Json::object()), &messages);
      } else if (type == "tool_result" && *role == "user") {
        ASSIGN_OR_RETURN(std::optional<std::string> id, GetString(block, "tool_use_id"));
        if (!id.has_value()) return Invalid(block_where, block_where + ".tool_use_id is required");
        const Json* result = Field(block, "content");
        Json text = "";
        if (result != nullptr) {
          ASSIGN_OR_RETURN(text, ResponsesContent(*result, block_where + ".content"));
        }
        messages.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", text}});
      } else if (type == "thinking" || type == "redacted_thinking") {
        continue;  // Earlier reasoning: templates drop it from the history.
      } else {
        return Unsupported(block_where + ".type",
                           absl::StrCat(block_where, ".type '", TextExcerpt(type),
                                        "' is not supported here; send text, tool_use "
                                        "(assistant) and tool_result (user) blocks"));
      }
    }
    if (!texts.empty()) {
      // Text after tool calls in the same assistant turn stays that turn's content.
      if (*role == "assistant" && !messages.empty() && messages.back()["role"] == "assistant" &&
          messages.back()["content"].is_null()) {
        messages.back()["content"] = std::move(texts);
      } else {
        messages.push_back({{"role", *role}, {"content", std::move(texts)}});
      }
    }
  }
  chat["messages"] = std::move(messages);
  PassThrough(body, &chat);
  if (const Json* stops = Field(body, "stop_sequences"); stops != nullptr) chat["stop"] = *stops;
  if (const Json* tools = Field(body, "tools"); tools != nullptr) {
    if (!tools->is_array()) return WrongType("tools", "a list of tools {name, input_schema}");
    Json out = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& tool = (*tools)[i];
      const std::string where = absl::StrCat("tools[", i, "]");
      if (!tool.is_object() || !tool.contains("name")) {
        return WrongType(where, "a tool {name, description, input_schema}");
      }
      if (tool.contains("type") && tool["type"] != "custom") {
        return Unsupported(where + ".type", where + ": only client tools are served");
      }
      Json function = {{"name", tool["name"]}};
      if (const Json* d = Field(tool, "description"); d != nullptr) function["description"] = *d;
      if (const Json* s = Field(tool, "input_schema"); s != nullptr) function["parameters"] = *s;
      out.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    chat["tools"] = std::move(out);
  }
  if (const Json* choice = Field(body, "tool_choice"); choice != nullptr) {
    if (!choice->is_object()) return WrongType("tool_choice", "an object {type}");
    const std::string type = choice->value("type", "");
    if (type == "auto" || type == "none") {
      chat["tool_choice"] = type;
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "tool" && choice->contains("name")) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      return Unsupported("tool_choice", "tool_choice.type must be auto, any, tool or none");
    }
    if (choice->value("disable_parallel_tool_use", false)) chat["parallel_tool_calls"] = false;
  }
  if (const Json* thinking = Field(body, "thinking"); thinking != nullptr) {
    if (!thinking->is_object()) return WrongType("thinking", "an object {type, budget_tokens}");
    const std::string type = thinking->value("type", "");
    if (type == "disabled") {
      chat["chat_template_kwargs"]["enable_thinking"] = false;
    } else if (type == "enabled" && thinking->contains("budget_tokens")) {
      chat["max_reasoning_tokens"] = (*thinking)["budget_tokens"];
    } else if (type != "enabled") {
      return Unsupported("thinking.type", "thinking.type must be enabled or disabled");
    }
  }
  return chat;
}

absl::Status RenameChatError(const absl::Status& status, Endpoint endpoint) {
  using Renames = std::vector<std::pair<std::string, std::string>>;
  const Renames renames = endpoint == Endpoint::kResponses
                              ? Renames{{"max_completion_tokens", "max_output_tokens"},
                                        {"max_tokens", "max_output_tokens"},
                                        {"response_format", "text.format"},
                                        {"messages", "input"}}
                              : Renames{{"max_completion_tokens", "max_tokens"}};
  const std::optional<std::string> param = ParamPayload(status);
  std::string new_param = param.value_or("");
  for (const auto& [from, to] : renames) {
    if (new_param.starts_with(from)) {
      new_param = absl::StrCat(to, new_param.substr(from.size()));
      break;
    }
  }
  absl::Status renamed(status.code(), absl::StrReplaceAll(status.message(), renames));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { renamed.SetPayload(url, payload); });
  return param.has_value() ? WithParam(renamed, new_param) : renamed;
}

// --- BlockFormatter ---

namespace {

ParsedRequest AsChat(ParsedRequest request) {
  request.endpoint = Endpoint::kChatCompletions;
  return request;
}

}  // namespace

BlockFormatter::BlockFormatter(const ParsedRequest& request) : chat_(AsChat(request), "", 0, "") {}

bool BlockFormatter::called_tools() const {
  for (const Block& block : blocks_) {
    if (block.kind == Block::Kind::kToolCall) return true;
  }
  return false;
}

void BlockFormatter::Open(Block block, std::string* sse) {
  Close(sse);
  blocks_.push_back(std::move(block));
  open_ = true;
  if (sse != nullptr) OnOpen(blocks_.back(), static_cast<int>(blocks_.size()) - 1, sse);
}

void BlockFormatter::Close(std::string* sse) {
  if (!open_) return;
  open_ = false;
  if (sse != nullptr) OnClose(blocks_.back(), static_cast<int>(blocks_.size()) - 1, sse);
}

void BlockFormatter::Extend(Block::Kind kind, std::string_view text, std::string* sse) {
  if (text.empty()) return;
  if (!open_ || blocks_.back().kind != kind) Open(Block{.kind = kind}, sse);
  blocks_.back().text += text;
  if (sse != nullptr) OnDelta(blocks_.back(), static_cast<int>(blocks_.size()) - 1, text, sse);
}

void BlockFormatter::Feed(const v1::GenerateResponse& message, std::string* sse) {
  ResponseFormatter::ChatDelta delta = chat_.NextChatDelta(message);
  Extend(Block::Kind::kReasoning, delta.reasoning, sse);
  Extend(Block::Kind::kText, delta.content, sse);
  for (ToolCallDelta& call : delta.tool_calls) {
    if (!call.id.empty()) {
      Open(Block{.kind = Block::Kind::kToolCall, .call_id = call.id, .name = call.name}, sse);
    }
    if (open_ && blocks_.back().kind == Block::Kind::kToolCall && !call.arguments.empty()) {
      blocks_.back().text += call.arguments;
      if (sse != nullptr) {
        OnDelta(blocks_.back(), static_cast<int>(blocks_.size()) - 1, call.arguments, sse);
      }
    }
  }
  if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    Close(sse);
    finish_reason_ = message.finish_reason();
    stop_string_ = message.stop_string();
    usage_ = message.usage();
  }
}

void BlockFormatter::AppendEvents(const v1::GenerateResponse& message, std::string* sse) {
  Feed(message, sse);
}

void BlockFormatter::Add(const v1::GenerateResponse& message) { Feed(message, nullptr); }

// --- ResponsesFormatter ---

ResponsesFormatter::ResponsesFormatter(const ParsedRequest& request, std::string_view id,
                                       int64_t created_unix_s, std::string_view model)
    : BlockFormatter(request),
      id_(id),
      created_(created_unix_s),
      model_(model),
      fields_(request.api_fields) {}

void ResponsesFormatter::Event(std::string_view type, Json data, std::string* sse) {
  Json event = {{"type", type}, {"sequence_number", sequence_number_++}};
  for (auto& [key, value] : data.items()) event[key] = std::move(value);
  sse->append(Sse(type, event));
}

Json ResponsesFormatter::Item(const Block& block, int index, bool done) const {
  const std::string status = done ? "completed" : "in_progress";
  switch (block.kind) {
    case Block::Kind::kReasoning:
      return {{"type", "reasoning"},
              {"id", absl::StrCat("rs_", id_, "_", index)},
              {"summary", Json::array()},
              {"content", done ? Json::array({{{"type", "reasoning_text"}, {"text", block.text}}})
                               : Json::array()},
              {"status", status}};
    case Block::Kind::kText:
      return {{"type", "message"},
              {"id", absl::StrCat("msg_", id_, "_", index)},
              {"status", status},
              {"role", "assistant"},
              {"content", done ? Json::array({{{"type", "output_text"},
                                               {"text", block.text},
                                               {"annotations", Json::array()},
                                               {"logprobs", Json::array()}}})
                               : Json::array()}};
    case Block::Kind::kToolCall:
      return {{"type", "function_call"},
              {"id", absl::StrCat("fc_", id_, "_", index)},
              {"call_id", block.call_id},
              {"name", block.name},
              {"arguments", done ? block.text : ""},
              {"status", status}};
  }
  return Json();
}

Json ResponsesFormatter::Object(const v1::Usage* usage) const {
  Json object = {{"id", id_}, {"object", "response"}, {"created_at", created_}};
  const bool incomplete = finish_reason() == v1::FINISH_REASON_LENGTH;
  object["status"] = usage == nullptr ? "in_progress" : incomplete ? "incomplete" : "completed";
  object["error"] = nullptr;
  object["incomplete_details"] =
      usage != nullptr && incomplete ? Json{{"reason", "max_output_tokens"}} : Json();
  object["model"] = model_;
  Json output = Json::array();
  if (usage != nullptr) {
    for (size_t i = 0; i < blocks().size(); ++i) {
      output.push_back(Item(blocks()[i], static_cast<int>(i), true));
    }
  }
  object["output"] = std::move(output);
  for (const auto& [key, value] : fields_.items()) object[key] = value;
  object["previous_response_id"] = nullptr;
  object["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  object["store"] = false;
  object["truncation"] = "disabled";
  object["usage"] = usage != nullptr ? UsageJson(*usage, false) : Json();
  return object;
}

void ResponsesFormatter::AppendStart(std::string* sse) {
  Event("response.created", {{"response", Object(nullptr)}}, sse);
  Event("response.in_progress", {{"response", Object(nullptr)}}, sse);
}

void ResponsesFormatter::OnOpen(const Block& block, int index, std::string* sse) {
  const Json item = Item(block, index, false);
  Event("response.output_item.added", {{"output_index", index}, {"item", item}}, sse);
  if (block.kind == Block::Kind::kToolCall) return;
  const bool text = block.kind == Block::Kind::kText;
  Json part = text ? Json{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}
                   : Json{{"type", "reasoning_text"}, {"text", ""}};
  Event("response.content_part.added",
        {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}},
        sse);
}

void ResponsesFormatter::OnDelta(const Block& block, int index, std::string_view delta,
                                 std::string* sse) {
  const Json item_id = Item(block, index, false)["id"];
  switch (block.kind) {
    case Block::Kind::kReasoning:
      Event("response.reasoning_text.delta",
            {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"delta", delta}},
            sse);
      return;
    case Block::Kind::kText:
      Event("response.output_text.delta",
            {{"item_id", item_id},
             {"output_index", index},
             {"content_index", 0},
             {"delta", delta},
             {"logprobs", Json::array()}},
            sse);
      return;
    case Block::Kind::kToolCall:
      Event("response.function_call_arguments.delta",
            {{"item_id", item_id}, {"output_index", index}, {"delta", delta}}, sse);
      return;
  }
}

void ResponsesFormatter::OnClose(const Block& block, int index, std::string* sse) {
  const Json item = Item(block, index, true);
  switch (block.kind) {
    case Block::Kind::kReasoning:
    case Block::Kind::kText: {
      const bool text = block.kind == Block::Kind::kText;
      Event(text ? "response.output_text.done" : "response.reasoning_text.done",
            {{"item_id", item["id"]},
             {"output_index", index},
             {"content_index", 0},
             {"text", block.text}},
            sse);
      Event("response.content_part.done",
            {{"item_id", item["id"]},
             {"output_index", index},
             {"content_index", 0},
             {"part", item["content"][0]}},
            sse);
      break;
    }
    case Block::Kind::kToolCall:
      Event("response.function_call_arguments.done",
            {{"item_id", item["id"]},
             {"output_index", index},
             {"name", block.name},
             {"arguments", block.text}},
            sse);
      break;
  }
  Event("response.output_item.done", {{"output_index", index}, {"item", item}}, sse);
}

void ResponsesFormatter::AppendEnd(const v1::Usage& usage, std::string* sse) {
  const Json object = Object(&usage);
  Event(object["status"] == "incomplete" ? "response.incomplete" : "response.completed",
        {{"response", object}}, sse);
}

std::string ResponsesFormatter::ErrorEvents(const absl::Status& status) {
  std::string sse;
  Event("error",
        {{"code", nullptr}, {"message", std::string(status.message())}, {"param", nullptr}}, &sse);
  Json failed = Object(nullptr);
  failed["status"] = "failed";
  failed["error"] = {{"code", "server_error"}, {"message", std::string(status.message())}};
  Event("response.failed", {{"response", std::move(failed)}}, &sse);
  return sse;
}

std::string ResponsesFormatter::WholeBody(const std::vector<const AnswerFormatter*>&) const {
  return Dump(Object(&usage()));
}

// --- MessagesFormatter ---

MessagesFormatter::MessagesFormatter(const ParsedRequest& request, std::string_view id,
                                     std::string_view model, int prompt_tokens)
    : BlockFormatter(request), id_(id), model_(model), prompt_tokens_(prompt_tokens) {}

std::string MessagesFormatter::StopReason() const {
  switch (finish_reason()) {
    case v1::FINISH_REASON_LENGTH:
      return "max_tokens";
    case v1::FINISH_REASON_STOP:
      // A stop token (the template's end of turn) ends a turn; a stop string is one of
      // the request's stop_sequences.
      if (called_tools()) return "tool_use";
      return stop_string().empty() ? "end_turn" : "stop_sequence";
    default:
      return called_tools() ? "tool_use" : "end_turn";
  }
}

Json MessagesFormatter::StopSequence() const {
  return StopReason() == "stop_sequence" ? Json(stop_string()) : Json();
}

Json MessagesFormatter::ContentBlock(const Block& block, bool done) const {
  switch (block.kind) {
    case Block::Kind::kReasoning:
      return {{"type", "thinking"}, {"thinking", done ? block.text : ""}, {"signature", ""}};
    case Block::Kind::kText:
      return {{"type", "text"}, {"text", done ? block.text : ""}};
    case Block::Kind::kToolCall:
      return {{"type", "tool_use"},
              {"id", block.call_id},
              {"name", block.name},
              {"input", done ? ArgumentsObject(block.text) : Json::object()}};
  }
  return Json();
}

void MessagesFormatter::AppendStart(std::string* sse) {
  v1::Usage usage;
  usage.set_prompt_tokens(prompt_tokens_);
  const Json message = {{"id", id_},
                        {"type", "message"},
                        {"role", "assistant"},
                        {"model", model_},
                        {"content", Json::array()},
                        {"stop_reason", nullptr},
                        {"stop_sequence", nullptr},
                        {"usage", UsageJson(usage, true)}};
  sse->append(Sse("message_start", {{"type", "message_start"}, {"message", message}}));
}

void MessagesFormatter::OnOpen(const Block& block, int index, std::string* sse) {
  sse->append(Sse("content_block_start", {{"type", "content_block_start"},
                                          {"index", index},
                                          {"content_block", ContentBlock(block, false)}}));
}

void MessagesFormatter::OnDelta(const Block& block, int index, std::string_view delta,
                                std::string* sse) {
  Json d;
  switch (block.kind) {
    case Block::Kind::kReasoning:
      d = {{"type", "thinking_delta"}, {"thinking", delta}};
      break;
    case Block::Kind::kText:
      d = {{"type", "text_delta"}, {"text", delta}};
      break;
    case Block::Kind::kToolCall:
      d = {{"type", "input_json_delta"}, {"partial_json", delta}};
      break;
  }
  sse->append(Sse("content_block_delta",
                  {{"type", "content_block_delta"}, {"index", index}, {"delta", std::move(d)}}));
}

void MessagesFormatter::OnClose(const Block&, int index, std::string* sse) {
  sse->append(Sse("content_block_stop", {{"type", "content_block_stop"}, {"index", index}}));
}

void MessagesFormatter::AppendEnd(const v1::Usage& usage, std::string* sse) {
  sse->append(Sse("message_delta",
                  {{"type", "message_delta"},
                   {"delta", {{"stop_reason", StopReason()}, {"stop_sequence", StopSequence()}}},
                   {"usage", UsageJson(usage, true)}}));
  sse->append(Sse("message_stop", {{"type", "message_stop"}}));
}

std::string MessagesFormatter::ErrorEvents(const absl::Status& status) {
  return Sse("error", Json::parse(MessagesErrorBody(status), nullptr, /*allow_exceptions=*/false));
}

std::string MessagesFormatter::WholeBody(const std::vector<const AnswerFormatter*>&) const {
  Json content = Json::array();
  for (const Block& block : blocks()) content.push_back(ContentBlock(block, true));
  return Dump({{"id", id_},
               {"type", "message"},
               {"role", "assistant"},
               {"model", model_},
               {"content", std::move(content)},
               {"stop_reason", StopReason()},
               {"stop_sequence", StopSequence()},
               {"usage", UsageJson(usage(), true)}});
}

std::unique_ptr<AnswerFormatter> MakeAnswerFormatter(const ParsedRequest& request,
                                                     std::string_view id, int64_t created_unix_s,
                                                     std::string_view model, int index,
                                                     int prompt_tokens) {
  switch (request.endpoint) {
    case Endpoint::kResponses:
      return std::make_unique<ResponsesFormatter>(request, id, created_unix_s, model);
    case Endpoint::kMessages:
      return std::make_unique<MessagesFormatter>(request, id, model, prompt_tokens);
    case Endpoint::kCompletions:
    case Endpoint::kChatCompletions:
      break;
  }
  return std::make_unique<ResponseFormatter>(request, id, created_unix_s, model, index);
}

std::string MessagesErrorBody(const absl::Status& status) {
  const int http = HttpStatusFor(status);
  const char* type = http == 400   ? "invalid_request_error"
                     : http == 401 ? "authentication_error"
                     : http == 403 ? "permission_error"
                     : http == 404 ? "not_found_error"
                     : http == 429 ? "rate_limit_error"
                     : http == 503 ? "overloaded_error"
                                   : "api_error";
  return Dump(
      {{"type", "error"}, {"error", {{"type", type}, {"message", std::string(status.message())}}}});
}

}  // namespace conveyor::scheduler::openai
