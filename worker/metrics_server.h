// The worker's Prometheus endpoint: GET /metrics on cpp-httplib, the registry written in
// Prometheus' text format.
//
// Not prometheus::Exposer, as the scheduler uses: its civetweb starts threads with a fixed
// 100 KiB stack, and a worker built with CUDA carries the CUDA libraries' static TLS
// (cuBLASLt alone ~94 KiB, ~122 KiB in all), which glibc places on every thread's stack.
// Those threads then cannot be created and Exposer throws, so a CUDA build could not serve
// metrics at all. httplib's threads get the default stack.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}
namespace prometheus {
class Registry;
}

namespace conveyor::worker {

class MetricsServer {
 public:
  // Serves `registry` at http://host:port/metrics until destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
};

}  // namespace conveyor::worker
