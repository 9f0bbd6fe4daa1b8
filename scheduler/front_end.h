// Which client front end a request came through: the gRPC service (api_service.h) or the
// OpenAI-compatible HTTP API (http/). Carried by each Request so request-level metrics can
// say which front end their requests used; the set is closed, so it is a safe label.
#pragma once

#include <string_view>

namespace conveyor::scheduler {

enum class FrontEnd { kGrpc, kHttp };

// "grpc" or "http": the `api` label value of the metrics (docs/metrics.md).
constexpr std::string_view FrontEndName(FrontEnd front_end) {
  return front_end == FrontEnd::kHttp ? "http" : "grpc";
}

}  // namespace conveyor::scheduler
