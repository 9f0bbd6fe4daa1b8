// Tool calls in a chat completion's output (issue T, docs/structured-output.md): the model
// writes calls in its family's own syntax and the OpenAI API returns them as `tool_calls`
// (id, type "function", function.name, function.arguments as a JSON string). This file
// holds one parser per syntax behind one interface, the choice of syntax from a name or
// from the chat template, and the grammar that `tool_choice` "required" or a named function
// constrains the output with. Pure logic, no engine or sockets (tool_calls_test.cc).
//
// Formats:
//  - "llama3_json" (Llama 3.1-3.3): the output is `{"name": …, "parameters": {…}}`
//    ("arguments" accepted too), optionally after `<|python_tag|>`; several calls may be
//    separated by `;` or whitespace. An output that does not start that way is content.
//  - "hermes" (Qwen2.5, Hermes): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`
//    blocks, any number, with content around them.
//  - "mistral": `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, and the newer
//    `[TOOL_CALLS]name[ARGS]{…}`, with content before.
//
// Streaming and the whole response are one code path: the whole response is the parser
// fed the text at once, then Finish. A parser consumes its input only where what it
// decides no longer depends on text still to come (a possible marker's prefix, a call
// whose JSON has not closed, whitespace after a call are held), so the deltas of any split
// of the same text into chunks concatenate to the same content and the same calls, ids
// included when the id source is the same (tool_calls_test.cc and
// tests/fuzz/tool_call_parser_fuzzer.cc check it). A call's arguments are emitted whole,
// in one delta, once their JSON has closed: the compact serialization of the parsed value
// (nlohmann's dump(), keys in the order the model wrote them), so streamed and whole
// responses carry the same string. Text that looks like a call but is not one (bad JSON,
// another shape, past a bound) is content, never dropped; whitespace between and after
// calls is dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace conveyor::scheduler::openai {

enum class ToolCallFormat { kLlama3Json, kHermes, kMistral };

// "llama3_json", "hermes" or "mistral" (the names the --tool_call_format flag takes).
std::string_view ToolCallFormatName(ToolCallFormat format);
// The format named `name`; INVALID_ARGUMENT listing the names for any other.
absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name);
// The format a chat template's text shows: "<tool_call>" is hermes, "[TOOL_CALLS]"
// mistral, "<|python_tag|>" or a Llama 3 header ("<|start_header_id|>") with `tools`
// llama3_json. NOT_FOUND when the template shows no sign of tool support.
absl::StatusOr<ToolCallFormat> GuessToolCallFormat(std::string_view chat_template);

struct ToolCallLimits {
  // The most bytes one call's JSON may take (or, for hermes, what lies between its tags); a
  // longer one is content. A parser holds back at most this plus kToolCallHeldOverheadBytes.
  size_t max_call_bytes = size_t{1} << 20;
  // The most calls in one output; the text of any further call is content.
  int max_calls = 128;
  // How deep a call's JSON may nest (its parse is bounded as client JSON is).
  int max_json_depth = 64;
};

// What a parser may hold beyond ToolCallLimits::max_call_bytes: a marker's first bytes,
// whitespace before a call or after one, a Mistral function name, half a character.
inline constexpr size_t kToolCallHeldOverheadBytes = 256;

// Random bits for tool-call ids (each parser formats its own: "call_" and 24 letters and
// digits, or 9 for Mistral, whose template requires it). Tests pass a seeded one.
using ToolCallIdSource = std::function<uint64_t()>;
// A source seeded from the system's entropy, for serving.
ToolCallIdSource RandomToolCallIdSource();

// A fragment of the `index`-th call (0-based, in output order).
struct ToolCallDelta {
  int index = 0;
  std::string id;         // In the call's first delta only.
  std::string name;       // In the call's first delta only.
  std::string arguments;  // The next piece of the arguments' JSON text.
};

// What one Feed or Finish adds: content text (well-formed UTF-8 wherever the input is, as
// a character cut by a chunk's end is held back) and call fragments. Within one delta,
// content and calls are not ordered against each other (one SSE chunk carries both).
struct ToolCallStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && tool_calls.empty(); }
};

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // Compact JSON of an object.

  bool operator==(const ParsedToolCall&) const = default;
};

// A whole response: the content and the calls, as the deltas concatenate to.
struct ParsedToolCalls {
  std::string content;
  std::vector<ParsedToolCall> tool_calls;

  // Appends `delta` (calls by their index).
  void Append(const ToolCallStreamDelta& delta);
  bool operator==(const ParsedToolCalls&) const = default;
};

// One output's parser, fed its text in order. Not thread-safe; one per choice.
class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;

  // Takes the next piece of the output's text; returns what is now decided.
  virtual ToolCallStreamDelta Feed(std::string_view text) = 0;
  // The output has ended: returns everything still held. Later calls return nothing.
  virtual ToolCallStreamDelta Finish() = 0;
  // Bytes of output held back, undecided (at most ToolCallLimits::max_call_bytes +
  // kToolCallHeldOverheadBytes).
  virtual size_t held_bytes() const = 0;
  // Calls emitted so far (at most ToolCallLimits::max_calls).
  virtual int num_calls() const = 0;
};

std::unique_ptr<ToolCallParser> MakeToolCallParser(ToolCallFormat format,
                                                   ToolCallIdSource id_source,
                                                   const ToolCallLimits& limits = {});

// The non-streamed result: `parser`, new, fed `text` whole, then Finish.
ParsedToolCalls ParseToolCalls(ToolCallParser& parser, std::string_view text);

// The grammar text (grammar/grammar.h, rule `root`) of the outputs that `tool_choice`
// "required" or a named function allows: one call in `format`'s syntax, or one or more
// when `parallel_tool_calls`, of the tools in `tools` (OpenAI's array of
// {"type": "function", "function": {"name", "parameters"}}), or only of the one named
// `function_name` when it is not empty. Each call's arguments match its tool's
// `parameters` schema (grammar/json_schema.h; absent parameters allow any object). The
// calls are written as the family's template shows them: llama3_json
// `{"name": "f", "parameters": {…}}` separated by "; " (without `<|python_tag|>`, a
// special token the grammar's text cannot hold); hermes `<tool_call>` blocks separated by a
// newline; mistral `[TOOL_CALLS][{"name": "f", "arguments": {…}}, …]`. Where a marker the
// grammar spells out is a special or added token of the tokenizer (`[TOOL_CALLS]` in
// Mistral's v3 tokenizers, `<tool_call>` in Qwen2.5's), the mask must let that token stand
// for its text, or the model can only spell it out in pieces. INVALID_ARGUMENT for
// malformed tools, an unknown `function_name`, or a schema the compiler refuses (naming
// the tool).
absl::StatusOr<std::string> ToolCallGrammar(ToolCallFormat format,
                                            const nlohmann::ordered_json& tools,
                                            std::string_view function_name,
                                            bool parallel_tool_calls);

}  // namespace conveyor::scheduler::openai
