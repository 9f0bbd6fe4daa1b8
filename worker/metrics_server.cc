#include "worker/metrics_server.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace conveyor::worker {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsServer> metrics(new MetricsServer());
  metrics->registry_ = std::move(registry);
  metrics->server_ = std::make_unique<httplib::Server>();
  prometheus::Registry* collected = metrics->registry_.get();
  metrics->server_->Get("/metrics", [collected](const httplib::Request&, httplib::Response& res) {
    std::ostringstream page;
    prometheus::TextSerializer().Serialize(page, collected->Collect());
    res.set_content(page.str(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (!metrics->server_->bind_to_port(host, port)) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host, ":", port, " (--metrics_port)"));
  }
  httplib::Server* server = metrics->server_.get();
  metrics->listener_ = std::thread([server] { server->listen_after_bind(); });
  return metrics;
}

MetricsServer::~MetricsServer() {
  if (server_ != nullptr) {
    // stop() does nothing until the loop runs: wait for it first.
    while (listener_.joinable() && !server_->is_running()) std::this_thread::yield();
    server_->stop();
  }
  if (listener_.joinable()) listener_.join();
}

}  // namespace conveyor::worker
