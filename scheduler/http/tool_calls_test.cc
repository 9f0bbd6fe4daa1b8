#include "scheduler/http/tool_calls.h"

#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/test_util.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler::openai {

// For readable failures.
void PrintTo(const ParsedToolCalls& parsed, std::ostream* out) {
  *out << "content: " << ::testing::PrintToString(parsed.content);
  for (const ParsedToolCall& call : parsed.tool_calls) {
    *out << "; call " << call.id << " " << ::testing::PrintToString(call.name) << " "
         << call.arguments;
  }
}

namespace {

using Json = nlohmann::ordered_json;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::SizeIs;

constexpr ToolCallFormat kFormats[] = {ToolCallFormat::kLlama3Json, ToolCallFormat::kHermes,
                                       ToolCallFormat::kMistral};

ToolCallIdSource SeededIds(uint64_t seed = 7) {
  auto engine = std::make_shared<std::mt19937_64>(seed);
  return [engine] { return (*engine)(); };
}

ParsedToolCalls Whole(ToolCallFormat format, std::string_view text,
                      const ToolCallLimits& limits = {}) {
  std::unique_ptr<ToolCallParser> parser = MakeToolCallParser(format, SeededIds(), limits);
  return ParseToolCalls(*parser, text);
}

// `text` fed in the pieces that `cuts` (increasing offsets) make; checks that every content
// delta of well-formed text is well-formed, and that a second Finish adds nothing.
ParsedToolCalls Streamed(ToolCallFormat format, std::string_view text,
                         const std::vector<size_t>& cuts, const ToolCallLimits& limits = {}) {
  std::unique_ptr<ToolCallParser> parser = MakeToolCallParser(format, SeededIds(), limits);
  const bool well_formed = FindInvalidUtf8(text) == std::string_view::npos;
  ParsedToolCalls result;
  size_t from = 0;
  auto add = [&](const ToolCallStreamDelta& delta) {
    if (well_formed) {
      EXPECT_EQ(FindInvalidUtf8(delta.content), std::string_view::npos);
    }
    result.Append(delta);
  };
  for (size_t cut : cuts) {
    add(parser->Feed(text.substr(from, cut - from)));
    from = cut;
  }
  add(parser->Feed(text.substr(from)));
  add(parser->Finish());
  EXPECT_TRUE(parser->Finish().empty());
  return result;
}

// Byte by byte: every cut.
ParsedToolCalls ByteByByte(ToolCallFormat format, std::string_view text,
                           const ToolCallLimits& limits = {}) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);
  return Streamed(format, text, cuts, limits);
}

// Parses whole and byte by byte, expects the same, returns it.
ParsedToolCalls Parse(ToolCallFormat format, std::string_view text,
                      const ToolCallLimits& limits = {}) {
  ParsedToolCalls whole = Whole(format, text, limits);
  EXPECT_EQ(ByteByByte(format, text, limits), whole) << text;
  return whole;
}

auto Call(const std::string& name, const std::string& arguments) {
  return AllOf(Field(&ParsedToolCall::name, name), Field(&ParsedToolCall::arguments, arguments));
}

// Formats and their guesses --------------------------------------------------------------

TEST(ToolCallFormatTest, NamesRoundTrip) {
  for (ToolCallFormat format : kFormats) {
    EXPECT_EQ(*ToolCallFormatFromName(ToolCallFormatName(format)), format);
  }
  EXPECT_EQ(ToolCallFormatFromName("hermes2").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolCallFormatTest, GuessesFromTheTemplate) {
  EXPECT_EQ(*GuessToolCallFormat("{%- for tool in tools %}<tool_call>\n{{ tool }}</tool_call>"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(*GuessToolCallFormat("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(*GuessToolCallFormat("{{- '<|python_tag|>' + tool_call.name }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*GuessToolCallFormat("{%- if tools %}<|start_header_id|>user<|end_header_id|>"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(GuessToolCallFormat("<|start_header_id|>{{ message.content }}").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(GuessToolCallFormat("<|im_start|>{{ message.content }}").status().code(),
            absl::StatusCode::kNotFound);
}

// Hermes -----------------------------------------------------------------------------------

TEST(HermesTest, OneCallWithTextBefore) {
  const ParsedToolCalls out = Parse(ToolCallFormat::kHermes,
                                    "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", "
                                    "\"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n"
                                    "</tool_call>");
  EXPECT_EQ(out.content, "Let me look.\n");
  ASSERT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris","days":3})")));
  EXPECT_TRUE(out.tool_calls[0].id.starts_with("call_"));
  EXPECT_THAT(out.tool_calls[0].id, SizeIs(29));
}

TEST(HermesTest, ParallelCallsDropTheWhitespaceBetween) {
  const ParsedToolCalls out = Parse(ToolCallFormat::kHermes,
                                    "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
                                    "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": "
                                    "{\"x\": [1, 2.5, null]}}\n</tool_call>\n");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("a", "{}"), Call("b", R"({"x":[1,2.5,null]})")));
  EXPECT_NE(out.tool_calls[0].id, out.tool_calls[1].id);
}

TEST(HermesTest, TextAfterACallIsContent) {
  const ParsedToolCalls out = Parse(
      ToolCallFormat::kHermes,
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}}</tool_call>\n\nDone. <tool");
  EXPECT_EQ(out.content, "\n\nDone. <tool");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("a", R"({"k":"v"})")));
}

TEST(HermesTest, InvalidCallsAreContent) {
  for (const std::string text : {
           "<tool_call>\n{\"name\": \"a\", \"arguments\": {}\n</tool_call>",  // Bad JSON.
           "<tool_call>\n{\"function\": \"a\"}\n</tool_call>",                // No name.
           "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",  // Empty name.
           "<tool_call>\n{\"name\": \"a\", \"arguments\": [1]}\n</tool_call>",
           "<tool_call>\n[1, 2]\n</tool_call>",
           "<tool_call>\n{\"name\": \"a\", \"arguments\": {}} and </tool_call>",
           "<tool_call>\nfoo</tool_call>",
           "<tool_call>\n{\"name\": \"a\", \"arg",  // Cut at the end.
           "text <tool_call",
       }) {
    const ParsedToolCalls out = Parse(ToolCallFormat::kHermes, text);
    EXPECT_EQ(out.content, text);
    EXPECT_THAT(out.tool_calls, SizeIs(0)) << text;
  }
}

TEST(HermesTest, TheClosingTagInsideAStringIsNoEnd) {
  const ParsedToolCalls out =
      Parse(ToolCallFormat::kHermes,
            "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"</tool_call>\"}}\n"
            "</tool_call>");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("write", R"({"text":"</tool_call>"})")));
}

TEST(HermesTest, AnUnclosedCallWithWholeJsonIsACall) {
  const ParsedToolCalls out = Parse(ToolCallFormat::kHermes,
                                    "<tool_call>\n{\"name\": \"a\", \"parameters\": {\"q\": 1}}\n");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("a", R"({"q":1})")));
}

TEST(HermesTest, ArgumentsGivenAsAJsonStringAreParsed) {
  const ParsedToolCalls out =
      Parse(ToolCallFormat::kHermes,
            "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("a", R"({"q":1})")));
}

TEST(HermesTest, UnicodeInArgumentsIsKept) {
  const ParsedToolCalls out = Parse(
      ToolCallFormat::kHermes,
      "é<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": \"中文 \\u00e9 😀\"}}</tool_call>");
  EXPECT_EQ(out.content, "é");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("a", "{\"q\":\"中文 é 😀\"}")));
}

// Llama 3 ----------------------------------------------------------------------------------

TEST(Llama3JsonTest, ACall) {
  const ParsedToolCalls out =
      Parse(ToolCallFormat::kLlama3Json,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_THAT(out.tool_calls[0].id, SizeIs(29));
}

TEST(Llama3JsonTest, PythonTagAndArgumentsKey) {
  const ParsedToolCalls out = Parse(ToolCallFormat::kLlama3Json,
                                    " <|python_tag|>{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("f", R"({"a":1})")));
}

TEST(Llama3JsonTest, SeveralCallsBySemicolonOrNewline) {
  const ParsedToolCalls out = Parse(ToolCallFormat::kLlama3Json,
                                    "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", "
                                    "\"parameters\": {\"b\": true}}\n{\"name\": \"h\", "
                                    "\"parameters\": {}};\n");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls,
              ElementsAre(Call("f", "{}"), Call("g", R"({"b":true})"), Call("h", "{}")));
}

TEST(Llama3JsonTest, TextIsContent) {
  for (const std::string text : {
           "The weather is {\"name\": \"f\", \"parameters\": {}}",
           "{\"answer\": 42}",                      // JSON, not a call.
           "{\"name\": \"f\", \"parameters\": 3}",  // Not an object.
           "{\"name\": \"f\", \"parameters\": {}",  // Unclosed.
           "<|python_tag|>print(1)",
           "<|python_",
           "  \n ",
       }) {
    const ParsedToolCalls out = Parse(ToolCallFormat::kLlama3Json, text);
    EXPECT_EQ(out.content, text);
    EXPECT_THAT(out.tool_calls, SizeIs(0)) << text;
  }
}

TEST(Llama3JsonTest, TextAfterCallsIsContent) {
  const ParsedToolCalls out = Parse(ToolCallFormat::kLlama3Json,
                                    "{\"name\": \"f\", \"parameters\": {}};\n That was it; "
                                    "{\"name\": \"g\", \"parameters\": {}}");
  EXPECT_EQ(out.content, ";\n That was it; {\"name\": \"g\", \"parameters\": {}}");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("f", "{}")));
}

// Mistral ------------------------------------------------------------------------------------

TEST(MistralTest, ArrayOfCalls) {
  const ParsedToolCalls out =
      Parse(ToolCallFormat::kMistral,
            "Sure.[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": \"]\"}}, {\"name\": "
            "\"g\", \"arguments\": {}}]");
  EXPECT_EQ(out.content, "Sure.");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("f", R"({"x":"]"})"), Call("g", "{}")));
  for (const ParsedToolCall& call : out.tool_calls) {
    EXPECT_THAT(call.id, SizeIs(9));
    EXPECT_TRUE(std::all_of(call.id.begin(), call.id.end(), [](char c) { return isalnum(c); }));
  }
}

TEST(MistralTest, NameArgsForm) {
  const ParsedToolCalls out =
      Parse(ToolCallFormat::kMistral,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]f.g-1[ARGS]{}\n");
  EXPECT_EQ(out.content, "");
  EXPECT_THAT(out.tool_calls,
              ElementsAre(Call("get_weather", R"({"city":"Paris"})"), Call("f.g-1", "{}")));
}

TEST(MistralTest, InvalidCallsAreContent) {
  for (const std::string text : {
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, 3]",
           "[TOOL_CALLS][]",
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}",
           "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}}]",
           "[TOOL_CALLS]f[ARGS][1]",
           "[TOOL_CALLS]f [ARGS]{}",
           "[TOOL_CALLS]",
           "a [TOOL_CALL",
       }) {
    const ParsedToolCalls out = Parse(ToolCallFormat::kMistral, text);
    EXPECT_EQ(out.content, text);
    EXPECT_THAT(out.tool_calls, SizeIs(0)) << text;
  }
}

// Bounds -------------------------------------------------------------------------------------

TEST(ToolCallLimitsTest, CallsPastTheLimitAreContent) {
  ToolCallLimits limits;
  limits.max_calls = 2;
  const std::string call = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
  const ParsedToolCalls out = Parse(ToolCallFormat::kHermes, call + call + call, limits);
  EXPECT_THAT(out.tool_calls, SizeIs(2));
  EXPECT_EQ(out.content, call);

  const ParsedToolCalls mistral =
      Parse(ToolCallFormat::kMistral,
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"f\", \"arguments\": "
            "{}}, {\"name\": \"f\", \"arguments\": {}}]",
            limits);
  EXPECT_THAT(mistral.tool_calls, SizeIs(0));

  const ParsedToolCalls llama = Parse(ToolCallFormat::kLlama3Json,
                                      "{\"name\": \"f\", \"parameters\": {}};{\"name\": \"f\", "
                                      "\"parameters\": {}};{\"name\": \"f\", \"parameters\": {}}",
                                      limits);
  EXPECT_THAT(llama.tool_calls, SizeIs(2));
  EXPECT_EQ(llama.content, ";{\"name\": \"f\", \"parameters\": {}}");
}

TEST(ToolCallLimitsTest, LongCallsAreContentAndLittleIsHeld) {
  ToolCallLimits limits;
  limits.max_call_bytes = 100;
  const std::string long_call =
      absl::StrCat("{\"name\": \"a\", \"arguments\": {\"s\": \"", std::string(200, 'x'), "\"}}");
  for (ToolCallFormat format : kFormats) {
    const std::string text =
        format == ToolCallFormat::kHermes ? absl::StrCat("<tool_call>", long_call, "</tool_call>")
        : format == ToolCallFormat::kMistral ? absl::StrCat("[TOOL_CALLS][", long_call, "]")
                                             : long_call;
    const ParsedToolCalls out = Parse(format, text, limits);
    EXPECT_EQ(out.content, text);
    EXPECT_THAT(out.tool_calls, SizeIs(0));
    std::unique_ptr<ToolCallParser> parser = MakeToolCallParser(format, SeededIds(), limits);
    for (char c : text) {
      parser->Feed(std::string_view(&c, 1));
      EXPECT_LE(parser->held_bytes(), limits.max_call_bytes + 32);
    }
  }
  // Within the bound, the same call parses.
  limits.max_call_bytes = 1000;
  EXPECT_THAT(Parse(ToolCallFormat::kLlama3Json, long_call, limits).tool_calls, SizeIs(1));
}

TEST(ToolCallLimitsTest, DeepJsonIsContent) {
  std::string deep = "{\"name\": \"a\", \"arguments\": {\"x\": ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "}}";
  EXPECT_EQ(Parse(ToolCallFormat::kLlama3Json, deep).content, deep);
  EXPECT_EQ(Parse(ToolCallFormat::kMistral, "[TOOL_CALLS]" + deep).content, "[TOOL_CALLS]" + deep);
  const std::string hermes = "<tool_call>" + deep + "</tool_call>";
  EXPECT_EQ(Parse(ToolCallFormat::kHermes, hermes).content, hermes);
}

// Streaming ----------------------------------------------------------------------------------

TEST(ToolCallStreamTest, ContentStreamsBeforeTheOutputEnds) {
  std::unique_ptr<ToolCallParser> parser = MakeToolCallParser(ToolCallFormat::kHermes, SeededIds());
  EXPECT_EQ(parser->Feed("Hello <to").content, "Hello ");
  EXPECT_EQ(parser->Feed("day").content, "<today");
  EXPECT_EQ(parser->Feed("\xE4\xB8").content, "");  // Half a character is held.
  EXPECT_EQ(parser->Feed("\xAD<tool_call>{\"name\": \"f\", ").content, "中");
  const ToolCallStreamDelta call = parser->Feed("\"arguments\": {}}</tool_call>");
  ASSERT_THAT(call.tool_calls, SizeIs(1));
  EXPECT_EQ(call.tool_calls[0].index, 0);
  EXPECT_EQ(call.tool_calls[0].name, "f");
  EXPECT_EQ(call.tool_calls[0].arguments, "{}");
  EXPECT_TRUE(parser->Finish().empty());
}

// Random outputs of each format: content with pieces of markers and JSON around calls, some
// of them broken; each cut at random places (inside characters and markers too) must give
// what the whole does.
class OutputGenerator {
 public:
  explicit OutputGenerator(uint32_t seed) : rng_(seed) {}

  std::string Output(ToolCallFormat format) {
    std::string out;
    const int pieces = Uniform(0, 5);
    if (format == ToolCallFormat::kLlama3Json && Uniform(0, 3) > 0) {
      // Mostly calls from the start, as Llama writes them.
      if (Uniform(0, 1)) out += Pick({"<|python_tag|>", " ", "\n", ""});
      for (int i = 0; i < pieces; ++i) {
        if (i > 0) out += Pick({";", "; ", "\n", " ;\n", ""});
        out += Uniform(0, 6) == 0 ? Text() : MaybeBroken(CallObject("parameters"));
      }
      return out;
    }
    for (int i = 0; i < pieces; ++i) {
      if (Uniform(0, 2) == 0) {
        out += Text();
        continue;
      }
      switch (format) {
        case ToolCallFormat::kHermes:
          out +=
              MaybeBroken(absl::StrCat("<tool_call>", Pick({"\n", "", " "}),
                                       CallObject("arguments"), Pick({"\n", ""}), "</tool_call>"));
          out += Pick({"\n", "", " \n"});
          break;
        case ToolCallFormat::kMistral:
          if (Uniform(0, 1)) {
            std::string calls = CallObject("arguments");
            for (int n = Uniform(0, 2); n > 0; --n)
              absl::StrAppend(&calls, ", ", CallObject("arguments"));
            out += MaybeBroken(absl::StrCat("[TOOL_CALLS]", Pick({"", " "}), "[", calls, "]"));
          } else {
            out += MaybeBroken(absl::StrCat("[TOOL_CALLS]", Name(), "[ARGS]", Arguments()));
          }
          break;
        case ToolCallFormat::kLlama3Json:
          out += MaybeBroken(CallObject("parameters"));
          break;
      }
    }
    return out;
  }

  // Increasing cut offsets in [1, size).
  std::vector<size_t> Cuts(size_t size) {
    std::vector<size_t> cuts;
    if (size < 2) return cuts;
    const int n = Uniform(0, static_cast<int>(std::min<size_t>(size, 40)));
    for (int i = 0; i < n; ++i) cuts.push_back(Uniform(1, static_cast<int>(size) - 1));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    return cuts;
  }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::string Pick(std::initializer_list<const char*> options) {
    return *(options.begin() + Uniform(0, static_cast<int>(options.size()) - 1));
  }

  std::string Text() {
    std::string out;
    for (int n = Uniform(1, 6); n > 0; --n) {
      out += Pick({"Sure",       " ",
                   "\n",         "é",
                   "中文",       "😀",
                   "<",          "<tool",
                   "<tool_call", "</tool_call>",
                   "[TOOL",      "[TOOL_CALLS",
                   "[ARGS]",     "<|python",
                   "{",          "}",
                   "[",          "]",
                   "\"",         ";",
                   "\\",         "name",
                   "{\"a\": 1}", "<|python_tag|>"});
    }
    return out;
  }

  std::string Name() { return Pick({"get_weather", "f", "search.web", "a-b_c", "x1"}); }

  Json Value(int depth) {
    switch (Uniform(0, depth > 2 ? 3 : 5)) {
      case 0:
        return Uniform(-1000, 1000);
      case 1:
        return Pick({"", "Paris", "a \"quoted\" ]} word", "é 中 😀", "\\", "</tool_call>"});
      case 2:
        return Uniform(0, 1) == 1;
      case 3:
        return nullptr;
      case 4: {
        Json array = Json::array();
        for (int n = Uniform(0, 3); n > 0; --n) array.push_back(Value(depth + 1));
        return array;
      }
      default: {
        Json object = Json::object();
        for (int n = Uniform(0, 3); n > 0; --n) object[Name()] = Value(depth + 1);
        return object;
      }
    }
  }

  std::string Arguments() {
    Json object = Json::object();
    for (int n = Uniform(0, 3); n > 0; --n) object[Pick({"city", "q", "n", "é"})] = Value(1);
    return Uniform(0, 1) ? object.dump() : object.dump(Uniform(0, 2));
  }

  std::string CallObject(const char* key) {
    const std::string name = Json(Name()).dump();
    return absl::StrCat("{\"name\": ", name, ", \"", key, "\": ", Arguments(), "}");
  }

  // `text`, or a copy cut short or with a byte dropped or changed.
  std::string MaybeBroken(std::string text) {
    if (text.empty() || Uniform(0, 5) > 0) return text;
    const size_t at = Uniform(0, static_cast<int>(text.size()) - 1);
    switch (Uniform(0, 2)) {
      case 0:
        return text.substr(0, at);
      case 1:
        return text.erase(at, 1);
      default:
        text[at] = "{}[]\",:x"[Uniform(0, 7)];
        return text;
    }
  }

  std::mt19937 rng_;
};

TEST(ToolCallStreamTest, AnySplitGivesTheWholeResult) {
  OutputGenerator generator(20240611);
  int calls = 0;
  int with_content = 0;
  for (int i = 0; i < 3000; ++i) {
    for (ToolCallFormat format : kFormats) {
      const std::string text = generator.Output(format);
      const ParsedToolCalls whole = Whole(format, text);
      calls += static_cast<int>(whole.tool_calls.size());
      with_content += whole.content.empty() ? 0 : 1;
      for (const ParsedToolCall& call : whole.tool_calls) {
        EXPECT_TRUE(Json::accept(call.arguments)) << call.arguments;
      }
      for (int split = 0; split < 3; ++split) {
        const std::vector<size_t> cuts = generator.Cuts(text.size());
        ASSERT_EQ(Streamed(format, text, cuts), whole)
            << ToolCallFormatName(format) << " on: " << text;
      }
      if (i % 10 == 0) {
        ASSERT_EQ(ByteByByte(format, text), whole) << text;
      }
    }
  }
  // The generator reaches both outcomes often.
  EXPECT_GT(calls, 5000);
  EXPECT_GT(with_content, 3000);
}

// Grammar ------------------------------------------------------------------------------------

Json WeatherTools() {
  return Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object",
      "properties": {"city": {"type": "string", "maxLength": 12},
                     "unit": {"enum": ["c", "f"]},
                     "days": {"type": "integer"}},
      "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "search \"web\"", "parameters": {
      "type": "object",
      "properties": {"q": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
      "required": ["q"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "now"}}
  ])");
}

TEST(ToolCallGrammarTest, EverySentenceParsesAsCallsOfTheTools) {
  const Json tools = WeatherTools();
  std::mt19937 rng(5);
  for (ToolCallFormat format : kFormats) {
    for (const bool parallel : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(std::string(ToolCallFormatName(format)), parallel ? " parallel" : ""));
      absl::StatusOr<std::string> text = ToolCallGrammar(format, tools, "", parallel);
      ASSERT_TRUE(text.ok()) << text.status();
      absl::StatusOr<grammar::Grammar> g = grammar::Grammar::Parse(*text);
      ASSERT_TRUE(g.ok()) << g.status() << "\n" << *text;
      int several = 0;
      for (int i = 0; i < 300; ++i) {
        std::optional<std::u32string> drawn = grammar::Draw(*g, rng, 400);
        if (!drawn.has_value()) continue;
        const std::string sentence = grammar::Utf8(*drawn);
        const ParsedToolCalls out = Whole(format, sentence);
        EXPECT_EQ(out.content, "") << sentence;
        ASSERT_THAT(out.tool_calls, ::testing::Not(::testing::IsEmpty())) << sentence;
        if (!parallel) {
          EXPECT_THAT(out.tool_calls, SizeIs(1)) << sentence;
        }
        several += out.tool_calls.size() > 1 ? 1 : 0;
        for (const ParsedToolCall& call : out.tool_calls) {
          EXPECT_THAT(call.name, ::testing::AnyOf("get_weather", "search \"web\"", "now"));
          const Json arguments = Json::parse(call.arguments);
          if (call.name == "get_weather") {
            EXPECT_TRUE(arguments.contains("city")) << sentence;
          }
        }
      }
      if (parallel) {
        EXPECT_GT(several, 10);
      }
    }
  }
}

TEST(ToolCallGrammarTest, ANamedFunctionOnly) {
  absl::StatusOr<std::string> text =
      ToolCallGrammar(ToolCallFormat::kHermes, WeatherTools(), "get_weather", false);
  ASSERT_TRUE(text.ok()) << text.status();
  auto g = std::make_shared<const grammar::Grammar>(*grammar::Grammar::Parse(*text));
  grammar::Matcher matcher(g);
  EXPECT_TRUE(matcher.Accept(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_TRUE(matcher.CanEnd());
  matcher.Reset();
  EXPECT_FALSE(matcher.Accept("<tool_call>\n{\"name\": \"now\""));
  matcher.Reset();
  EXPECT_FALSE(
      matcher.Accept("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}"));

  EXPECT_EQ(
      ToolCallGrammar(ToolCallFormat::kHermes, WeatherTools(), "missing", false).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ToolCallGrammarTest, TheFormatsExactSyntax) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}])");
  const std::pair<ToolCallFormat, std::string> cases[] = {
      {ToolCallFormat::kLlama3Json,
       "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"f\", "
       "\"parameters\": {}}"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
       "{}}\n</tool_call>"},
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, "
       "{\"name\": \"f\", \"arguments\": {}}]"},
  };
  for (const auto& [format, sentence] : cases) {
    for (const bool parallel : {false, true}) {
      auto g = std::make_shared<const grammar::Grammar>(
          *grammar::Grammar::Parse(*ToolCallGrammar(format, tools, "f", parallel)));
      grammar::Matcher matcher(g);
      EXPECT_EQ(matcher.Accept(sentence) && matcher.CanEnd(), parallel) << sentence;
    }
    EXPECT_THAT(Whole(format, sentence).tool_calls, SizeIs(2));
  }
}

TEST(ToolCallGrammarTest, BadToolsAreRefused) {
  EXPECT_EQ(ToolCallGrammar(ToolCallFormat::kHermes, Json::array(), "", false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ToolCallGrammar(ToolCallFormat::kHermes, Json::parse(R"([{"type": "function"}])"), "", false)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  const absl::Status bad_schema =
      ToolCallGrammar(ToolCallFormat::kHermes,
                      Json::parse(R"([{"type": "function", "function": {"name": "f",
                          "parameters": {"type": "object", "patternProperties": {}}}}])"),
                      "", false)
          .status();
  EXPECT_EQ(bad_schema.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_schema.message(), ::testing::HasSubstr("tools[0]"));
  EXPECT_THAT(bad_schema.message(), ::testing::HasSubstr("patternProperties"));
}

}  // namespace
}  // namespace conveyor::scheduler::openai
