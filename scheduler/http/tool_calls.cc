#include "scheduler/http/tool_calls.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grammar/json_schema.h"
#include "text/bounded_json.h"

namespace conveyor::scheduler::openai {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// Whitespace after a call is held to be dropped (when another call or the end follows);
// a longer run is content, so that what is held stays small.
constexpr size_t kMaxDroppedWhitespace = 64;
// Function names in Mistral's `name[ARGS]` form: OpenAI's own bound.
constexpr size_t kMaxNameBytes = 64;

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

size_t SkipSpaces(std::string_view text, size_t pos) {
  while (pos < text.size() && IsSpace(text[pos])) ++pos;
  return pos;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`: bytes
// that may yet become the marker.
size_t PartialMarkerSuffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

// How many bytes at the end of `text` are an incomplete UTF-8 character (a lead byte
// followed by fewer continuation bytes than it announces), to be held until it completes.
size_t IncompleteUtf8Suffix(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // A continuation byte: look further back.
    size_t needed = 0;
    if ((c & 0xE0) == 0xC0) {
      needed = 2;
    } else if ((c & 0xF0) == 0xE0) {
      needed = 3;
    } else if ((c & 0xF8) == 0xF0) {
      needed = 4;
    }
    return needed > back ? back : 0;
  }
  return 0;
}

// Finds where a JSON object or array that starts a text ends, reading the text as it
// grows (each byte once): brackets counted outside strings, escapes honoured. It does not
// validate; the parse that follows does.
class JsonExtent {
 public:
  enum class State { kNeedMore, kClosed, kInvalid };

  // Scans `text` (the same text as before, maybe longer) at most `max_bytes` in; once
  // closed, stays so.
  // kInvalid: it does not start with '{' or '[', nests deeper than `max_depth`, or has
  // not closed within `max_bytes`.
  State Scan(std::string_view text, size_t max_bytes, int max_depth) {
    if (end_ > 0) return State::kClosed;
    const size_t stop = std::min(text.size(), max_bytes);
    for (; pos_ < stop; ++pos_) {
      const char c = text[pos_];
      if (pos_ == 0 && c != '{' && c != '[') return State::kInvalid;
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
      } else if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        if (++depth_ > max_depth) return State::kInvalid;
      } else if (c == '}' || c == ']') {
        if (--depth_ == 0) {
          end_ = ++pos_;
          return State::kClosed;
        }
      }
    }
    return pos_ >= max_bytes ? State::kInvalid : State::kNeedMore;
  }
  // Bytes up to and including the closing bracket (after kClosed).
  size_t end() const { return end_; }

 private:
  size_t pos_ = 0;
  size_t end_ = 0;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

struct Call {
  std::string name;
  std::string arguments;
};

std::string CompactJson(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The call `value` describes: {"name": a non-empty string, "arguments" or "parameters": an
// object (or a string holding one's JSON)}; other keys are ignored.
std::optional<Call> CallFromJson(const Json& value, const JsonLimits& limits) {
  if (!value.is_object()) return std::nullopt;
  const auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  auto args = value.find("arguments");
  if (args == value.end()) args = value.find("parameters");
  if (args == value.end()) return std::nullopt;
  if (args->is_object()) return Call{name->get<std::string>(), CompactJson(*args)};
  if (args->is_string()) {
    absl::StatusOr<Json> inner =
        ParseBoundedJson(args->get_ref<const std::string&>(), limits, "a tool call's arguments");
    if (inner.ok() && inner->is_object())
      return Call{name->get<std::string>(), CompactJson(*inner)};
  }
  return std::nullopt;
}

std::optional<Json> ParseJson(std::string_view text, const JsonLimits& limits) {
  absl::StatusOr<Json> value = ParseBoundedJson(text, limits, "a tool call");
  if (!value.ok()) return std::nullopt;
  return *std::move(value);
}

// What every parser shares: the input not yet consumed, the output being built, ids and
// bounds. A parser's Run consumes from the front of `input_` only what is decided.
class ParserBase : public ToolCallParser {
 public:
  ParserBase(ToolCallIdSource id_source, const ToolCallLimits& limits, size_t id_length,
             std::string_view id_prefix)
      : id_source_(std::move(id_source)),
        limits_(limits),
        id_length_(id_length),
        id_prefix_(id_prefix) {
    json_limits_.max_depth = limits.max_json_depth;
  }

  ToolCallStreamDelta Feed(std::string_view text) final {
    if (finished_) return {};
    input_.append(text);
    Consume(Run(/*final=*/false));
    return TakeOutput(/*final=*/false);
  }

  ToolCallStreamDelta Finish() final {
    if (finished_) return {};
    finished_ = true;
    Consume(Run(/*final=*/true));
    // Run consumes everything when final.
    input_.clear();
    return TakeOutput(/*final=*/true);
  }

  size_t held_bytes() const final { return input_.size() + content_.size(); }
  int num_calls() const final { return num_calls_; }

 protected:
  // Decides what it can of `input_` (all of it when `final`); returns the bytes decided.
  virtual size_t Run(bool final) = 0;

  std::string_view input() const { return input_; }
  const ToolCallLimits& limits() const { return limits_; }
  const JsonLimits& json_limits() const { return json_limits_; }

  void EmitContent(std::string_view text) { content_.append(text); }

  // Whether `n` more calls stay within the limit.
  bool CanAddCalls(size_t n) const {
    return static_cast<size_t>(num_calls_) + n <= static_cast<size_t>(limits_.max_calls);
  }

  void EmitCall(Call call) {
    ToolCallDelta delta;
    delta.index = num_calls_++;
    delta.id = NewId();
    delta.name = std::move(call.name);
    delta.arguments = std::move(call.arguments);
    calls_.push_back(std::move(delta));
  }

 private:
  void Consume(size_t n) { input_.erase(0, n); }

  ToolCallStreamDelta TakeOutput(bool final) {
    ToolCallStreamDelta out;
    const size_t held = final ? 0 : IncompleteUtf8Suffix(content_);
    out.content = content_.substr(0, content_.size() - held);
    content_.erase(0, content_.size() - held);
    out.tool_calls = std::move(calls_);
    calls_.clear();
    return out;
  }

  std::string NewId() {
    static constexpr std::string_view kAlphabet =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id(id_prefix_);
    for (size_t i = 0; i < id_length_; ++i) id += kAlphabet[id_source_() % kAlphabet.size()];
    return id;
  }

  ToolCallIdSource id_source_;
  ToolCallLimits limits_;
  JsonLimits json_limits_;
  size_t id_length_;
  std::string id_prefix_;
  std::string input_;
  std::string content_;  // Decided content, less an incomplete character at its end.
  std::vector<ToolCallDelta> calls_;
  int num_calls_ = 0;
  bool finished_ = false;
};

// A parser for formats whose calls follow a marker inside content (hermes, mistral): in
// text, content runs up to the marker; after it, a block that the format reads as calls,
// or else the marker is content after all.
class MarkerParser : public ParserBase {
 public:
  MarkerParser(std::string_view marker, ToolCallIdSource id_source, const ToolCallLimits& limits,
               size_t id_length, std::string_view id_prefix)
      : ParserBase(std::move(id_source), limits, id_length, id_prefix), marker_(marker) {}

 protected:
  struct Block {
    enum class Kind { kNeedMore, kCalls, kNotCalls };
    Kind kind = Kind::kNeedMore;
    // kCalls: the bytes after the marker the calls took. kNotCalls: the bytes after the
    // marker that are content with it (0: the text after the marker is read again as text).
    size_t length = 0;
    std::vector<Call> calls;
  };

  // A new block starts after a marker.
  virtual void BeginBlock() = 0;
  // Reads the block after the marker (`block`, the same text as before, maybe longer);
  // never kNeedMore when `final`.
  virtual Block ContinueBlock(std::string_view block, bool final) = 0;

  size_t Run(bool final) final {
    const std::string_view in = input();
    size_t pos = 0;
    while (true) {
      const std::string_view rest = in.substr(pos);
      if (in_block_) {
        Block block = ContinueBlock(rest, final);
        if (block.kind == Block::Kind::kNeedMore) return pos;
        in_block_ = false;
        if (block.kind == Block::Kind::kCalls && CanAddCalls(block.calls.size())) {
          for (Call& call : block.calls) EmitCall(std::move(call));
          after_call_ = true;
        } else {
          EmitContent(marker_);
          EmitContent(rest.substr(0, block.length));
        }
        pos += block.length;
        continue;
      }
      if (after_call_) {
        // Whitespace after a call: dropped before another call or the end.
        const size_t spaces = SkipSpaces(rest, 0);
        const std::string_view next = rest.substr(spaces);
        const bool droppable = spaces <= kMaxDroppedWhitespace;
        if (droppable && next.empty()) return final ? in.size() : pos;
        if (droppable && next.starts_with(marker_)) {
          pos += spaces;
          after_call_ = false;
          continue;
        }
        if (droppable && !final && marker_.starts_with(next)) return pos;
        after_call_ = false;  // The whitespace is content.
      }
      const size_t found = rest.find(marker_);
      if (found == std::string_view::npos) {
        const size_t held = final ? 0 : PartialMarkerSuffix(rest, marker_);
        EmitContent(rest.substr(0, rest.size() - held));
        return in.size() - held;
      }
      EmitContent(rest.substr(0, found));
      pos += found + marker_.size();
      if (!CanAddCalls(1)) {
        EmitContent(marker_);
        continue;
      }
      in_block_ = true;
      BeginBlock();
    }
  }

 private:
  std::string_view marker_;
  bool in_block_ = false;
  bool after_call_ = false;
};

// Qwen2.5 / Hermes: <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>. The block ends
// after its JSON's closing bracket and the tag; where that does not hold (no JSON, something
// after it), at the first "</tool_call>", and is content.
class HermesParser final : public MarkerParser {
 public:
  HermesParser(ToolCallIdSource id_source, const ToolCallLimits& limits)
      : MarkerParser(kHermesOpen, std::move(id_source), limits, 24, "call_") {}

 private:
  void BeginBlock() override {
    searched_ = 0;
    by_tag_ = false;
    extent_ = JsonExtent();
  }

  Block ContinueBlock(std::string_view block, bool final) override {
    // The JSON's own extent first, so that a "</tool_call>" inside its strings is no end.
    if (!by_tag_) {
      const size_t start = SkipSpaces(block, 0);
      const bool droppable = start <= kMaxDroppedWhitespace;
      if (droppable && start == block.size() && !final) return {};
      switch (droppable ? extent_.Scan(block.substr(start), limits().max_call_bytes,
                                       limits().max_json_depth)
                        : JsonExtent::State::kInvalid) {
        case JsonExtent::State::kNeedMore:
          if (!final) return {};
          return {Block::Kind::kNotCalls, block.size(), {}};
        case JsonExtent::State::kInvalid:
          by_tag_ = true;
          break;
        case JsonExtent::State::kClosed: {
          const size_t json_end = start + extent_.end();
          const size_t after = SkipSpaces(block, json_end);
          const std::string_view tail = block.substr(after);
          const bool near = after - json_end <= kMaxDroppedWhitespace;
          if (near && tail.starts_with(kHermesClose)) {
            return Read(block.substr(0, json_end), after + kHermesClose.size());
          }
          if (near && !final && kHermesClose.starts_with(tail)) return {};
          // Unclosed at the end (a stop sequence may cut the tag): a call all the same.
          if (near && final && tail.empty()) return Read(block, block.size());
          by_tag_ = true;  // Something else after the JSON: read up to the closing tag.
          break;
        }
      }
    }
    // The closing tag must start within max_call_bytes.
    const size_t window = std::min(block.size(), limits().max_call_bytes + kHermesClose.size());
    const size_t from = searched_ > kHermesClose.size() ? searched_ - kHermesClose.size() : 0;
    const size_t close = block.substr(0, window).find(kHermesClose, from);
    searched_ = window;
    if (close != std::string_view::npos) {
      return Read(block.substr(0, close), close + kHermesClose.size());
    }
    if (window == limits().max_call_bytes + kHermesClose.size()) {
      return {Block::Kind::kNotCalls, 0, {}};  // Too long: the marker is content.
    }
    if (!final) return {};
    return {Block::Kind::kNotCalls, block.size(), {}};
  }

  // The call the block's `body` holds; the block takes `length` bytes.
  Block Read(std::string_view body, size_t length) const {
    const size_t start = SkipSpaces(body, 0);
    size_t end = body.size();
    while (end > start && IsSpace(body[end - 1])) --end;
    if (std::optional<Json> value = ParseJson(body.substr(start, end - start), json_limits())) {
      if (std::optional<Call> call = CallFromJson(*value, json_limits())) {
        return {Block::Kind::kCalls, length, {*std::move(call)}};
      }
    }
    return {Block::Kind::kNotCalls, length, {}};
  }

  bool by_tag_ = false;  // The block is read up to "</tool_call>", not by its JSON.
  JsonExtent extent_;
  size_t searched_ = 0;
};

// Mistral: [TOOL_CALLS][{"name": …, "arguments": {…}}, …] (a lone object accepted too), or
// [TOOL_CALLS]name[ARGS]{…}.
class MistralParser final : public MarkerParser {
 public:
  MistralParser(ToolCallIdSource id_source, const ToolCallLimits& limits)
      : MarkerParser(kMistralMarker, std::move(id_source), limits, 9, "") {}

 private:
  void BeginBlock() override {
    extent_ = JsonExtent();
    json_start_ = std::string_view::npos;
    named_ = false;
  }

  Block ContinueBlock(std::string_view block, bool final) override {
    static const Block kNotCalls{Block::Kind::kNotCalls, 0, {}};
    if (json_start_ == std::string_view::npos) {
      // Mistral's tokenizer often puts a space after the marker.
      const size_t start = SkipSpaces(block, 0);
      if (start > kMaxDroppedWhitespace) return kNotCalls;
      if (start == block.size()) return final ? kNotCalls : Block{};
      if (block[start] == '[' || block[start] == '{') {
        json_start_ = start;
      } else {
        // name[ARGS]{…}
        size_t end = start;
        while (end < block.size() && end - start <= kMaxNameBytes && IsNameChar(block[end])) ++end;
        if (end == start || end - start > kMaxNameBytes) return kNotCalls;
        const std::string_view after = block.substr(end);
        if (after.starts_with(kMistralArgs)) {
          name_ = std::string(block.substr(start, end - start));
          json_start_ = end + kMistralArgs.size();
          named_ = true;
        } else if (!final && kMistralArgs.starts_with(after)) {
          return {};
        } else {
          return kNotCalls;
        }
      }
    }
    const std::string_view json = block.substr(json_start_);
    switch (extent_.Scan(json, limits().max_call_bytes, limits().max_json_depth)) {
      case JsonExtent::State::kNeedMore:
        return final ? kNotCalls : Block{};
      case JsonExtent::State::kInvalid:
        return kNotCalls;
      case JsonExtent::State::kClosed:
        break;
    }
    const size_t length = json_start_ + extent_.end();
    const std::optional<Json> value = ParseJson(json.substr(0, extent_.end()), json_limits());
    if (!value.has_value()) return {Block::Kind::kNotCalls, length, {}};
    std::vector<Call> calls;
    if (named_) {  // name[ARGS]{…}
      if (!value->is_object()) return {Block::Kind::kNotCalls, length, {}};
      calls.push_back({name_, CompactJson(*value)});
    } else if (value->is_array()) {
      if (value->empty()) return {Block::Kind::kNotCalls, length, {}};
      for (const Json& element : *value) {
        std::optional<Call> call = CallFromJson(element, json_limits());
        if (!call.has_value()) return {Block::Kind::kNotCalls, length, {}};
        calls.push_back(*std::move(call));
      }
    } else {
      std::optional<Call> call = CallFromJson(*value, json_limits());
      if (!call.has_value()) return {Block::Kind::kNotCalls, length, {}};
      calls.push_back(*std::move(call));
    }
    return {Block::Kind::kCalls, length, std::move(calls)};
  }

  JsonExtent extent_;
  size_t json_start_ = std::string_view::npos;  // Where the JSON starts in the block.
  bool named_ = false;                          // The name[ARGS]{…} form.
  std::string name_;
};

// Llama 3.x JSON: the output is calls, `{"name": …, "parameters": {…}}`, optionally after
// <|python_tag|>, separated by ';' or whitespace; or it is content. Once something other
// than a call appears, the rest of the output is content (what came before it stays calls).
class Llama3JsonParser final : public ParserBase {
 public:
  Llama3JsonParser(ToolCallIdSource id_source, const ToolCallLimits& limits)
      : ParserBase(std::move(id_source), limits, 24, "call_") {}

 private:
  enum class State {
    kStart,    // Before anything but whitespace.
    kBetween,  // After a call: separators, then another call or the end.
    kObject,   // In a call's JSON, which starts `lead_` bytes into the input.
    kContent,  // The rest is content.
  };

  size_t Run(bool final) override {
    const std::string_view in = input();
    size_t pos = 0;
    while (true) {
      const std::string_view rest = in.substr(pos);
      switch (state_) {
        case State::kStart: {
          const size_t start = SkipSpaces(rest, 0);
          const std::string_view text = rest.substr(start);
          const bool droppable = start <= kMaxDroppedWhitespace;
          if (droppable && text.starts_with(kPythonTag)) {
            const size_t object = SkipSpaces(rest, start + kPythonTag.size());
            if (object > start + kPythonTag.size() + kMaxDroppedWhitespace) {
              state_ = State::kContent;
              break;
            }
            if (object == rest.size() && !final) return pos;
            StartObject(object);
          } else if (droppable && text.starts_with("{")) {
            StartObject(start);
          } else if (droppable && !final && kPythonTag.starts_with(text)) {
            return pos;  // Whitespace so far, or the tag's first bytes.
          } else {
            state_ = State::kContent;
          }
          break;
        }
        case State::kBetween: {
          size_t next = 0;
          while (next < rest.size() && (IsSpace(rest[next]) || rest[next] == ';')) ++next;
          const bool droppable = next <= kMaxDroppedWhitespace;
          // Separators at the end are dropped.
          if (droppable && next == rest.size()) return final ? in.size() : pos;
          if (droppable && rest[next] == '{' && CanAddCalls(1)) {
            StartObject(next);
          } else {
            state_ = State::kContent;
          }
          break;
        }
        case State::kObject: {
          const std::string_view json = rest.substr(lead_);
          const JsonExtent::State scanned =
              extent_.Scan(json, limits().max_call_bytes, limits().max_json_depth);
          if (scanned == JsonExtent::State::kNeedMore && !final) return pos;
          std::optional<Call> call;
          if (scanned == JsonExtent::State::kClosed) {
            if (std::optional<Json> value =
                    ParseJson(json.substr(0, extent_.end()), json_limits())) {
              call = CallFromJson(*value, json_limits());
            }
          }
          if (!call.has_value()) {
            state_ = State::kContent;
            break;
          }
          EmitCall(*std::move(call));
          pos += lead_ + extent_.end();
          state_ = State::kBetween;
          break;
        }
        case State::kContent:
          EmitContent(rest);
          return in.size();
      }
    }
  }

  void StartObject(size_t lead) {
    state_ = State::kObject;
    lead_ = lead;
    extent_ = JsonExtent();
  }

  State state_ = State::kStart;
  size_t lead_ = 0;
  JsonExtent extent_;
};

// Grammar text --------------------------------------------------------------------------

// A grammar literal of `text`.
std::string GrammarLiteral(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\' || c == '"') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

bool IsGrammarNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// `grammar` (grammar.h's form) with `prefix` put before every rule name, defined or used,
// so that several compiled schemas can share one grammar. Literals, character classes,
// repetition counts and comments are copied as they are.
std::string PrefixRuleNames(std::string_view grammar, std::string_view prefix) {
  std::string out;
  out.reserve(grammar.size() * 5 / 4);
  size_t i = 0;
  while (i < grammar.size()) {
    const char c = grammar[i];
    if (c == '"' || c == '[' || c == '{') {
      const char close = c == '"' ? '"' : c == '[' ? ']' : '}';
      const size_t start = i++;
      while (i < grammar.size() && grammar[i] != close) i += grammar[i] == '\\' ? 2 : 1;
      i = std::min(i + 1, grammar.size());
      out.append(grammar.substr(start, i - start));
    } else if (c == '#') {
      const size_t end = std::min(grammar.find('\n', i), grammar.size());
      out.append(grammar.substr(i, end - i));
      i = end;
    } else if (IsGrammarNameChar(c)) {
      const size_t start = i;
      while (i < grammar.size() && IsGrammarNameChar(grammar[i])) ++i;
      out.append(prefix);
      out.append(grammar.substr(start, i - start));
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

struct ToolSyntax {
  const char* arguments_key;  // "parameters" or "arguments".
  const char* call_open;      // Before the call's object.
  const char* call_close;     // After it.
  const char* output_open;    // Before the calls.
  const char* separator;      // Between calls.
  const char* output_close;   // After the calls.
};

ToolSyntax SyntaxOf(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return {"parameters", "", "", "", "; ", ""};
    case ToolCallFormat::kHermes:
      return {"arguments", "<tool_call>\n", "\n</tool_call>", "", "\n", ""};
    case ToolCallFormat::kMistral:
      return {"arguments", "", "", "[TOOL_CALLS][", ", ", "]"};
  }
  return {};
}

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "unknown";
}

absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name) {
  for (const ToolCallFormat format :
       {ToolCallFormat::kLlama3Json, ToolCallFormat::kHermes, ToolCallFormat::kMistral}) {
    if (name == ToolCallFormatName(format)) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown tool call format \"", TextExcerpt(name),
                                                 "\" (llama3_json, hermes or mistral)"));
}

absl::StatusOr<ToolCallFormat> GuessToolCallFormat(std::string_view chat_template) {
  if (chat_template.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (chat_template.find(kMistralMarker) != std::string_view::npos) {
    return ToolCallFormat::kMistral;
  }
  if (chat_template.find(kPythonTag) != std::string_view::npos ||
      (chat_template.find("<|start_header_id|>") != std::string_view::npos &&
       chat_template.find("tools") != std::string_view::npos)) {
    return ToolCallFormat::kLlama3Json;
  }
  return absl::NotFoundError(
      "the chat template shows no tool call format (no <tool_call>, [TOOL_CALLS] or "
      "<|python_tag|>); name one with --tool_call_format");
}

ToolCallIdSource RandomToolCallIdSource() {
  auto engine = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [engine] { return (*engine)(); };
}

void ParsedToolCalls::Append(const ToolCallStreamDelta& delta) {
  content += delta.content;
  for (const ToolCallDelta& call : delta.tool_calls) {
    if (call.index < 0) continue;
    if (static_cast<size_t>(call.index) >= tool_calls.size()) tool_calls.resize(call.index + 1);
    ParsedToolCall& to = tool_calls[call.index];
    to.id += call.id;
    to.name += call.name;
    to.arguments += call.arguments;
  }
}

std::unique_ptr<ToolCallParser> MakeToolCallParser(ToolCallFormat format,
                                                   ToolCallIdSource id_source,
                                                   const ToolCallLimits& limits) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return std::make_unique<Llama3JsonParser>(std::move(id_source), limits);
    case ToolCallFormat::kHermes:
      return std::make_unique<HermesParser>(std::move(id_source), limits);
    case ToolCallFormat::kMistral:
      return std::make_unique<MistralParser>(std::move(id_source), limits);
  }
  return nullptr;
}

ParsedToolCalls ParseToolCalls(ToolCallParser& parser, std::string_view text) {
  ParsedToolCalls result;
  result.Append(parser.Feed(text));
  result.Append(parser.Finish());
  return result;
}

absl::StatusOr<std::string> ToolCallGrammar(ToolCallFormat format, const Json& tools,
                                            std::string_view function_name,
                                            bool parallel_tool_calls) {
  if (!tools.is_array() || tools.empty()) {
    return absl::InvalidArgumentError("`tools` must be a non-empty array");
  }
  const ToolSyntax syntax = SyntaxOf(format);
  std::vector<std::string> alternatives;
  std::string rules;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string path = absl::StrCat("tools[", i, "]");
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, " must have a `function` object"));
    }
    const Json& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".function.name must be a string"));
    }
    const std::string& name = function["name"].get_ref<const std::string&>();
    if (!function_name.empty() && name != function_name) continue;
    const Json parameters =
        function.contains("parameters") ? function["parameters"] : Json{{"type", "object"}};
    absl::StatusOr<std::string> schema = grammar::JsonSchemaToGrammar(parameters);
    if (!schema.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ".function.parameters (\"", TextExcerpt(name), "\"): ", schema.status().message()));
    }
    const std::string prefix = absl::StrCat("t", i, "-");
    absl::StrAppend(&rules, PrefixRuleNames(*schema, prefix));
    // The call as the template writes it: {"name": "f", "<key>": <arguments>}.
    const std::string head = absl::StrCat(syntax.call_open, "{\"name\": ", CompactJson(Json(name)),
                                          ", \"", syntax.arguments_key, "\": ");
    alternatives.push_back(absl::StrCat(GrammarLiteral(head), " ", prefix, "root ",
                                        GrammarLiteral(absl::StrCat("}", syntax.call_close))));
  }
  if (alternatives.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tool_choice names function \"",
                                                   TextExcerpt(function_name),
                                                   "\", which is not among the tools"));
  }
  std::string out = absl::StrCat("root ::= ", GrammarLiteral(syntax.output_open), " call ");
  if (parallel_tool_calls)
    absl::StrAppend(&out, "( ", GrammarLiteral(syntax.separator), " call )* ");
  absl::StrAppend(&out, GrammarLiteral(syntax.output_close),
                  "\ncall ::= ", absl::StrJoin(alternatives, " | "), "\n", rules);
  return out;
}

}  // namespace conveyor::scheduler::openai
