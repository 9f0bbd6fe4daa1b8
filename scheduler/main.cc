// conveyor-scheduler: the process clients talk to. It initialises the worker ranks of one
// model replica, then runs the batching loop and serves the streaming Generate API,
// gRPC health and reflection, Prometheus metrics and (optionally) the OpenAI-compatible
// HTTP API. Its flags and their checks are scheduler/server_flags.cc and server_config.h.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "rpc/grpc_servers.h"
#include "rpc/grpc_tls.h"
#include "scheduler/api_service.h"
#include "scheduler/engine.h"
#include "scheduler/http/http_server.h"
#include "scheduler/metrics.h"
#include "scheduler/policy.h"
#include "scheduler/server_config.h"
#include "scheduler/server_flags.h"
#include "scheduler/token_auth.h"
#include "scheduler/worker_group.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "text/jinja/chat_template.h"
#include "text/token_bytes.h"

namespace {

using conveyor::scheduler::Engine;
using conveyor::scheduler::ServerConfig;
using conveyor::scheduler::WorkerGroup;

// Exit codes: a configuration to fix, or a port that cannot be served.
constexpr int kBadConfig = 2;
constexpr int kCannotServe = 1;

// Blocks SIGINT/SIGTERM in every thread and returns the set, for sigwait.
sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The client port's credentials: TLS (or mTLS) from the --tls_* flags, or plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientCredentials(
    const conveyor::TlsFiles& files) {
  if (!files.any()) return grpc::InsecureServerCredentials();
  return conveyor::MakeTlsServerCredentials(files, files.ca_file.empty()
                                                       ? conveyor::ClientCertificates::kNotRequested
                                                       : conveyor::ClientCertificates::kRequired);
}

// The channels to the workers: mTLS from the --worker_tls_* flags, or null (plaintext).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> WorkerCredentials(
    const conveyor::TlsFiles& files) {
  if (!files.any()) return nullptr;
  return conveyor::MakeTlsChannelCredentials(files);
}

// The bearer-token check of --auth_tokens_file; null without one.
absl::StatusOr<std::unique_ptr<conveyor::scheduler::TokenAuthenticator>> MakeAuthenticator(
    const ServerConfig& config) {
  if (config.auth_tokens_file.empty()) return nullptr;
  conveyor::scheduler::TokenAuthenticator::Options options;
  options.tokens_file = config.auth_tokens_file;
  options.default_max_concurrent = config.max_concurrent_requests_per_token;
  return conveyor::scheduler::TokenAuthenticator::Create(options);
}

// Serves `registry` on --metrics_port (null when it is 0).
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const ServerConfig& config, const std::shared_ptr<prometheus::Registry>& registry) {
  if (config.metrics_port == 0) return nullptr;
  const std::string address = config.host + ":" + std::to_string(config.metrics_port);
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a port it cannot bind by throwing; say which flag to fix
  // instead of aborting.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, " (--metrics_port): ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  spdlog::info("metrics on http://{}/metrics", address);
  return exposer;
}

// The templates chat requests render through: the model's, or --chat_template's file in
// place of all of them (the model's are then not read: a broken one is a reason to replace
// it).
absl::StatusOr<conveyor::jinja::ChatTemplates> LoadTemplates(const ServerConfig& config) {
  if (config.chat_template_file.empty()) {
    return conveyor::jinja::LoadChatTemplates(config.model_dir);
  }
  conveyor::jinja::ChatTemplates templates;
  absl::StatusOr<std::unique_ptr<conveyor::jinja::ChatTemplate>> file =
      conveyor::jinja::LoadChatTemplateFile(config.chat_template_file);
  if (!file.ok()) return file.status();
  templates.chat = *std::move(file);
  spdlog::info("chat template: {} (--chat_template), instead of the model's",
               config.chat_template_file);
  return templates;
}

// The OpenAI-compatible HTTP API on --http_port, started (null when it is 0). It
// answers from the start (/health says 503 until the workers are ready).
absl::StatusOr<std::unique_ptr<conveyor::scheduler::HttpServer>> ServeHttp(
    const ServerConfig& config, const conveyor::Tokenizer* tokenizer,
    const conveyor::jinja::ChatTemplates& chat_templates,
    conveyor::scheduler::TokenAuthenticator* authenticator,
    conveyor::scheduler::SchedulerMetrics* metrics) {
  if (config.http.port == 0) return nullptr;
  conveyor::scheduler::HttpServer::Options options;
  options.transport = config.http;
  options.model_dir = config.model_dir;
  options.model_name = config.model_name;
  options.model_aliases = {config.model_dir};
  options.chat_template = chat_templates.chat.get();
  options.tool_use_template = chat_templates.tool_use.get();
  options.tool_call_format = config.tool_call_format;
  options.reasoning_parser = config.reasoning_parser;
  options.max_reasoning_tokens = config.max_reasoning_tokens;
  auto http = std::make_unique<conveyor::scheduler::HttpServer>(options, tokenizer, metrics);
  http->SetAuthenticator(authenticator);
  const conveyor::TlsFiles& tls = config.client_tls;
  const bool https = !tls.cert_file.empty();
  if (https) http->SetTls(tls.cert_file, tls.key_file, tls.ca_file, tls.refresh_s);
  if (absl::Status started = http->Start(); !started.ok()) return started;
  spdlog::info("OpenAI-compatible HTTP API on {}://{}:{}/v1", https ? "https" : "http",
               config.http.host, http->port());
  return http;
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "Serves streaming text generation over gRPC, batching requests onto model workers.\n"
      "Usage: conveyor-scheduler --model=DIR|FILE.gguf --workers=HOST:PORT[,HOST:PORT...] "
      "[flags]");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<ServerConfig> parsed = conveyor::scheduler::ServerConfigFromFlags();
  // Logs go to stderr; stdout carries only the "listening on" line that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("conveyor"));
  if (!parsed.ok()) {
    spdlog::error("{}", std::string(parsed.status().message()));
    return kBadConfig;
  }
  const ServerConfig& config = *parsed;
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  const sigset_t signals = BlockTerminationSignals();

  absl::StatusOr<std::unique_ptr<conveyor::Tokenizer>> tokenizer =
      conveyor::Tokenizer::Load(config.model_dir);
  if (!tokenizer.ok()) {
    spdlog::error("cannot load the tokenizer: {}", tokenizer.status().ToString());
    return kBadConfig;
  }
  // A chat template the interpreter cannot run fails here, naming its line, rather than
  // at the first chat request.
  absl::StatusOr<conveyor::jinja::ChatTemplates> chat_templates = LoadTemplates(config);
  if (!chat_templates.ok()) {
    spdlog::error("cannot load the chat template: {}", chat_templates.status().ToString());
    return kBadConfig;
  }
  if (!chat_templates->unused.empty()) {
    spdlog::info(
        "chat templates not used (only \"tool_use\" is chosen, for requests with tools): {}",
        absl::StrJoin(chat_templates->unused, ", "));
  }
  // The policy's settings are checked now; it is made again once the model is known.
  if (auto policy = conveyor::scheduler::MakePolicy(config.policy); !policy.ok()) {
    spdlog::error("{}", policy.status().ToString());
    return kBadConfig;
  }

  // Security settings are checked before anything listens: a bad file stops us here.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> client_credentials =
      ClientCredentials(config.client_tls);
  if (!client_credentials.ok()) {
    spdlog::error("client API TLS: {}", std::string(client_credentials.status().message()));
    return kBadConfig;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker_credentials =
      WorkerCredentials(config.worker_tls);
  if (!worker_credentials.ok()) {
    spdlog::error("worker mTLS: {}", std::string(worker_credentials.status().message()));
    return kBadConfig;
  }
  absl::StatusOr<std::unique_ptr<conveyor::scheduler::TokenAuthenticator>> authenticator =
      MakeAuthenticator(config);
  if (!authenticator.ok()) {
    spdlog::error("--auth_tokens_file: {}", std::string(authenticator.status().message()));
    return kBadConfig;
  }
  const bool client_tls = !config.client_tls.cert_file.empty();
  if (!client_tls && *authenticator != nullptr && config.host != "127.0.0.1") {
    spdlog::warn("bearer tokens are checked, but without TLS they cross the network in clear");
  }

  auto registry = std::make_shared<prometheus::Registry>();
  conveyor::scheduler::SchedulerMetrics metrics(*registry, config.model_name, config.policy.name);
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer = ServeMetrics(config, registry);
  if (!exposer.ok()) {
    spdlog::error("{}", std::string(exposer.status().message()));
    return kCannotServe;
  }

  // Serve health (NOT_SERVING until the workers are ready) from the start.
  conveyor::scheduler::ApiService api(tokenizer->get(), conveyor::v1::ModelInfoResponse(),
                                      &metrics);
  api.SetAuthenticator(authenticator->get());
  grpc::EnableDefaultHealthCheckService(true);
  // Registers reflection for every server (also done at load); WithoutReflection below
  // takes it off unless --enable_reflection.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::unique_ptr<conveyor::HealthOnlyServer> health_server;
  if (config.health_port != 0) {
    const std::string health_address = config.host + ":" + std::to_string(config.health_port);
    auto started = conveyor::HealthOnlyServer::Start(health_address);
    if (!started.ok()) {
      spdlog::error("{} (--health_port)", std::string(started.status().message()));
      return kCannotServe;
    }
    health_server = *std::move(started);
    spdlog::info("gRPC health (plaintext) on {}", health_address);
  }
  grpc::ServerBuilder builder;
  if (!config.enable_reflection) conveyor::WithoutReflection(&builder);
  int port = 0;
  const std::string address = config.host + ":" + std::to_string(config.port);
  builder.AddListeningPort(address, *client_credentials, &port);
  builder.RegisterService(&api);
  builder.SetMaxReceiveMessageSize(config.max_receive_bytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("cannot listen on {}", address);
    return kCannotServe;
  }
  // Health says the same on both ports.
  auto set_health = [health = server->GetHealthCheckService(),
                     plain = health_server.get()](bool serving) {
    health->SetServingStatus(serving);
    if (plain != nullptr) plain->SetServing(serving);
  };
  set_health(false);

  // Listening before the line that tells scripts the scheduler is up.
  absl::StatusOr<std::unique_ptr<conveyor::scheduler::HttpServer>> started_http =
      ServeHttp(config, tokenizer->get(), *chat_templates, authenticator->get(), &metrics);
  if (!started_http.ok()) {
    spdlog::error("{}", started_http.status().ToString());
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return kCannotServe;
  }
  std::unique_ptr<conveyor::scheduler::HttpServer> http = *std::move(started_http);

  std::printf("conveyor-scheduler listening on %s:%d\n", config.host.c_str(), port);
  std::fflush(stdout);
  spdlog::info("conveyor-scheduler listening on {}:{} (policy {}, model {}; {}{}{})", config.host,
               port, config.policy.name, config.model_dir,
               client_tls ? (config.client_tls.ca_file.empty() ? "TLS" : "mTLS") : "plaintext",
               *authenticator != nullptr ? ", bearer tokens" : "",
               *worker_credentials != nullptr ? ", mTLS to the workers" : "");

  WorkerGroup::Options worker_options =
      conveyor::scheduler::MakeWorkerGroupOptions(config, *worker_credentials);
  // Ids beyond the tokenizer's (a padded vocabulary) add nothing; the workers pad.
  worker_options.token_bytes = std::make_shared<const conveyor::TokenByteTable>(
      conveyor::MakeTokenByteTable(**tokenizer, (*tokenizer)->vocab_size()));
  WorkerGroup workers(std::move(worker_options));

  // Workers come up in their own time; a signal during the wait still stops us cleanly.
  std::atomic<bool> stop_requested{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("received signal {}: draining", sig);
    stop_requested = true;
    workers.CancelInitialize();  // No-op once the workers are up.
  });
  signal_thread.detach();

  absl::StatusOr<WorkerGroup::Info> info =
      workers.Initialize(std::chrono::system_clock::now() + config.worker_init_timeout);
  if (!info.ok() && stop_requested) {
    // Nothing was accepted yet, so there is nothing to drain.
    spdlog::info("stopped before the workers were ready");
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 0;
  }
  if (!info.ok()) {
    spdlog::error("the workers did not initialise: {}", info.status().ToString());
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return kCannotServe;
  }
  conveyor::scheduler::ReplicaSettings replica = conveyor::scheduler::MakeReplicaSettings(
      config, *info, workers.world_size(),
      {(*tokenizer)->pad_id(), std::string((*tokenizer)->kind()), chat_templates->chat != nullptr});
  auto policy = conveyor::scheduler::MakePolicy(replica.policy);
  if (!policy.ok()) {  // Checked at start; the model's context cannot make it invalid.
    spdlog::error("{}", policy.status().ToString());
    return kBadConfig;
  }

  // Health and the metrics follow the workers: NOT_SERVING from a failure until they
  // are back, so an orchestrator sees the outage.
  replica.engine.on_workers_ready = [&](bool ready) {
    set_health(ready);
    metrics.SetWorkersReady(ready ? workers.world_size() : 0);
    if (http != nullptr) http->SetServing(ready);
  };
  Engine engine(replica.engine, *std::move(policy), &workers, tokenizer->get(), &metrics);
  engine.Start();

  if (http != nullptr) {
    http->SetEngine(&engine, replica.limits, replica.model_info);
    http->SetServing(true);
  }
  api.SetEngine(&engine, replica.limits, replica.model_info);
  set_health(true);
  metrics.SetWorkersReady(workers.world_size());
  spdlog::info(
      "ready: {} ({} parameters) on {} worker rank(s) [{}]; KV cache {} blocks x {} "
      "tokens; policy {}; max_num_seqs {}; max_step_tokens {}; {} step(s) in flight",
      config.model_name, info->model.num_parameters(), workers.world_size(), info->backend,
      info->num_kv_blocks, info->block_size, config.policy.name, config.policy.limits.max_num_seqs,
      config.policy.limits.max_step_tokens, replica.engine.max_steps_in_flight);

  while (!stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // Drain: refuse new calls, let in-flight ones finish, then end what is left.
  set_health(false);
  if (http != nullptr) http->SetServing(false);
  engine.StartDrain();
  const auto drain_deadline = std::chrono::steady_clock::now() + config.drain_timeout;
  while (engine.num_live_requests() > 0 && std::chrono::steady_clock::now() < drain_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int left = engine.num_live_requests();
  if (left > 0) spdlog::warn("drain timeout: ending {} unfinished request(s)", left);
  engine.Stop(absl::UnavailableError("the server shut down before the request finished"));
  if (http != nullptr) http->Stop();  // Before `engine` goes: open streams point at it.
  // The engine has given every accepted call its final status: once the streams have
  // written it, close every connection at once. A deadline in the future would also wait
  // for clients that merely hold an idle channel to hang up.
  if (!api.WaitForStreamsToEnd(std::chrono::seconds(5))) {
    spdlog::warn("gRPC streams still writing after 5 s: ending them");
  }
  server->Shutdown(std::chrono::system_clock::now());
  health_server.reset();
  api.StopPreparing();  // Before `engine` goes: a prepared request may still be submitted.
  spdlog::info("conveyor-scheduler stopped");
  return 0;
}
