// Unit tests for the chat template interpreter: parse errors and the lines they name,
// what the differential test (jinja_test.cc) cannot compare (strftime_now, templates
// jinja2 accepts but this interpreter refuses at load, list.pop), loading templates from
// a model directory, and the Python value formatting the rest relies on.
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/jinja/chat_template.h"
#include "text/jinja/text.h"
#include "text/jinja/value.h"

namespace conveyor::jinja {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<std::string> RenderSource(
    std::string_view source,
    const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(context);
}

std::string ParseError(std::string_view source) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Parse(source);
  EXPECT_FALSE(t.ok()) << "parsed: " << source;
  if (t.ok()) return "";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return absl::StrCat(t.status().message());
}

TEST(JinjaParseTest, ErrorsNameTheLine) {
  EXPECT_THAT(ParseError("a\nb\n{% frobnicate %}"),
              StartsWith("chat template line 3: unknown tag 'frobnicate'"));
  EXPECT_THAT(ParseError("\n{{ x|no_such_filter }}"),
              StartsWith("chat template line 2: no filter named 'no_such_filter'"));
  EXPECT_THAT(ParseError("\n\n\n{% if x is no_such_test %}{% endif %}"),
              StartsWith("chat template line 4: no test named 'no_such_test'"));
  EXPECT_THAT(
      ParseError("{% for m in messages %}\n{% if m %}\n{% endfor %}"),
      StartsWith("chat template line 3: unexpected '{% endfor %}' inside '{% if %}' from line 2"));
  EXPECT_THAT(ParseError("x\n{% if a %}\nno end"),
              AllOf(StartsWith("chat template line 3: unexpected end of template"),
                    HasSubstr("'{% if %}' from line 2")));
  EXPECT_THAT(ParseError("{% endif %}"), StartsWith("chat template line 1: unknown tag 'endif'"));
  EXPECT_THAT(ParseError("ok\n{{ 'unterminated }}"),
              StartsWith("chat template line 2: unterminated string"));
  EXPECT_THAT(ParseError("\n{{ 1 + }}"),
              StartsWith("chat template line 2: unexpected end of print statement"));
  EXPECT_THAT(ParseError("{{ a ! b }}"),
              StartsWith("chat template line 1: unexpected character '!'"));
  EXPECT_THAT(ParseError("{{ (1, 2 }}"),
              StartsWith("chat template line 1: unexpected '}', expected ')'"));
  EXPECT_THAT(ParseError("\n\n{# never closed"),
              StartsWith("chat template line 3: missing end of comment tag"));
  EXPECT_THAT(ParseError("{% macro m(a=1, b) %}{% endmacro %}"),
              HasSubstr("non-default argument follows default argument"));
  EXPECT_THAT(ParseError("{{ 99999999999999999999 }}"), HasSubstr("integer literal too large"));
}

TEST(JinjaParseTest, RefusesWhatItCannotRunAtLoad) {
  // jinja2 accepts these; this interpreter would fail on them later, so it fails now.
  EXPECT_THAT(ParseError("{% include 'x.jinja' %}"),
              HasSubstr("'{% include %}' tag is not supported"));
  EXPECT_THAT(ParseError("{% for x in y recursive %}{% endfor %}"),
              HasSubstr("recursive for loops are not supported"));
  EXPECT_THAT(ParseError("{{ x|urlize }}"), HasSubstr("no filter named 'urlize'"));
  EXPECT_THAT(ParseError("{{ f(*args) }}"), HasSubstr("*args and **kwargs"));
  EXPECT_THAT(ParseError("\n{% break %}"),
              StartsWith("chat template line 2: '{% break %}' outside a for loop"));
  EXPECT_THAT(ParseError("{% do x.append(1) %}"), HasSubstr("'{% do %}' tag is not supported"));
  EXPECT_EQ(ParseError("bad \xff utf-8"), "chat template is not valid UTF-8");
}

TEST(JinjaRenderTest, RenderErrorsNameTheLine) {
  const absl::StatusOr<std::string> out = RenderSource("line 1\n{% set x = 1 %}\n{{ x + 'a' }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "chat template line 3: unsupported operand type(s) for +: 'int' and 'str'");

  const absl::StatusOr<std::string> undefined = RenderSource(
      "\n\n{{ messages[0].content }}", {{"messages", nlohmann::ordered_json::array()}});
  ASSERT_FALSE(undefined.ok());
  EXPECT_EQ(undefined.status().message(), "chat template line 3: list object has no element 0");
}

TEST(JinjaRenderTest, RaiseExceptionMessageIsExact) {
  const absl::StatusOr<std::string> out = RenderSource(
      "a\n{% if true %}{{ raise_exception('Roles must alternate: ' ~ 2) }}{% endif %}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate: 2");
}

TEST(JinjaRenderTest, StrftimeNowIsTheLocalTime) {
  auto today = [] {
    const std::time_t now = std::time(nullptr);
    std::tm local;
    localtime_r(&now, &local);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%d %b %Y|%Y-%m-%d", &local);
    return std::string(buf);
  };
  const std::string before = today();
  const absl::StatusOr<std::string> out =
      RenderSource("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}");
  const std::string after = today();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(*out == before || *out == after) << *out;
  const absl::StatusOr<std::string> micros =
      RenderSource("{{ strftime_now('%f')|length }}{{ strftime_now('') }}");
  ASSERT_TRUE(micros.ok()) << micros.status();
  EXPECT_EQ(*micros, "6");
}

TEST(JinjaRenderTest, ListsAndDictsCannotBeMutated) {
  // jinja2 3.1.6 refuses pop and clear too (Debian's 3.1.2 did not).
  for (const char* source : {"{{ l.pop() }}", "{{ l.clear() }}", "{{ l.append(1) }}",
                             "{{ d.update({}) }}", "{{ d.setdefault('a', 1) }}"}) {
    const absl::StatusOr<std::string> out =
        RenderSource(source, {{"l", {1}}, {"d", nlohmann::ordered_json::object()}});
    ASSERT_FALSE(out.ok()) << source;
    EXPECT_THAT(out.status().message(), HasSubstr("object is unsafe.")) << source;
  }
}

TEST(JinjaRenderTest, GenerationBlocksRenderTheirBody) {
  EXPECT_EQ(*RenderSource("a{% generation %}[{{ 1 + 1 }}]{% endgeneration %}b"), "a[2]b");
}

TEST(JinjaRenderTest, SlicesCountCodePoints) {
  EXPECT_EQ(
      *RenderSource("{{ s[1:4] }}|{{ s[-2:] }}|{{ s[::-1] }}|{{ s|length }}|{{ s[4] }}{{ s[5] }}",
                    {{"s", "héllo🚀!"}}),
      "éll|🚀!|!🚀olléh|7|o🚀");
}

TEST(JinjaRenderTest, KeyOrderFollowsTheContext) {
  // ordered_json keeps the client's order, as Python does; nlohmann::json sorts keys.
  const auto t = ChatTemplate::Parse("{{ d|tojson }} {% for k in d %}{{ k }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->Render(nlohmann::ordered_json::parse(R"({"d": {"z": 1, "a": 2}})")),
            "{\"z\": 1, \"a\": 2} za");
  EXPECT_EQ(*(*t)->Render(nlohmann::json::parse(R"({"d": {"z": 1, "a": 2}})")),
            "{\"a\": 2, \"z\": 1} az");
}

TEST(JinjaRenderTest, ContextMustBeAnObject) {
  const auto t = ChatTemplate::Parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->Render(nlohmann::json::array()).ok());
}

TEST(JinjaRenderTest, RunawayTemplatesFailInsteadOfCrashing) {
  const absl::StatusOr<std::string> recursion =
      RenderSource("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(recursion.ok());
  EXPECT_THAT(recursion.status().message(), HasSubstr("maximum recursion depth"));
  EXPECT_THAT(RenderSource("{{ 'x' * 2000000000 }}").status().message(), HasSubstr("too large"));
  EXPECT_THAT(RenderSource("{{ 9223372036854775807 + 1 }}").status().message(),
              HasSubstr("integer overflow"));
  nlohmann::ordered_json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = nlohmann::ordered_json::array({deep});
  EXPECT_THAT(RenderSource("{{ d }}", {{"d", deep}}).status().message(),
              HasSubstr("nested too deeply"));
}

TEST(JinjaRenderTest, RendersConcurrently) {
  const auto t = ChatTemplate::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m|length %}{% "
      "endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  threads.reserve(8);
  std::vector<std::string> outputs(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      nlohmann::ordered_json context = {{"messages", nlohmann::ordered_json::array()}};
      for (int k = 0; k <= i; ++k) context["messages"].push_back("ab");
      for (int round = 0; round < 200; ++round) outputs[i] = *(*t)->Render(context);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(outputs[i], std::to_string(2 * (i + 1)));
}

// What `t` renders for an empty context ("" with the error when it fails).
std::string RenderEmpty(const std::unique_ptr<ChatTemplate>& t) {
  if (t == nullptr) return "(none)";
  absl::StatusOr<std::string> out = t->Render(nlohmann::json::object());
  return out.ok() ? *out : std::string(out.status().message());
}

TEST(JinjaLoadChatTemplateTest, ReadsTheTemplateFromTheTokenizerConfig) {
  TestTempDir dir;
  dir.WriteFile("tokenizer_config.json",
                R"({"chat_template": "{{ messages|length }}", "bos_token": "<s>"})");
  absl::StatusOr<ChatTemplates> t = LoadChatTemplates(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(t->chat, nullptr);
  EXPECT_EQ(*t->chat->Render(nlohmann::json{{"messages", {1, 2}}}), "2");
  EXPECT_EQ(t->tool_use, nullptr);
  EXPECT_TRUE(t->unused.empty());
}

TEST(JinjaLoadChatTemplateTest, ReadsDefaultAndToolUseOfSeveralTemplates) {
  TestTempDir dir;
  dir.WriteFile(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "rag", "template": "{% bad"}, {"name": "default", "template": "default"}]})");
  absl::StatusOr<ChatTemplates> t = LoadChatTemplates(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(RenderEmpty(t->chat), "default");
  EXPECT_EQ(RenderEmpty(t->tool_use), "tools");
  // Nothing chooses "rag", so it is listed, not parsed (its syntax error stops nothing).
  EXPECT_THAT(t->unused, ::testing::ElementsAre("rag"));

  TestTempDir no_default;
  no_default.WriteFile("tokenizer_config.json",
                       R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  EXPECT_THAT(LoadChatTemplates(no_default.path()).status().message(),
              HasSubstr("none is named default"));
  TestTempDir broken_tool_use;
  broken_tool_use.WriteFile(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "default", "template": "x"}, {"name": "tool_use", "template": "{{ x|bogus }}"}]})");
  EXPECT_THAT(LoadChatTemplates(broken_tool_use.path()).status().message(),
              HasSubstr("(template \"tool_use\"): chat template line 1: no filter named 'bogus'"));
  TestTempDir not_an_entry;
  not_an_entry.WriteFile("tokenizer_config.json",
                         R"({"chat_template": [{"name": "default", "template": 3}]})");
  EXPECT_THAT(LoadChatTemplates(not_an_entry.path()).status().message(),
              HasSubstr("each entry of the chat_template list must be"));
}

TEST(JinjaLoadChatTemplateTest, PrefersChatTemplateJinjaAndItsAdditionalTemplates) {
  TestTempDir dir;
  dir.WriteFile("tokenizer_config.json", R"({"chat_template": "from config"})");
  dir.WriteFile("chat_template.jinja", "from file\n");
  absl::StatusOr<ChatTemplates> t = LoadChatTemplates(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(RenderEmpty(t->chat), "from file");  // Trailing newline dropped.
  EXPECT_EQ(t->tool_use, nullptr);

  // transformers saves the named templates beside it, one file each.
  std::filesystem::create_directory(std::filesystem::path(dir.path()) /
                                    "additional_chat_templates");
  dir.WriteFile("additional_chat_templates/tool_use.jinja", "tool file\n");
  dir.WriteFile("additional_chat_templates/rag.jinja", "rag file");
  dir.WriteFile("additional_chat_templates/README", "not a template");
  t = LoadChatTemplates(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(RenderEmpty(t->chat), "from file");
  EXPECT_EQ(RenderEmpty(t->tool_use), "tool file");
  EXPECT_THAT(t->unused, ::testing::ElementsAre("rag"));
}

// A GGUF file of metadata strings only (version 3, no tensors).
void WriteGgufStrings(const TestTempDir& dir, const std::string& name,
                      const std::vector<std::pair<std::string, std::string>>& strings) {
  std::string out = "GGUF";
  const auto put = [&out](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  const auto put_string = [&](const std::string& text) {
    put(static_cast<uint64_t>(text.size()));
    out += text;
  };
  put(uint32_t{3});
  put(uint64_t{0});
  put(static_cast<uint64_t>(strings.size()));
  for (const auto& [key, value] : strings) {
    put_string(key);
    put(uint32_t{8});  // GGUF_TYPE_STRING
    put_string(value);
  }
  dir.WriteFile(name, out);
}

TEST(JinjaLoadChatTemplateTest, ReadsAGgufFilesNamedTemplates) {
  TestTempDir dir;
  WriteGgufStrings(dir, "m.gguf",
                   {{"general.architecture", "llama"},
                    {"tokenizer.chat_template", "gguf default"},
                    {"tokenizer.chat_templates", "not a template key"},
                    {"tokenizer.chat_template.tool_use", "gguf tools"},
                    {"tokenizer.chat_template.rag", "gguf rag"}});
  absl::StatusOr<ChatTemplates> t = LoadChatTemplates(dir.path() + "/m.gguf");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(RenderEmpty(t->chat), "gguf default");
  EXPECT_EQ(RenderEmpty(t->tool_use), "gguf tools");
  EXPECT_THAT(t->unused, ::testing::ElementsAre("rag"));

  WriteGgufStrings(dir, "bad.gguf", {{"tokenizer.chat_template.tool_use", "{% if %}"}});
  EXPECT_THAT(LoadChatTemplates(dir.path() + "/bad.gguf").status().message(),
              HasSubstr("bad.gguf: tokenizer.chat_template.tool_use: chat template line 1"));
}

TEST(JinjaLoadChatTemplateTest, ReadsAnOperatorsTemplateFile) {
  TestTempDir dir;
  const std::string path = dir.WriteFile("mine.jinja", "{{ messages|length }} messages\n");
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = LoadChatTemplateFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Render(nlohmann::json{{"messages", {1, 2, 3}}}), "3 messages");

  EXPECT_THAT(LoadChatTemplateFile(dir.path() + "/missing.jinja").status().message(),
              HasSubstr("missing.jinja: no such file"));
  EXPECT_THAT(LoadChatTemplateFile(dir.path()).status().message(), HasSubstr("no such file"));
  const std::string broken = dir.WriteFile("broken.jinja", "ok\n{{ x|bogus }}");
  EXPECT_THAT(LoadChatTemplateFile(broken).status().message(),
              HasSubstr("broken.jinja: chat template line 2: no filter named 'bogus'"));
  const std::string binary = dir.WriteFile("binary.jinja", std::string("\xff\xfe"));
  EXPECT_THAT(LoadChatTemplateFile(binary).status().message(), HasSubstr("not valid UTF-8"));
}

TEST(JinjaLoadChatTemplateTest, NoTemplateIsNotAnError) {
  TestTempDir empty;
  absl::StatusOr<ChatTemplates> none = LoadChatTemplates(empty.path());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->chat, nullptr);
  EXPECT_EQ(none->tool_use, nullptr);
  TestTempDir without;
  without.WriteFile("tokenizer_config.json", R"({"bos_token": "<s>"})");
  absl::StatusOr<ChatTemplates> also_none = LoadChatTemplates(without.path());
  ASSERT_TRUE(also_none.ok());
  EXPECT_EQ(also_none->chat, nullptr);
}

TEST(JinjaLoadChatTemplateTest, BrokenTemplatesFailAtLoad) {
  TestTempDir dir;
  dir.WriteFile("chat_template.jinja", "ok\n{% if x %}\n{{ x|bogus }}\n{% endif %}");
  const absl::Status status = LoadChatTemplates(dir.path()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("chat_template.jinja: chat template line 3: no filter named 'bogus'"));
  TestTempDir bad_json;
  bad_json.WriteFile("tokenizer_config.json", "{not json");
  EXPECT_THAT(LoadChatTemplates(bad_json.path()).status().message(),
              HasSubstr("is not a JSON object"));
}

TEST(JinjaValueTest, FloatsPrintAsPythonRepr) {
  EXPECT_EQ(FormatFloat(1.0), "1.0");
  EXPECT_EQ(FormatFloat(1e-05), "1e-05");
  EXPECT_EQ(FormatFloat(0.0001), "0.0001");
  EXPECT_EQ(FormatFloat(1e16), "1e+16");
  EXPECT_EQ(FormatFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(FormatFloat(-0.0), "-0.0");
  EXPECT_EQ(FormatFloat(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatFloat(1.5e300), "1.5e+300");
  EXPECT_EQ(FormatFloat(1.0 / 0.0), "inf");
}

TEST(JinjaValueTest, ReprQuotesLikePython) {
  EXPECT_EQ(text::PyRepr("plain"), "'plain'");
  EXPECT_EQ(text::PyRepr("it's"), "\"it's\"");
  EXPECT_EQ(text::PyRepr("both ' and \""), "'both \\' and \"'");
  EXPECT_EQ(text::PyRepr("tab\tnl\n\x01é\xc2\xa0"), "'tab\\tnl\\n\\x01é\\xa0'");
  EXPECT_EQ(
      Repr(Value::MakeList({Value::Int(1), Value::None(), Value::String("a")}, List::Kind::kTuple)),
      "(1, None, 'a')");
  EXPECT_EQ(Repr(Value::MakeList({Value::Int(1)}, List::Kind::kTuple)), "(1,)");
}

TEST(JinjaValueTest, PythonEquality) {
  EXPECT_TRUE(Equals(Value::Int(1), Value::Float(1.0)));
  EXPECT_TRUE(Equals(Value::Int(1), Value::Bool(true)));
  EXPECT_FALSE(Equals(Value::MakeList({}), Value::MakeList({}, List::Kind::kTuple)));
  EXPECT_FALSE(Equals(Value::Int(0), Value::None()));
}

}  // namespace
}  // namespace conveyor::jinja
