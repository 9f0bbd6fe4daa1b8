#include "tests/support/server_process.h"

#include <random>
#include <regex>
#include <thread>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {

using namespace std::chrono_literals;

Server::Server(std::vector<std::string> flags, bool start_worker) {
  std::string workers = "127.0.0.1:" + std::to_string(FreePort());  // Nobody there.
  if (start_worker) {
    auto worker =
        Subprocess::Start({WorkerBinary(), "--port=0", "--metrics_port=0", "--threads=2"});
    EXPECT_TRUE(worker.has_value());
    worker_.emplace(std::move(*worker));
    const auto line = worker_->WaitForLine("listening on", 30s);
    EXPECT_TRUE(line.has_value());
    workers = "127.0.0.1:" + std::to_string(PortFromListeningLine(line.value_or("")));
    worker_->DrainStdout();
  }
  worker_address_ = workers;
  // FreePort's port can be taken by another test before the scheduler binds it; the
  // scheduler then exits with an error, and a new port is tried.
  std::optional<std::string> line;
  for (int attempt = 0; attempt < 3 && !line.has_value(); ++attempt) {
    metrics_port_ = FreePort();
    std::vector<std::string> argv = {SchedulerBinary(),
                                     "--port=0",
                                     "--metrics_port=" + std::to_string(metrics_port_),
                                     "--model=" + TestModelDir("llama3_gqa"),
                                     "--workers=" + workers,
                                     "--block_size=4"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto scheduler = Subprocess::Start(argv);
    EXPECT_TRUE(scheduler.has_value());
    scheduler_.reset();
    scheduler_.emplace(std::move(*scheduler));
    line = scheduler_->WaitForLine("listening on", 30s);
  }
  EXPECT_TRUE(line.has_value());
  scheduler_->DrainStdout();
  channel_ =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(PortFromListeningLine(line.value_or(""))),
                          grpc::InsecureChannelCredentials());
  stub_ = v1::Conveyor::NewStub(channel_);
}

std::optional<v1::ModelInfoResponse> Server::ModelInfo() {
  grpc::ClientContext context;
  v1::ModelInfoResponse info;
  if (!stub_->GetModelInfo(&context, v1::ModelInfoRequest(), &info).ok()) return std::nullopt;
  return info;
}

bool Server::WaitReady() {
  for (int i = 0; i < 300; ++i) {
    if (ModelInfo().has_value()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

Stream Server::Generate(const v1::GenerateRequest& request, std::chrono::milliseconds timeout,
                        const std::function<bool(const Stream&)>& cancel_when) {
  Stream s;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub_->Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    s.tokens.insert(s.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    s.text += response.text();
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) s.last = response;
    s.messages.push_back(response);
    if (cancel_when && cancel_when(s)) context.TryCancel();
  }
  s.status = reader->Finish();
  return s;
}

std::optional<std::string> Server::MetricsPage() { return HttpGet(metrics_port_, "/metrics"); }

double Server::Metric(const std::string& name) {
  const auto page = MetricsPage();
  if (!page) return -1;
  const std::regex line("^" + name + "(\\{[^}]*\\})? ([0-9.e+-]+)$", std::regex::multiline);
  std::smatch m;
  if (!std::regex_search(*page, m, line)) return -1;
  return std::stod(m[2]);
}

double Server::MetricSettled(const std::string& name, double expected,
                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  double value = Metric(name);
  while (value != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    value = Metric(name);
  }
  return value;
}

double Server::MetricSum(const std::string& name) {
  const auto page = MetricsPage();
  if (!page) return -1;
  const std::regex line("^" + name + "(\\{[^}]*\\})? ([0-9.e+-]+)$", std::regex::multiline);
  double sum = 0;
  for (auto it = std::sregex_iterator(page->begin(), page->end(), line);
       it != std::sregex_iterator(); ++it) {
    sum += std::stod((*it)[2]);
  }
  return sum;
}

v1::GenerateRequest Greedy(std::vector<int32_t> prompt, int max_new) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_new_tokens(max_new);
  r.set_temperature(0);
  r.set_ignore_eos(true);
  return r;
}

std::vector<v1::GenerateRequest> MixedRequests(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<v1::GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (int32_t& t : prompt) t = 3 + rng() % 500;
    out.push_back(Greedy(prompt, 1 + rng() % 24));
  }
  return out;
}

std::vector<Stream> RunConcurrently(Server& server,
                                    const std::vector<v1::GenerateRequest>& requests) {
  std::vector<Stream> out(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = server.Generate(requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

}  // namespace conveyor::testing
