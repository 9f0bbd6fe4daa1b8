// Fuzzes the tool-call parsers (scheduler/http/tool_calls.h) on arbitrary model output and
// aborts where they break their contract:
//  - the output fed in chunks gives the same content and the same calls (ids, names,
//    arguments) as the output fed whole, whatever the chunks;
//  - every call's arguments are one JSON object, serialized compactly (as nlohmann dumps
//    what it parses);
//  - a parser never holds more than max_call_bytes + kToolCallHeldOverheadBytes, nor emits
//    more than max_calls calls;
//  - content is well-formed UTF-8 in every delta when the output is;
//  - nothing comes after Finish.
//
// Input: a first byte whose low two bits pick the format (3: hermes again) and whose next
// bit picks small limits (max_call_bytes 64, max_calls 3) that the fuzzer reaches quickly;
// a second byte seeding the chunk sizes (1 to 16 bytes, drawn from it); then the output.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "scheduler/http/tool_calls.h"
#include "tests/fuzz/fuzz_support.h"

namespace conveyor::fuzz {
namespace {

using scheduler::openai::kToolCallHeldOverheadBytes;
using scheduler::openai::MakeToolCallParser;
using scheduler::openai::ParsedToolCalls;
using scheduler::openai::ToolCallFormat;
using scheduler::openai::ToolCallFormatName;
using scheduler::openai::ToolCallLimits;
using scheduler::openai::ToolCallParser;
using scheduler::openai::ToolCallStreamDelta;

// Bounds the cost of one input.
constexpr size_t kMaxOutputBytes = 8192;

scheduler::openai::ToolCallIdSource CountingIds() {
  auto next = std::make_shared<uint64_t>(0);
  return [next] { return (*next)++ * 0x9E3779B97F4A7C15ULL; };
}

std::string Describe(ToolCallFormat format, std::string_view output) {
  return absl::StrCat("format: ", std::string(ToolCallFormatName(format)), "\noutput (",
                      output.size(), " bytes): ", std::string(output));
}

std::string Describe(const ParsedToolCalls& parsed) {
  std::string out = absl::StrCat("content: \"", parsed.content, "\"");
  for (const auto& call : parsed.tool_calls) {
    absl::StrAppend(&out, "\ncall ", call.id, " ", call.name, " ", call.arguments);
  }
  return out;
}

void CheckBounds(const ToolCallParser& parser, const ToolCallLimits& limits,
                 const std::string& context) {
  if (parser.held_bytes() > limits.max_call_bytes + kToolCallHeldOverheadBytes) {
    InvariantViolated("a parser holds more than its bound",
                      absl::StrCat(context, "\nheld: ", parser.held_bytes()));
  }
  if (parser.num_calls() > limits.max_calls) {
    InvariantViolated("a parser emitted more calls than its bound", context);
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 2) return;
  static constexpr ToolCallFormat kFormats[4] = {ToolCallFormat::kLlama3Json,
                                                 ToolCallFormat::kHermes, ToolCallFormat::kMistral,
                                                 ToolCallFormat::kHermes};
  const ToolCallFormat format = kFormats[data[0] & 3];
  ToolCallLimits limits;
  if (data[0] & 4) {
    limits.max_call_bytes = 64;
    limits.max_calls = 3;
  }
  uint32_t state = data[1] * 2654435761u + 1;
  const std::string_view output(reinterpret_cast<const char*>(data) + 2,
                                std::min(size - 2, kMaxOutputBytes));
  const std::string context = Describe(format, output);
  const bool well_formed = IsWellFormedUtf8(output);

  std::unique_ptr<ToolCallParser> whole_parser = MakeToolCallParser(format, CountingIds(), limits);
  const ParsedToolCalls whole = ParseToolCalls(*whole_parser, output);
  CheckBounds(*whole_parser, limits, context);

  std::unique_ptr<ToolCallParser> parser = MakeToolCallParser(format, CountingIds(), limits);
  ParsedToolCalls streamed;
  auto add = [&](const ToolCallStreamDelta& delta) {
    if (well_formed && !IsWellFormedUtf8(delta.content)) {
      InvariantViolated("a content delta is ill-formed UTF-8",
                        absl::StrCat(context, "\ndelta: ", delta.content));
    }
    streamed.Append(delta);
    CheckBounds(*parser, limits, context);
  };
  for (size_t pos = 0; pos < output.size();) {
    state = state * 1664525u + 1013904223u;
    const size_t chunk = std::min<size_t>(1 + (state >> 24) % 16, output.size() - pos);
    add(parser->Feed(output.substr(pos, chunk)));
    pos += chunk;
  }
  add(parser->Finish());
  if (!parser->Finish().empty() || !parser->Feed("x").empty()) {
    InvariantViolated("a parser emitted something after Finish", context);
  }

  if (!(streamed == whole)) {
    InvariantViolated(
        "the streamed result differs from the whole one",
        absl::StrCat(context, "\nwhole: ", Describe(whole), "\nstreamed: ", Describe(streamed)));
  }
  if (whole.tool_calls.size() > static_cast<size_t>(limits.max_calls)) {
    InvariantViolated("more calls than max_calls", context);
  }
  for (const auto& call : whole.tool_calls) {
    const nlohmann::ordered_json arguments =
        nlohmann::ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (arguments.is_discarded() || !arguments.is_object() ||
        arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) !=
            call.arguments) {
      InvariantViolated("a call's arguments are not a compact JSON object",
                        absl::StrCat(context, "\narguments: ", call.arguments));
    }
    if (call.name.empty() || call.id.empty()) {
      InvariantViolated("a call without a name or an id", context);
    }
  }
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
