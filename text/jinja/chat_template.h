// A model's chat template: the Jinja program that turns an OpenAI-style message list into
// the prompt text the model was trained on.
//
// Models ship the template in tokenizer_config.json ("chat_template") or in
// chat_template.jinja, written for Python's jinja2 as Hugging Face transformers configures
// it. This interpreter (the rest of text/jinja/) reproduces that environment byte for
// byte on what chat templates use:
//   - ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//     extensions=[loopcontrols]): default (lenient) Undefined, no autoescaping, one
//     trailing newline of the template dropped, lists and dicts cannot be mutated;
//   - globals raise_exception(msg) (renders fail with exactly `msg`) and strftime_now(fmt)
//     (local time, like datetime.now().strftime);
//   - the `tojson` filter replaced by json.dumps(x, ensure_ascii=False, indent=indent,
//     separators=separators, sort_keys=sort_keys): no HTML escaping, ", " and ": "
//     separators unless told otherwise, non-ASCII characters written as they are;
//   - `{% generation %}...{% endgeneration %}` (transformers' AssistantTracker) renders its
//     body unchanged.
// Values follow Python: str() of None/True/1.0/lists/dicts, 1 == 1.0 == True, floor
// division and modulo, slicing over code points. text/jinja/README.md lists what is
// supported and the known gaps.
//
// Everything a template could get wrong is found as early as possible: Parse rejects
// unknown tags, filters and tests and unbalanced blocks, naming the line, so a model with
// a template this interpreter cannot run fails when it is loaded, not on its first request.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace conveyor::jinja {

struct Program;  // The parsed template (ast.h).

class ChatTemplate {
 public:
  // Parses `source`; an unsupported or malformed construct is InvalidArgument
  // "chat template line N: ...".
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(std::string_view source);
  ~ChatTemplate();

  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // Renders with `context` (a JSON object: messages, add_generation_prompt, bos_token,
  // eos_token, tools, and any other variables). A failed render is InvalidArgument: for
  // raise_exception(msg) the message is exactly `msg`, otherwise
  // "chat template line N: <what went wrong>". Safe to call from several threads at once.
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;
  // The same with the keys of every object in the order the client sent them, as Python
  // sees them. Prefer this one: `tojson` and `.items()` iterate in that order, and
  // nlohmann::json sorts keys.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  // The template's text (what a tool-call format is recognised from).
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::unique_ptr<const Program> program, std::string source);

  std::unique_ptr<const Program> program_;
  std::string source_;
};

// A model's chat templates. Most models have one; some name several (a list of {"name",
// "template"} in tokenizer_config.json, files in additional_chat_templates/, or GGUF's
// tokenizer.chat_template.<name>), and transformers and llama.cpp render a conversation
// that has tools through the one named "tool_use" (Command R, Hermes 2 Pro, ...).
struct ChatTemplates {
  // The default template; null when the model has none.
  std::unique_ptr<ChatTemplate> chat;
  // The "tool_use" template; null when there is none (tools then render through `chat`).
  std::unique_ptr<ChatTemplate> tool_use;
  // The other names (e.g. "rag"): nothing selects them, so they are neither parsed nor used.
  std::vector<std::string> unused;
};

// The model's chat templates, as transformers finds them:
//   - <model_dir>/chat_template.jinja (the default) and additional_chat_templates/<name>.jinja
//     when the first is present (transformers prefers the files);
//   - else tokenizer_config.json's "chat_template": a string, or a list of {"name",
//     "template"} with one named "default";
//   - a `model_dir` ending in ".gguf" is a GGUF file: tokenizer.chat_template, and
//     tokenizer.chat_template.<name> for the named ones.
// No template is not an error (every field null). A template that does not parse, an
// unreadable file, or a list without "default" is an error naming where it came from.
absl::StatusOr<ChatTemplates> LoadChatTemplates(const std::string& model_dir);

// The template in the Jinja file at `path` (an operator's --chat_template), parsed; an
// unreadable file or a template that does not parse is INVALID_ARGUMENT naming the file
// (and the line).
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplateFile(const std::string& path);

}  // namespace conveyor::jinja
