// conveyor-cli: streams one generation from a conveyor-scheduler to the terminal.
//
//   conveyor-cli --server=127.0.0.1:50051 "Once upon a time"
//
// Text goes to stdout as it arrives; the finish reason and usage go to stderr.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "conveyor.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace {
constexpr float kUnset = std::numeric_limits<float>::quiet_NaN();
}  // namespace

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "host:port of the conveyor-scheduler.");
ABSL_FLAG(std::string, prompt, "", "Prompt text (or give it as the positional argument).");
ABSL_FLAG(int, max_new_tokens, -1, "Most tokens to generate (-1: server default).");
ABSL_FLAG(float, temperature, kUnset, "Sampling temperature; 0 is greedy (unset: 1.0).");
ABSL_FLAG(int, top_k, -1, "Keep the k most likely tokens (-1: off).");
ABSL_FLAG(float, top_p, kUnset, "Nucleus sampling mass in (0, 1] (unset: off).");
ABSL_FLAG(float, min_p, kUnset, "Drop tokens below min_p x the top probability (unset: off).");
ABSL_FLAG(float, repetition_penalty, kUnset, "HF-style repetition penalty (unset: off).");
ABSL_FLAG(float, presence_penalty, kUnset, "OpenAI-style presence penalty (unset: off).");
ABSL_FLAG(float, frequency_penalty, kUnset, "OpenAI-style frequency penalty (unset: off).");
ABSL_FLAG(int64_t, seed, -1, "Seed for reproducible sampling (-1: random).");
ABSL_FLAG(std::string, stop, "", "Stop strings, separated by '|'.");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past the end-of-sequence token.");
ABSL_FLAG(int, logprobs, 0, "Print this many top alternatives per token (stderr).");
ABSL_FLAG(int, priority, 0, "Higher runs first.");
ABSL_FLAG(double, timeout_s, 600, "Deadline for the whole call.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Streams a generation from a conveyor-scheduler.\n"
      "Usage: conveyor-cli [--server=HOST:PORT] [sampling flags] \"prompt text\"");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (prompt.empty() && positional.size() > 1) {
    prompt = absl::StrJoin(positional.begin() + 1, positional.end(), " ");
  }
  if (prompt.empty()) {
    std::cerr << "conveyor-cli: give a prompt (positional argument or --prompt)\n";
    return 2;
  }

  conveyor::v1::GenerateRequest request;
  request.set_text(prompt);
  if (absl::GetFlag(FLAGS_max_new_tokens) >= 0) {
    request.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  }
  auto set_float = [](float value, auto setter) {
    if (!std::isnan(value)) setter(value);
  };
  set_float(absl::GetFlag(FLAGS_temperature), [&](float v) { request.set_temperature(v); });
  set_float(absl::GetFlag(FLAGS_top_p), [&](float v) { request.set_top_p(v); });
  set_float(absl::GetFlag(FLAGS_min_p), [&](float v) { request.set_min_p(v); });
  set_float(absl::GetFlag(FLAGS_repetition_penalty),
            [&](float v) { request.set_repetition_penalty(v); });
  set_float(absl::GetFlag(FLAGS_presence_penalty),
            [&](float v) { request.set_presence_penalty(v); });
  set_float(absl::GetFlag(FLAGS_frequency_penalty),
            [&](float v) { request.set_frequency_penalty(v); });
  if (absl::GetFlag(FLAGS_top_k) >= 0) request.set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_seed) >= 0) request.set_seed(absl::GetFlag(FLAGS_seed));
  for (absl::string_view stop : absl::StrSplit(absl::GetFlag(FLAGS_stop), '|', absl::SkipEmpty())) {
    request.add_stop(std::string(stop));
  }
  request.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  request.set_logprobs(absl::GetFlag(FLAGS_logprobs));
  request.set_priority(absl::GetFlag(FLAGS_priority));

  auto stub = conveyor::v1::Conveyor::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1000)));
  auto reader = stub->Generate(&context, request);
  conveyor::v1::GenerateResponse response;
  conveyor::v1::GenerateResponse last;
  while (reader->Read(&response)) {
    std::cout << response.text() << std::flush;
    for (const auto& lp : response.logprobs()) {
      std::cerr << "\n  [" << lp.token().token_id() << " " << lp.token().logprob() << "]";
      for (const auto& alt : lp.top()) std::cerr << " " << alt.token_id() << ":" << alt.logprob();
    }
    if (response.finish_reason() != conveyor::v1::FINISH_REASON_UNSPECIFIED) last = response;
  }
  const grpc::Status status = reader->Finish();
  std::cout << "\n";
  if (!status.ok()) {
    std::cerr << "conveyor-cli: " << status.error_message() << " (gRPC code " << status.error_code()
              << ")\n";
    return 1;
  }
  const conveyor::v1::Usage& u = last.usage();
  std::cerr << "[" << conveyor::v1::FinishReason_Name(last.finish_reason()) << "] prompt "
            << u.prompt_tokens() << " tokens (" << u.cached_prompt_tokens()
            << " cached), generated " << u.generated_tokens() << " tokens; queue "
            << u.queue_time_ms() << " ms, first token " << u.time_to_first_token_ms()
            << " ms, total " << u.e2e_latency_ms() << " ms\n";
  return 0;
}
