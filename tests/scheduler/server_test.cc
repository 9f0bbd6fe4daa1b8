// Real conveyor-scheduler and conveyor-worker processes on loopback, driven through the
// client API: concurrency, the three policies against requests run alone, preemption,
// prefix caching, cancellation, every error status, and a worker that dies mid-stream.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <future>
#include <thread>

#include "conveyor.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(ServerTest, SixtyFourConcurrentStreamsFinishAndEveryPolicyMatchesAlone) {
  const std::vector<v1::GenerateRequest> requests = MixedRequests(64, 3);
  std::vector<Stream> alone;
  {
    Server server({"--policy=continuous"});
    ASSERT_TRUE(server.WaitReady());
    for (const auto& r : requests) alone.push_back(server.Generate(r));
  }
  for (const char* policy : {"continuous", "static", "dynamic"}) {
    SCOPED_TRACE(policy);
    Server server({std::string("--policy=") + policy, "--max_num_seqs=16", "--batch_size=8",
                   "--batch_timeout_ms=20"});
    ASSERT_TRUE(server.WaitReady());
    const std::vector<Stream> streams = RunConcurrently(server, requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(streams[i].status.ok()) << i << ": " << streams[i].status.error_message();
      EXPECT_EQ(streams[i].tokens, alone[i].tokens) << "request " << i;
      EXPECT_EQ(streams[i].last.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(streams[i].last.usage().generated_tokens(),
                static_cast<int>(streams[i].tokens.size()));
    }
    EXPECT_EQ(server.MetricSettled("conveyor_requests_running", 0), 0);
  }
}

// n choices over gRPC: each message names its choice, each choice ends with its own final
// message, and choice i is what one request with seed + i streams; the prompt's KV blocks
// are held once while they run.
TEST(ServerTest, ChoicesStreamApartAndShareThePromptsBlocks) {
  Server server({});
  ASSERT_TRUE(server.WaitReady());
  std::vector<int32_t> prompt(60);
  for (int i = 0; i < 60; ++i) prompt[i] = 3 + (i * 37) % 200;
  v1::GenerateRequest request = Greedy(prompt, 24);
  request.set_temperature(1.0f);
  request.set_seed(2024);
  request.set_n(4);
  double peak_blocks = 0;
  const Stream choices = server.Generate(request, 120s, [&](const Stream&) {
    peak_blocks = std::max(peak_blocks, server.Metric("conveyor_kv_blocks_used"));
    return false;
  });
  ASSERT_TRUE(choices.status.ok()) << choices.status.error_message();
  std::vector<std::vector<int>> tokens(4);
  std::vector<int> finals(4, 0);
  for (const v1::GenerateResponse& m : choices.messages) {
    ASSERT_GE(m.index(), 0);
    ASSERT_LT(m.index(), 4);
    tokens[m.index()].insert(tokens[m.index()].end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      ++finals[m.index()];
      EXPECT_EQ(m.usage().prompt_tokens(), static_cast<int>(prompt.size()));
    }
  }
  EXPECT_EQ(finals, std::vector<int>(4, 1));
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest alone = request;
    alone.clear_n();
    alone.set_seed(2024 + i);
    EXPECT_EQ(tokens[i], server.Generate(alone).tokens) << "choice " << i;
  }
  // Alone, each choice holds the blocks of 60 + 24 tokens; together, the prompt's full
  // blocks once.
  const std::optional<v1::ModelInfoResponse> info = server.ModelInfo();
  ASSERT_TRUE(info.has_value());
  const int block = info->kv_block_size();
  const int per_choice = (60 + 24 + block - 1) / block;
  const int shared = (60 - 1) / block;
  EXPECT_GT(peak_blocks, 0);
  EXPECT_LE(peak_blocks, shared + 4 * (per_choice - shared));
  EXPECT_LT(peak_blocks, 4 * per_choice);
  // A bad n is INVALID_ARGUMENT naming it.
  request.set_n(0);
  const Stream bad = server.Generate(request);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("n must be in [1, 128]"));
}

TEST(ServerTest, PreemptionUnderASmallKvBudgetKeepsOutputsEqual) {
  const std::vector<v1::GenerateRequest> requests = MixedRequests(16, 5);
  std::vector<Stream> alone;
  {
    Server server({});
    ASSERT_TRUE(server.WaitReady());
    for (const auto& r : requests) alone.push_back(server.Generate(r));
  }
  // Each KV block of the tiny model takes 2 layers x 2 x 2 heads x 16 dims x 4 tokens x
  // 4 bytes = 2 KiB; 40 blocks hold 160 tokens, far less than 16 requests need at once.
  Server server({"--kv_cache_bytes=81920", "--max_num_seqs=16"});
  ASSERT_TRUE(server.WaitReady());
  const std::vector<Stream> streams = RunConcurrently(server, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(streams[i].status.ok()) << streams[i].status.error_message();
    EXPECT_EQ(streams[i].tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_GT(server.Metric("conveyor_preemptions_total"), 0);
  EXPECT_EQ(server.MetricSettled("conveyor_kv_blocks_used", 0), 0);
}

// Speculative decoding between real processes: n-gram and suffix drafts verified by the
// worker give the streams decoding one token per step gives (greedy and seeded sampling),
// with drafts kept and the draft counters on the metrics page. (How many steps a run
// takes depends on when the requests arrive, so that is not compared.)
TEST(ServerTest, SpeculativeDecodingStreamsWhatDecodingDoes) {
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt;
    for (int r = 0; r < 4; ++r) {
      for (int j = 0; j < 3 + i % 4; ++j) prompt.push_back(10 + (i * 37 + j * 11) % 200);
    }
    v1::GenerateRequest request = Greedy(prompt, 40 + i);
    if (i % 3 == 2) {
      request.set_temperature(0.8f);
      request.set_seed(50 + i);
    }
    requests.push_back(request);
  }
  std::vector<Stream> plain;
  {
    Server server({});
    ASSERT_TRUE(server.WaitReady());
    plain = RunConcurrently(server, requests);
  }
  for (const char* method : {"ngram", "suffix"}) {
    SCOPED_TRACE(method);
    Server server({std::string("--speculative_method=") + method, "--prompt_lookup_min=1",
                   "--num_speculative_tokens=5"});
    ASSERT_TRUE(server.WaitReady());
    const std::vector<Stream> streams = RunConcurrently(server, requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(streams[i].status.ok()) << i << ": " << streams[i].status.error_message();
      EXPECT_EQ(streams[i].tokens, plain[i].tokens) << "request " << i;
      EXPECT_EQ(streams[i].text, plain[i].text) << "request " << i;
    }
    EXPECT_GT(server.Metric("conveyor_spec_draft_tokens_total"), 0);
    EXPECT_GT(server.Metric("conveyor_spec_accepted_tokens_total"), 0);
    EXPECT_GT(server.Metric("conveyor_spec_verifications_total"), 0);
    EXPECT_EQ(server.MetricSettled("conveyor_kv_blocks_used", 0), 0);
  }
}

TEST(ServerTest, RepeatedPrefixIsServedFromTheCache) {
  Server server({});
  ASSERT_TRUE(server.WaitReady());
  std::vector<int32_t> prompt(30);
  for (int i = 0; i < 30; ++i) prompt[i] = 10 + i;
  const Stream first = server.Generate(Greedy(prompt, 10));
  const double prefill_after_first = server.Metric("conveyor_prefill_tokens_total");
  const Stream second = server.Generate(Greedy(prompt, 10));
  ASSERT_TRUE(first.status.ok() && second.status.ok());
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(first.last.usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(second.last.usage().cached_prompt_tokens(), 28);
  EXPECT_EQ(server.Metric("conveyor_prefill_tokens_total") - prefill_after_first, 2);
  EXPECT_GT(server.Metric("conveyor_prefix_cache_hits_total"), 0);
}

TEST(ServerTest, CancellingHalfTheStreamsLeavesEveryBlockFree) {
  Server server({});
  ASSERT_TRUE(server.WaitReady());
  std::vector<Stream> streams(16);
  std::vector<std::thread> threads;
  threads.reserve(streams.size());
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto cancel = [i](const Stream& s) { return i % 2 == 0 && s.tokens.size() >= 5; };
      streams[i] = server.Generate(Greedy({1, 7, static_cast<int32_t>(20 + i)}, 300), 120s, cancel);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    if (i % 2 == 0) {
      EXPECT_EQ(streams[i].status.error_code(), grpc::StatusCode::CANCELLED);
    } else {
      EXPECT_TRUE(streams[i].status.ok());
      EXPECT_EQ(streams[i].tokens.size(), 300u);
    }
  }
  for (int i = 0; i < 100 && server.Metric("conveyor_kv_blocks_used") != 0; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(server.MetricSettled("conveyor_kv_blocks_used", 0), 0);
  EXPECT_EQ(server.MetricSettled("conveyor_requests_running", 0), 0);
}

TEST(ServerTest, ErrorsHaveTheirStatusCodes) {
  Server server({"--max_num_seqs=1", "--max_queue=1"});
  ASSERT_TRUE(server.WaitReady());
  v1::GenerateRequest bad = Greedy({1, 2, 3}, 4);
  bad.set_top_p(2.0f);
  Stream s = server.Generate(bad);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), HasSubstr("top_p"));

  bad = Greedy({}, 4);
  EXPECT_EQ(server.Generate(bad).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad = Greedy(std::vector<int32_t>(2048, 5), 4);
  s = server.Generate(bad);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.status.error_message(), HasSubstr("context"));

  s = server.Generate(Greedy({1, 2, 3}, 2000), 50ms);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  // One running, one waiting: the queue is full for the rest.
  std::vector<v1::GenerateRequest> flood(6, Greedy({1, 2, 3}, 400));
  const std::vector<Stream> streams = RunConcurrently(server, flood);
  int exhausted = 0;
  for (const Stream& f : streams) {
    if (f.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_THAT(f.status.error_message(), HasSubstr("queue is full"));
    } else {
      EXPECT_TRUE(f.status.ok()) << f.status.error_message();
    }
  }
  EXPECT_GT(exhausted, 0);
  EXPECT_GT(server.MetricSum("conveyor_requests_rejected_total"), 0);
}

TEST(ServerTest, NoWorkerIsUnavailable) {
  Server server({"--worker_init_timeout_s=30"}, /*start_worker=*/false);
  const Stream s = server.Generate(Greedy({1, 2, 3}, 4));
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.status.error_message(), HasSubstr("no model worker is ready"));
}

// A worker that dies and never comes back: the scheduler keeps the streams for
// --worker_recovery_timeout_s (tests/scheduler/chaos_test.cc covers the worker that comes
// back), then ends each with a status that says why.
TEST(ServerTest, AWorkerThatDiesEndsItsStreamsWithAStatus) {
  Server server({"--worker_recovery_timeout_s=1"});
  ASSERT_TRUE(server.WaitReady());
  std::vector<Stream> streams(4);
  std::vector<std::thread> threads;
  threads.reserve(streams.size());
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      streams[i] = server.Generate(Greedy({1, 9, static_cast<int32_t>(30 + i)}, 1900), 60s,
                                   [&](const Stream& s) {
                                     if (i == 0 && s.tokens.size() == 20) {
                                       server.worker().Signal(SIGKILL);
                                     }
                                     return false;
                                   });
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Stream& s : streams) {
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE) << s.status.error_message();
    EXPECT_THAT(s.status.error_message(), HasSubstr("worker"));
  }
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

TEST(ServerTest, TokenizeAndModelInfoDescribeTheServedModel) {
  Server server({"--policy=dynamic", "--max_num_seqs=7"});
  ASSERT_TRUE(server.WaitReady());
  auto stub = v1::Conveyor::NewStub(server.channel());
  grpc::ClientContext context;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(stub->GetModelInfo(&context, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model(), "llama3_gqa");
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.policy(), "dynamic");
  EXPECT_EQ(info.max_num_seqs(), 7);
  EXPECT_EQ(info.kv_block_size(), 4);
  EXPECT_GT(info.num_kv_blocks(), 0);
  // What a client sending token ids needs, without tokenizing "" to guess.
  EXPECT_EQ(info.bos_token_id(), 1);
  EXPECT_THAT(info.eos_token_ids(), ::testing::ElementsAre(2));
  EXPECT_EQ(info.tokenizer(), "sentencepiece");
  EXPECT_FALSE(info.has_chat_template());

  grpc::ClientContext tokenize_context;
  v1::TokenizeRequest request;
  request.set_text("hello world");
  v1::TokenizeResponse tokens;
  ASSERT_TRUE(stub->Tokenize(&tokenize_context, request, &tokens).ok());
  ASSERT_GE(tokens.token_ids_size(), 2);
  EXPECT_EQ(tokens.token_ids(0), 1);  // BOS.
  ASSERT_EQ(tokens.pieces_size(), tokens.token_ids_size());
  std::string text;
  for (int i = 1; i < tokens.pieces_size(); ++i) text += tokens.pieces(i);
  EXPECT_EQ(text, "\u2581hello\u2581world");  // sentencepiece marks spaces with U+2581.
}

// add_bos with token ids is honoured (a BOS is prepended unless present), and a
// logprob entry's text is the token's text as the stream shows it.
TEST(ServerTest, AddBosWithTokenIdsAndLogprobTextAsStreamed) {
  Server server({});
  ASSERT_TRUE(server.WaitReady());
  v1::GenerateRequest plain = Greedy({9, 30, 31}, 6);
  v1::GenerateRequest with_bos = plain;
  with_bos.set_add_bos(true);
  v1::GenerateRequest explicit_bos = Greedy({1, 9, 30, 31}, 6);
  const Stream a = server.Generate(with_bos);
  const Stream b = server.Generate(explicit_bos);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.last.usage().prompt_tokens(), 4);
  EXPECT_EQ(a.tokens, b.tokens);  // The same prompt: BOS + the three ids.
  EXPECT_EQ(server.Generate(plain).last.usage().prompt_tokens(), 3);

  v1::GenerateRequest logprobs = Greedy({1, 9, 30, 31}, 12);
  logprobs.set_logprobs(2);
  auto stub = v1::Conveyor::NewStub(server.channel());
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, logprobs);
  v1::GenerateResponse response;
  int compared = 0;
  while (reader->Read(&response)) {
    // A message of one token whose text is complete (not held back, no partial
    // character) shows exactly that token's text.
    if (response.logprobs_size() != 1 || response.text().empty() ||
        response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      continue;
    }
    const std::string& text = response.logprobs(0).token().text();
    // U+FFFD: a byte piece, whose text the stream shows with its neighbours.
    if (text.find("\xEF\xBF\xBD") != std::string::npos ||
        response.text().find("\xEF\xBF\xBD") != std::string::npos) {
      continue;
    }
    EXPECT_EQ(text, response.text());
    ++compared;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GT(compared, 0);
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

// Sends `bytes` as the request of `method` and returns the call's status.
grpc::Status CallRaw(Server& server, const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(server.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

// A message that does not parse, or whose string field is not UTF-8, is INVALID_ARGUMENT
// with a message that says so, and counted as rejected (gRPC alone answers a bare
// UNIMPLEMENTED); a prompt or request_id too large to serve is refused up front.
TEST(ServerTest, MalformedAndNonUtf8MessagesAreInvalidArgumentAndCounted) {
  Server server({});
  ASSERT_TRUE(server.WaitReady());
  const double rejected_before = server.MetricSum("conveyor_requests_rejected_total");
  const std::string bad_utf8_text = std::string("\x0a\x02\xc3\x28", 4);  // text = C3 28.
  const std::string garbage = "\xff\xff\xff\xff";
  int sent = 0;
  for (const char* method : {"/conveyor.v1.Conveyor/Generate", "/conveyor.v1.Conveyor/Tokenize"}) {
    for (const std::string& bytes : {bad_utf8_text, garbage}) {
      const grpc::Status status = CallRaw(server, method, bytes);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
      EXPECT_THAT(status.error_message(), HasSubstr("not valid UTF-8")) << method;
      ++sent;
    }
  }
  const grpc::Status info = CallRaw(server, "/conveyor.v1.Conveyor/GetModelInfo", garbage);
  EXPECT_EQ(info.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ++sent;
  EXPECT_EQ(server.MetricSum("conveyor_requests_rejected_total") - rejected_before, sent);
  // Inputs whose size alone says no: refused before any work in proportion to them.
  v1::GenerateRequest huge_prompt;
  huge_prompt.set_text(std::string(3'500'000, 'a'));
  const Stream prompt = server.Generate(huge_prompt);
  EXPECT_EQ(prompt.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(prompt.status.error_message(), HasSubstr("more than a context"));
  v1::GenerateRequest huge_id = Greedy({1, 2, 3}, 4);
  huge_id.set_request_id(std::string(1 << 20, 'x'));
  const Stream id = server.Generate(huge_id);
  EXPECT_EQ(id.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(id.status.error_message(), HasSubstr("request_id"));
  // And the server still serves.
  EXPECT_EQ(server.Generate(Greedy({1, 2, 3}, 4)).tokens.size(), 4u);
}

}  // namespace
}  // namespace conveyor::testing
