// The OpenAI wire format on its own: request fields into GenerateRequest, the errors each
// bad field gives, and engine messages into OpenAI's objects and SSE chunks. The HTTP
// server and a real client are tested in tests/http/.
#include "scheduler/http/openai_protocol.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler::openai {
namespace {

using ::testing::HasSubstr;

ParseOptions Options() {
  ParseOptions o;
  o.model_name = "tiny";
  o.model_aliases = {"/models/tiny"};
  o.max_logprobs = 20;
  return o;
}

absl::StatusOr<ParsedRequest> Completions(const std::string& body) {
  return ParseRequest(Endpoint::kCompletions, body, Options());
}

absl::StatusOr<ParsedRequest> Chat(const std::string& body) {
  return ParseRequest(Endpoint::kChatCompletions, body, Options());
}

std::string ParamOf(const absl::Status& status) {
  const Json body = Json::parse(ErrorBody(status));
  return body["error"]["param"].is_string() ? body["error"]["param"].get<std::string>() : "";
}

// The JSON objects of an SSE text, "[DONE]" as the string "[DONE]".
std::vector<Json> Events(const std::string& sse) {
  std::vector<Json> events;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string data = sse.substr(pos + 6, end - pos - 6);
    events.push_back(data == "[DONE]" ? Json("[DONE]") : Json::parse(data));
    pos = end + 2;
  }
  return events;
}

v1::GenerateResponse Message(const std::string& text, v1::FinishReason reason = {}) {
  v1::GenerateResponse m;
  m.add_token_ids(7);
  m.set_text(text);
  if (reason != v1::FINISH_REASON_UNSPECIFIED) {
    m.set_finish_reason(reason);
    m.mutable_usage()->set_prompt_tokens(5);
    m.mutable_usage()->set_generated_tokens(3);
    m.mutable_usage()->set_cached_prompt_tokens(4);
  }
  return m;
}

TEST(ParseRequestTest, CompletionsFieldsMapToTheGenerateRequest) {
  auto r = Completions(R"({"model": "tiny", "prompt": "Hello", "max_tokens": 7,
      "temperature": 0.5, "top_p": 0.9, "stop": ["a", "b"], "seed": -1, "n": 1,
      "presence_penalty": 0.1, "frequency_penalty": 0.2, "user": "x", "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": 2, "top_k": 40,
      "ignore_eos": true, "echo": false, "best_of": 1, "suffix": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.text(), "Hello");
  EXPECT_EQ(g.max_new_tokens(), 7);
  EXPECT_FLOAT_EQ(g.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.top_p(), 0.9f);
  EXPECT_FLOAT_EQ(g.presence_penalty(), 0.1f);
  EXPECT_FLOAT_EQ(g.frequency_penalty(), 0.2f);
  EXPECT_THAT(std::vector<std::string>(g.stop().begin(), g.stop().end()),
              ::testing::ElementsAre("a", "b"));
  EXPECT_EQ(g.seed(), ~uint64_t{0});
  EXPECT_EQ(g.logprobs(), 2);
  EXPECT_EQ(g.top_k(), 40);
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_FALSE(g.has_add_bos());
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 2);
}

TEST(ParseRequestTest, CompletionsDefaultsFollowOpenAi) {
  auto r = Completions(R"({"model": "/models/tiny", "prompt": [1, 2, 3], "logprobs": 0})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(
      std::vector<int>(r->generate.token_ids().ids().begin(), r->generate.token_ids().ids().end()),
      ::testing::ElementsAre(1, 2, 3));
  EXPECT_EQ(r->generate.max_new_tokens(), kCompletionsDefaultMaxTokens);
  EXPECT_FALSE(r->generate.has_temperature());
  EXPECT_FALSE(r->stream);
  // logprobs 0 still reports the chosen token's, so the engine is asked for one.
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 0);
  EXPECT_EQ(r->generate.logprobs(), 1);

  auto bare = Completions(R"({"prompt": "<|user|>hi", "add_special_tokens": false})");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(bare->generate.has_add_bos());
  EXPECT_FALSE(bare->generate.add_bos());
  auto framed = Completions(R"({"prompt": "hi", "add_special_tokens": true})");
  ASSERT_TRUE(framed.ok()) << framed.status();
  EXPECT_FALSE(framed->generate.has_add_bos());  // The model's usual framing.
}

TEST(ParseRequestTest, ABatchOfOnePromptIsThatPrompt) {
  auto text = Completions(R"({"prompt": ["Hi"]})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->generate.text(), "Hi");
  auto ids = Completions(R"({"prompt": [[4, 5]]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->generate.token_ids().ids_size(), 2);
}

TEST(ParseRequestTest, BadRequestsNameTheField) {
  struct Case {
    std::string body;
    std::string param;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"prompt": ["a", "b"]})", "prompt", "only one prompt per request"},
      {R"({"prompt": ""})", "prompt", "prompt is empty"},
      {R"({"prompt": [1, "x"]})", "prompt", "token ids must be integers"},
      {R"({"prompt": [1, 3000000000]})", "prompt", "token ids must be integers"},
      {R"({})", "prompt", "prompt is required"},
      {R"({"prompt": "a", "n": 129})", "n", "n must be in [1, 128], got 129"},
      {R"({"prompt": "a", "n": 0})", "n", "n must be in [1, 128]"},
      {R"({"prompt": "a", "temperature": "hot"})", "temperature", "must be a number"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens", "max_tokens must be in [1,"},
      {R"({"prompt": "a", "max_tokens": 1.5})", "max_tokens", "must be an integer"},
      {R"({"prompt": "a", "best_of": 3})", "best_of", "best_of must equal n (1)"},
      {R"({"prompt": "a", "n": 2, "best_of": 3})", "best_of", "best_of must equal n (2)"},
      {R"({"prompt": "a", "suffix": "x"})", "suffix", "suffix is not supported"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs", "logprobs must be in [0, 20]"},
      {R"({"prompt": "a", "logprobs": 1073741825})", "logprobs",
       "logprobs must be in [0, 20], got 1073741825"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs", "must be an integer"},
      {R"({"prompt": "a", "stop": 3})", "stop", "a string or a list of strings"},
      {R"({"prompt": "a", "stream": "yes"})", "stream", "true or false"},
      {R"({"prompt": "a", "logit_bias": {"one": 5}})", "logit_bias", "keys are token ids"},
      {R"({"prompt": "a", "logit_bias": {"1": "5"}})", "logit_bias", "an object of numbers"},
      {R"({"prompt": "a", "logit_bias": [1, 5]})", "logit_bias", "an object"},
      {R"({"prompt": "a", "seed": "1"})", "seed", "an integer"},
  };
  for (const Case& c : cases) {
    auto r = Completions(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(HttpStatusFor(r.status()), 400) << c.body;
    EXPECT_EQ(ParamOf(r.status()), c.param) << c.body;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.body;
  }
}

TEST(ParseRequestTest, NotJsonIsABadRequest) {
  for (const char* body : {"{", "[1]", "", "null"}) {
    auto r = Completions(body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(HttpStatusFor(r.status()), 400) << body;
  }
}

// The five bodies that used to kill the scheduler (a stack overflow in the recursion that
// copied, compared or printed the value), and the same depth in a field nobody reads:
// all refused before the body is walked, naming the limit and never echoing the value.
TEST(ParseRequestTest, DeepNestingAnywhereIsRefusedBeforeTheBodyIsWalked) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::pair<Endpoint, std::string>> bodies = {
      {Endpoint::kCompletions, R"({"prompt": [1, )" + deep + "]}"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": )" + deep + "}"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "tools": )" + deep + "}"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x", "name": )" + deep + "}]}"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": [{"type": "text", "text": )" + deep + "}]}]}"},
      {Endpoint::kCompletions, R"({"prompt": "a", "ignored": )" + deep + "}"},
  };
  for (const auto& [endpoint, body] : bodies) {
    auto r = ParseRequest(endpoint, body, Options());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(HttpStatusFor(r.status()), 400);
    EXPECT_THAT(r.status().message(), HasSubstr("more than 64 levels deep"));
    EXPECT_LT(ErrorBody(r.status()).size(), 400u);
  }
  // 64 levels are fine where the value is not read.
  const std::string ok = std::string(63, '[') + std::string(63, ']');
  EXPECT_TRUE(Completions(R"({"prompt": "a", "ignored": )" + ok + "}").ok());
}

TEST(ParseRequestTest, ARefusedValueIsQuotedOnlyInPart) {
  auto r = Completions(R"({"prompt": [1, ")" + std::string(100000, 'x') + R"("]})");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("token ids must be integers"));
  EXPECT_LT(r.status().message().size(), 200u);
}

TEST(ParseRequestTest, AnUnknownModelIsNotFound) {
  auto r = Completions(R"({"model": "gpt-4", "prompt": "a"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(HttpStatusFor(r.status()), 404);
  const Json error = Json::parse(ErrorBody(r.status()))["error"];
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(error["param"], "model");
  EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("'tiny'"));
}

TEST(ParseRequestTest, ChatMessagesKeepTheirKeysAndJoinTextParts) {
  auto r = Chat(R"({"model": "tiny", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"},
                                                   {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
          "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "42"}],
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "max_completion_tokens": 9, "max_tokens": 3, "logprobs": true, "top_logprobs": 3})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[1]["content"], "a\nb");
  EXPECT_EQ(r->messages[1].begin().key(), "role");  // The client's key order.
  EXPECT_EQ(r->messages[1]["name"], "ann");
  EXPECT_TRUE(r->messages[2]["content"].is_null());
  // Arguments sent back as JSON text reach the template as the object (as transformers').
  EXPECT_EQ(r->messages[2]["tool_calls"][0]["function"]["arguments"], Json({{"x", 1}}));
  EXPECT_EQ(r->tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(r->messages[3]["tool_call_id"], "1");
  EXPECT_EQ(r->tools.size(), 1u);
  EXPECT_EQ(r->generate.max_new_tokens(), 9);  // max_completion_tokens wins.
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_EQ(r->generate.logprobs(), 3);

  const Json context = ChatTemplateContext(*r, "<s>", "</s>");
  EXPECT_EQ(context["messages"], r->messages);
  EXPECT_EQ(context["tools"], r->tools);
  EXPECT_EQ(context["add_generation_prompt"], true);
  EXPECT_EQ(context["bos_token"], "<s>");
  EXPECT_EQ(context["eos_token"], "</s>");
}

TEST(ParseRequestTest, ChatWithoutLimitsLeavesThemToTheServer) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
                    "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->generate.has_max_new_tokens());
  EXPECT_TRUE(r->tools.is_null());  // tool_choice "none" hides them from the template.
  EXPECT_FALSE(ChatTemplateContext(*r, "", "").contains("tools"));
}

TEST(ParseRequestTest, BadChatRequestsNameTheField) {
  struct Case {
    std::string body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
           "top_logprobs": 21})",
       "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes",
           "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "tool_choice": {"type": "function", "function": {"name": "g"}},
           "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})",
       "tools[0].type"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "xml"}})",
       "response_format.type"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}})",
       "response_format.json_schema.schema"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_schema",
                               "json_schema": {"name": "a", "schema": {"type": "object",
                                 "properties": {"a": {"type": "string", "foo": 1}}}}}})",
       "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "regex": 5})", "regex"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 1.5})", "n"},
  };
  for (const Case& c : cases) {
    auto r = Chat(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(HttpStatusFor(r.status()), 400) << c.body;
    EXPECT_EQ(ParamOf(r.status()), c.param) << c.body << ": " << r.status();
  }
}

TEST(SetChatPromptTest, TheRenderedTextIsThePromptWithoutAnotherBos) {
  v1::GenerateRequest g;
  SetChatPrompt("<s>[INST] hi [/INST]", &g);
  EXPECT_EQ(g.text(), "<s>[INST] hi [/INST]");
  EXPECT_TRUE(g.has_add_bos());
  EXPECT_FALSE(g.add_bos());
}

TEST(ErrorsTest, StatusCodesMapToHttpStatuses) {
  EXPECT_EQ(HttpStatusFor(absl::InvalidArgumentError("")), 400);
  EXPECT_EQ(HttpStatusFor(absl::UnauthenticatedError("")), 401);
  EXPECT_EQ(HttpStatusFor(absl::NotFoundError("")), 404);
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("")), 429);
  EXPECT_EQ(HttpStatusFor(absl::UnavailableError("")), 503);
  EXPECT_EQ(HttpStatusFor(absl::InternalError("")), 500);
  EXPECT_EQ(HttpStatusFor(absl::DeadlineExceededError("")), 500);
  const Json error = Json::parse(ErrorBody(absl::ResourceExhaustedError("queue full")))["error"];
  EXPECT_EQ(error["message"], "queue full");
  EXPECT_EQ(error["type"], "rate_limit_error");
  EXPECT_TRUE(error["param"].is_null());
  EXPECT_TRUE(error["code"].is_null());
  EXPECT_EQ(ErrorEvent(absl::UnavailableError("gone")).rfind("data: {\"error\":", 0), 0u);
}

TEST(ErrorsTest, BuildErrorsUseThisApisFieldNames) {
  const absl::Status renamed = RenameBuildError(absl::InvalidArgumentError(
      "prompt (9 tokens) + max_new_tokens (5000) exceeds the model's context of 2048 tokens"));
  EXPECT_EQ(renamed.message(),
            "prompt (9 tokens) + max_tokens (5000) exceeds the model's context of 2048 tokens");
  EXPECT_THAT(
      RenameBuildError(absl::InvalidArgumentError("token_ids holds 9999, outside")).message(),
      HasSubstr("prompt holds 9999"));
  EXPECT_EQ(RenameBuildError(absl::InvalidArgumentError("text is empty; give a prompt")).message(),
            "the prompt is empty");
  EXPECT_EQ(RenameBuildError(absl::InvalidArgumentError("text is 99 bytes: more")).message(),
            "the prompt is 99 bytes: more");
}

TEST(ResponseFormatterTest, CompletionsStream) {
  auto r = Completions(R"({"prompt": "a", "stream": true,
                           "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(r.ok());
  ResponseFormatter f(*r, "cmpl-1", 1700000000, "tiny");
  std::string sse;
  f.AppendStart(&sse);
  EXPECT_EQ(sse, "");
  f.AppendEvents(Message("Hel"), &sse);
  f.AppendEvents(Message(""), &sse);  // Held back: nothing to send.
  const v1::GenerateResponse last = Message("lo", v1::FINISH_REASON_EOS);
  f.AppendEvents(last, &sse);
  f.AppendEnd(last.usage(), &sse);  // Once every choice has ended.
  const std::vector<Json> events = Events(sse);
  ASSERT_EQ(events.size(), 4u) << sse;
  EXPECT_EQ(events[0]["id"], "cmpl-1");
  EXPECT_EQ(events[0]["object"], "text_completion");
  EXPECT_EQ(events[0]["created"], 1700000000);
  EXPECT_EQ(events[0]["model"], "tiny");
  EXPECT_EQ(events[0]["choices"][0]["text"], "Hel");
  EXPECT_TRUE(events[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(events[0].contains("usage") && events[0]["usage"].is_null());
  EXPECT_EQ(events[1]["choices"][0]["text"], "lo");
  EXPECT_EQ(events[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(events[2]["choices"].empty());
  EXPECT_EQ(events[2]["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(events[2]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(events[2]["usage"]["total_tokens"], 8);
  EXPECT_EQ(events[2]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(events[3], "[DONE]");
}

TEST(ResponseFormatterTest, ChatStreamOpensWithTheRoleAndEndsWithAnEmptyDelta) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "stream": true})");
  ASSERT_TRUE(r.ok());
  ResponseFormatter f(*r, "chatcmpl-2", 1, "tiny");
  std::string sse;
  f.AppendStart(&sse);
  f.AppendEvents(Message("Hi"), &sse);
  f.AppendEvents(Message("", v1::FINISH_REASON_LENGTH), &sse);
  f.AppendEnd(v1::Usage(), &sse);
  const std::vector<Json> events = Events(sse);
  ASSERT_EQ(events.size(), 4u) << sse;
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(events[2]["choices"][0]["delta"].empty());
  EXPECT_EQ(events[2]["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(events[2].contains("usage"));
  EXPECT_EQ(events[3], "[DONE]");
}

TEST(ResponseFormatterTest, WholeBodies) {
  auto chat = Chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(chat.ok());
  ResponseFormatter f(*chat, "chatcmpl-3", 1, "tiny");
  f.Add(Message("Hello"));
  f.Add(Message(" there", v1::FINISH_REASON_STOP));
  const Json body = Json::parse(f.Body());
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello there");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["total_tokens"], 8);
}

v1::GenerateResponse WithLogprobs(const std::string& text) {
  v1::GenerateResponse m = Message(text);
  v1::TokenLogprobs* lp = m.add_logprobs();
  lp->mutable_token()->set_text(text);
  lp->mutable_token()->set_logprob(-0.5f);
  for (const char* alt : {"x", "y", "x"}) {
    v1::TokenLogprob* t = lp->add_top();
    t->set_text(alt);
    t->set_logprob(-1.0f);
  }
  return m;
}

TEST(ResponseFormatterTest, CompletionsLogprobs) {
  auto r = Completions(R"({"prompt": "a", "logprobs": 2})");
  ASSERT_TRUE(r.ok());
  ResponseFormatter f(*r, "cmpl-4", 1, "tiny");
  f.Add(WithLogprobs("ab"));
  f.Add(WithLogprobs("c"));
  const Json lp = Json::parse(f.Body())["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json::array({"ab", "c"}));
  EXPECT_EQ(lp["token_logprobs"], Json::array({-0.5, -0.5}));
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);  // The first two alternatives.
  EXPECT_EQ(lp["text_offset"], Json::array({0, 2}));
}

TEST(ResponseFormatterTest, ChoicesNameTheirIndexAndShareOneBody) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "n": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<ResponseFormatter> choices;
  choices.reserve(2);
  for (int i = 0; i < 2; ++i) choices.emplace_back(*r, "chatcmpl-9", 1, "tiny", i);
  std::string sse;
  choices[1].AppendStart(&sse);
  choices[1].AppendEvents(Message("B"), &sse);
  for (const Json& event : Events(sse)) EXPECT_EQ(event["choices"][0]["index"], 1) << event;

  v1::GenerateResponse a = Message("A", v1::FINISH_REASON_LENGTH);
  a.mutable_usage()->set_prompt_tokens(5);
  a.mutable_usage()->set_generated_tokens(3);
  v1::GenerateResponse b = Message("BB", v1::FINISH_REASON_STOP);
  b.mutable_usage()->set_prompt_tokens(5);
  b.mutable_usage()->set_generated_tokens(2);
  choices[0].Add(a);
  choices[1].Add(b);
  const Json body = Json::parse(ResponseFormatter::Body({&choices[0], &choices[1]}));
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "A");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["message"]["content"], "BB");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  // The prompt counts once, every choice's tokens.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 10);
}

TEST(ResponseFormatterTest, ChatLogprobsStream) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                    "stream": true})");
  ASSERT_TRUE(r.ok());
  ResponseFormatter f(*r, "chatcmpl-5", 1, "tiny");
  std::string sse;
  f.AppendEvents(WithLogprobs(""), &sse);  // No text, but its logprobs still go out.
  const std::vector<Json> events = Events(sse);
  ASSERT_EQ(events.size(), 1u);
  const Json entry = events[0]["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(entry["token"], "");
  EXPECT_EQ(entry["logprob"], -0.5);
  EXPECT_TRUE(entry["top_logprobs"].empty());  // top_logprobs was not asked for.
}

TEST(ParseRequestTest, ChatTemplateKwargsReachTheTemplate) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi"}],
                    "chat_template_kwargs": {"enable_thinking": false, "add_generation_prompt":
                    false, "messages": [], "bos_token": "<B>"}, "max_reasoning_tokens": 7})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_reasoning_tokens, 7);
  const Json context = ChatTemplateContext(*r, "<s>", "</s>");
  EXPECT_EQ(context["enable_thinking"], false);
  // They override the defaults (as vLLM's), but never the conversation.
  EXPECT_EQ(context["add_generation_prompt"], false);
  EXPECT_EQ(context["bos_token"], "<B>");
  EXPECT_EQ(context["messages"], r->messages);

  for (const char* bad : {R"("chat_template_kwargs": [1])", R"("chat_template_kwargs": "x")",
                          R"("max_reasoning_tokens": 0)", R"("max_reasoning_tokens": "9")"}) {
    const std::string body =
        std::string(R"({"messages": [{"role": "user", "content": "x"}], )") + bad + "}";
    auto refused = Chat(body);
    ASSERT_FALSE(refused.ok()) << body;
    EXPECT_EQ(HttpStatusFor(refused.status()), 400) << body;
    EXPECT_EQ(ParamOf(refused.status()),
              std::string(bad).substr(1, std::string(bad).find('"', 1) - 1))
        << body;
  }
}

// A chat request whose output is split as `format` says, the prompt having left thinking
// in `prompt` (what BuildOpenAiRequest sets from the template and the rendered prompt).
ParsedRequest ReasoningChat(bool stream, ReasoningFormat format = ReasoningFormat::kDeepSeekR1,
                            PromptThinking prompt = PromptThinking::kOpen) {
  auto r = Chat(std::string(R"({"messages": [{"role": "user", "content": "hi"}], "stream": )") +
                (stream ? "true" : "false") + "}");
  EXPECT_TRUE(r.ok());
  r->reasoning_format = format;
  r->prompt_thinking = prompt;
  return *r;
}

TEST(ResponseFormatterTest, ReasoningStreamsApartFromTheAnswer) {
  ResponseFormatter f(ReasoningChat(true), "chatcmpl-6", 1, "tiny");
  std::string sse;
  f.AppendStart(&sse);
  for (const char* text : {"<think>\nTwo and", " two.</th", "ink>\n", "\nFour", "."}) {
    f.AppendEvents(Message(text), &sse);
  }
  f.AppendEvents(Message("", v1::FINISH_REASON_STOP), &sse);
  std::string reasoning, content;
  for (const Json& event : Events(sse)) {
    if (!event.is_object()) continue;
    const Json& delta = event["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) {
      EXPECT_EQ(delta["reasoning"], delta["reasoning_content"]);
      reasoning += delta["reasoning_content"].get<std::string>();
    }
    if (delta.contains("content")) content += delta["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "\nTwo and two.");
  EXPECT_EQ(content, "Four.");  // The role's opening delta has "" too.
  EXPECT_EQ(sse.find("think>"), std::string::npos) << sse;
}

TEST(ResponseFormatterTest, ReasoningInTheWholeBody) {
  ResponseFormatter f(ReasoningChat(false), "chatcmpl-7", 1, "tiny");
  f.Add(Message("Hmm</think>\n\nFour"));
  f.Add(Message(".", v1::FINISH_REASON_STOP));
  Json message = Json::parse(f.Body())["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "Hmm");
  EXPECT_EQ(message["reasoning"], "Hmm");
  EXPECT_EQ(message["content"], "Four.");

  // No end tag: all reasoning, no answer.
  ResponseFormatter cut(ReasoningChat(false), "chatcmpl-8", 1, "tiny");
  cut.Add(Message("Hmm, let me</thi", v1::FINISH_REASON_LENGTH));
  message = Json::parse(cut.Body())["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "Hmm, let me</thi");
  EXPECT_EQ(message["content"], "");

  // qwen3 with thinking off: all answer, reasoning null.
  ResponseFormatter off(ReasoningChat(false, ReasoningFormat::kQwen3, PromptThinking::kClosed),
                        "chatcmpl-9", 1, "tiny");
  off.Add(Message("Four.", v1::FINISH_REASON_STOP));
  message = Json::parse(off.Body())["choices"][0]["message"];
  EXPECT_TRUE(message["reasoning_content"].is_null());
  EXPECT_EQ(message["content"], "Four.");

  // Without a parser the shape is OpenAI's alone.
  ResponseFormatter plain(ReasoningChat(false, ReasoningFormat::kNone), "chatcmpl-10", 1, "tiny");
  plain.Add(Message("<think>x</think>y", v1::FINISH_REASON_STOP));
  message = Json::parse(plain.Body())["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content"));
  EXPECT_EQ(message["content"], "<think>x</think>y");
}

TEST(ResponseFormatterTest, ToolCallsAreParsedFromTheAnswerOnly) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_TRUE(r.ok());
  r->tool_call_format = ToolCallFormat::kHermes;
  r->reasoning_format = ReasoningFormat::kQwen3;
  ResponseFormatter f(*r, "chatcmpl-11", 1, "tiny");
  // A call written while thinking is reasoning; the one in the answer is a call.
  f.Add(Message("<think>maybe <tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"));
  f.Add(
      Message("</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
              "</tool_call>",
              v1::FINISH_REASON_STOP));
  const Json body = Json::parse(f.Body());
  const Json& message = body["choices"][0]["message"];
  EXPECT_THAT(message["reasoning_content"].get<std::string>(), HasSubstr("\"g\""));
  ASSERT_EQ(message["tool_calls"].size(), 1u) << body;
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ModelsTest, ListsTheServedModel) {
  const Json list = Json::parse(ModelList("tiny", 5));
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "tiny");
  EXPECT_EQ(list["data"][0]["object"], "model");
}

TEST(ParseRequestTest, ToolChoiceAndParallelCalls) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}},
                                         {"type": "function", "function": {"name": "g"}}])";
  auto required = Chat(R"({"messages": [{"role": "user", "content": "x"}], )" + tools +
                       R"(, "tool_choice": "required", "parallel_tool_calls": false})");
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(required->parallel_tool_calls);
  auto named = Chat(R"({"messages": [{"role": "user", "content": "x"}], )" + tools +
                    R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(named->tool_function, "g");
  EXPECT_TRUE(named->parallel_tool_calls);
  auto none = Chat(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->tool_choice, ToolChoice::kNone);
}

TEST(ParseRequestTest, ResponseFormatBecomesTheConstraint) {
  auto object = Chat(R"({"messages": [{"role": "user", "content": "x"}],
                         "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_TRUE(object->generate.constraint().json_object());
  auto schema = Chat(R"({"messages": [{"role": "user", "content": "x"}],
                         "response_format": {"type": "json_schema", "json_schema": {
                           "name": "p", "strict": true, "schema": {"type": "object",
                           "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                           "required": ["b", "a"], "additionalProperties": false}}}})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  // Key order is the client's: properties are generated in it.
  EXPECT_EQ(schema->generate.constraint().json_schema(),
            R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}},)"
            R"("required":["b","a"],"additionalProperties":false})");
  auto text = Chat(R"({"messages": [{"role": "user", "content": "x"}],
                       "response_format": {"type": "text"}})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->generate.has_constraint());
  // The refusal names the keyword and where it is.
  auto bad = Chat(R"({"messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_schema", "json_schema": {"name": "a",
                        "schema": {"properties": {"a": {"type": "string", "foo": 1}}}}}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), testing::HasSubstr("foo"));
  EXPECT_THAT(std::string(bad.status().message()), testing::HasSubstr("properties"));
}

}  // namespace
}  // namespace conveyor::scheduler::openai
