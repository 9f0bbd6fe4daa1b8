// Fuzzes the scheduler's validation of client requests: the input is the bytes of a
// GenerateRequest as they arrive over gRPC, parsed as scheduler/api_service.cc's ParseRaw
// does, then turned into a Request by scheduler/request_builder.h's BuildRequest with a
// real tokenizer (tests/fuzz/data/llama3) and limits like a small model's. Beyond the
// sanitizers, it checks BuildRequest's contract: a rejection is INVALID_ARGUMENT, and an
// accepted request fits the limits it was checked against.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "conveyor.pb.h"
#include "scheduler/request_builder.h"
#include "tests/fuzz/fuzz_support.h"

namespace conveyor::fuzz {
namespace {

struct Context {
  std::unique_ptr<Tokenizer> tokenizer = LoadTokenizer("llama3");
  scheduler::ServingLimits limits;

  Context() {
    // A model pads its vocabulary past the tokenizer's; a KV cache smaller than the
    // context, so that both bounds are reachable.
    limits.vocab_size = tokenizer->vocab_size() + 64;
    limits.max_context_tokens = 2048;
    limits.kv_capacity_tokens = 1024;
    limits.eos_token_ids = {tokenizer->eos_id()};
    limits.bos_token_id = tokenizer->bos_id();
  }
};

void CheckAccepted(const v1::GenerateRequest& proto, const scheduler::Request& r,
                   const scheduler::ServingLimits& limits) {
  auto fail = [&](std::string_view what) {
    InvariantViolated(what, absl::StrCat("request: ", proto.ShortDebugString()));
  };
  if (r.tokens.empty() || r.num_prompt_tokens != r.num_tokens()) fail("prompt tokens");
  for (int32_t id : r.tokens) {
    if (id < 0 || id >= limits.vocab_size) fail("a prompt token outside the vocabulary");
  }
  if (r.max_new_tokens < 1 || r.num_prompt_tokens >= limits.max_context_tokens ||
      r.num_prompt_tokens + r.max_new_tokens > limits.max_context_tokens ||
      r.num_prompt_tokens + r.max_new_tokens > limits.kv_capacity_tokens) {
    fail("an accepted request exceeds the context or the KV cache");
  }
  if (r.detokenizer == nullptr || r.stop_matcher == nullptr) fail("detokenizer or stop matcher");
  if (r.num_logprobs < 0 || r.num_logprobs > limits.max_logprobs) fail("logprobs out of range");
}

void FuzzOne(const uint8_t* data, size_t size) {
  static const Context* context = new Context();
  // As ParseRaw: the message's bytes in one string, then ParseFromString (which also
  // refuses string fields that are not UTF-8).
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  v1::GenerateRequest proto;
  if (!proto.ParseFromString(bytes)) return;
  auto built = scheduler::BuildRequest(proto, context->limits, *context->tokenizer);
  if (!built.ok()) {
    if (built.status().code() != absl::StatusCode::kInvalidArgument) {
      InvariantViolated(
          "a rejection that is not INVALID_ARGUMENT",
          absl::StrCat(built.status().ToString(), "\nrequest: ", proto.ShortDebugString()));
    }
    return;
  }
  CheckAccepted(proto, **built, context->limits);
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
