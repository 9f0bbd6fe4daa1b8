#include "text/jinja/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/gguf.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "text/jinja/ast.h"
#include "text/jinja/parser.h"
#include "text/jinja/renderer.h"

namespace conveyor::jinja {
namespace {

// JSON nested deeper than this is refused rather than converted recursively.
constexpr int kMaxContextDepth = 256;

template <typename Json>
absl::StatusOr<Value> FromJson(const Json& json, int depth) {
  if (depth > kMaxContextDepth) {
    return absl::InvalidArgumentError("chat template context is nested too deeply");
  }
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = json.template get<uint64_t>();
      // Beyond int64 the interpreter has no integer; a float is the closest value.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::String(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& element : json) {
        ASSIGN_OR_RETURN(Value item, FromJson(element, depth + 1));
        items.push_back(std::move(item));
      }
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        ASSIGN_OR_RETURN(Value item, FromJson(it.value(), depth + 1));
        dict.Set(Value::String(it.key()), std::move(item));
      }
      return Value::MakeDict(std::move(dict));
    }
    default:
      return absl::InvalidArgumentError("chat template context holds binary data");
  }
}

template <typename Json>
absl::StatusOr<std::string> RenderJson(const Program& program, const Json& context) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("chat template context must be a JSON object");
  }
  ASSIGN_OR_RETURN(Value variables, FromJson(context, 0));
  absl::StatusOr<std::string> out = Renderer::Render(program, variables);
  if (!out.ok() && IsTemplateRaised(out.status())) {
    return absl::InvalidArgumentError(out.status().message());
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in.good() && !in.eof())
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path.string()));
  return contents.str();
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ParseNamed(std::string_view source,
                                                         const std::string& origin) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace

ChatTemplate::ChatTemplate(std::unique_ptr<const Program> program, std::string source)
    : program_(std::move(program)), source_(std::move(source)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::unique_ptr<Program> program, ParseTemplate(source));
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(program), std::string(source)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context) const {
  return RenderJson(*program_, context);
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  return RenderJson(*program_, context);
}

namespace {

// The name transformers and llama.cpp render conversations with tools through.
constexpr std::string_view kToolUse = "tool_use";

// Files one directory holds, by name order (so that what is logged does not depend on the
// file system's).
std::vector<std::filesystem::path> JinjaFilesIn(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".jinja") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A named template: "tool_use" is parsed and kept, any other name only listed.
absl::Status AddNamed(std::string_view name, std::string_view source, const std::string& origin,
                      ChatTemplates* out) {
  if (name != kToolUse) {
    out->unused.emplace_back(name);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(out->tool_use, ParseNamed(source, origin));
  return absl::OkStatus();
}

absl::StatusOr<ChatTemplates> LoadGgufChatTemplates(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ChatTemplates out;
  constexpr std::string_view kKey = "tokenizer.chat_template";
  for (const auto& [key, value] : file->metadata()) {
    if (!std::string_view(key).starts_with(kKey)) continue;
    std::string_view name = std::string_view(key).substr(kKey.size());
    if (!name.empty() && !name.starts_with('.')) continue;  // Another key.
    if (!name.empty()) name.remove_prefix(1);
    const std::string origin = absl::StrCat(path, ": ", key);
    const std::string* source = value.AsString();
    if (source == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, " must be a string, not a ", GgufValueTypeName(value.type())));
    }
    if (FindInvalidUtf8(*source) != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(origin, " is not valid UTF-8"));
    }
    if (name.empty()) {
      ASSIGN_OR_RETURN(out.chat, ParseNamed(*source, origin));
    } else {
      RETURN_IF_ERROR(AddNamed(name, *source, origin, &out));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplateFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no such file"));
  }
  ASSIGN_OR_RETURN(std::string source, ReadFile(path));
  if (FindInvalidUtf8(source) != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid UTF-8"));
  }
  return ParseNamed(source, path);
}

absl::StatusOr<ChatTemplates> LoadChatTemplates(const std::string& model_dir) {
  // A GGUF file (the path rule of text/gguf_tokenizer.h's IsGgufPath) carries its
  // templates as metadata.
  if (absl::EndsWith(model_dir, ".gguf")) return LoadGgufChatTemplates(model_dir);
  ChatTemplates out;
  const std::filesystem::path dir(model_dir);
  std::error_code ec;
  const std::filesystem::path jinja_file = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_file, ec)) {
    ASSIGN_OR_RETURN(std::string source, ReadFile(jinja_file));
    ASSIGN_OR_RETURN(out.chat, ParseNamed(source, jinja_file.string()));
    for (const std::filesystem::path& file : JinjaFilesIn(dir / "additional_chat_templates")) {
      ASSIGN_OR_RETURN(std::string named, ReadFile(file));
      RETURN_IF_ERROR(AddNamed(file.stem().string(), named, file.string(), &out));
    }
    return out;
  }
  const std::filesystem::path config_file = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_file, ec)) return out;
  ASSIGN_OR_RETURN(std::string text, ReadFile(config_file));
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_file.string(), " is not a JSON object"));
  }
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return out;
  if (it->is_string()) {
    ASSIGN_OR_RETURN(out.chat, ParseNamed(it->get<std::string>(), config_file.string()));
    return out;
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_file.string(), ": chat_template is neither a string nor a list"));
  }
  // Several named templates: transformers renders with "default", or with "tool_use" when
  // the conversation has tools.
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_file.string(),
          ": each entry of the chat_template list must be {\"name\": string, \"template\": "
          "string}"));
    }
    const std::string name = entry["name"].get<std::string>();
    const std::string source = entry["template"].get<std::string>();
    const std::string origin = absl::StrCat(config_file.string(), " (template \"", name, "\")");
    if (name == "default") {
      ASSIGN_OR_RETURN(out.chat, ParseNamed(source, origin));
    } else {
      RETURN_IF_ERROR(AddNamed(name, source, origin, &out));
    }
  }
  if (out.chat == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_file.string(), ": chat_template lists several templates and none is named default"));
  }
  return out;
}

}  // namespace conveyor::jinja
