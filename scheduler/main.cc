// conveyor-scheduler: the process clients talk to. It initialises the worker ranks of one
// model replica, then runs the batching loop and serves the streaming Generate API,
// gRPC health and reflection, and Prometheus metrics.
#include <csignal>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
#include "scheduler/token_auth.h"
#include "scheduler/worker_group.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "text/jinja/chat_template.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address for the client API (0.0.0.0: all).");
ABSL_FLAG(int, port, 50051, "Port for the client API (gRPC); 0 picks a free one.");
ABSL_FLAG(int, metrics_port, 9400, "Port for Prometheus metrics (/metrics); 0 disables.");
ABSL_FLAG(std::string, model, "", "Model directory (Hugging Face layout) the workers load.");
ABSL_FLAG(std::string, workers, "127.0.0.1:50061",
          "Comma-separated host:port of the worker ranks, rank 0 first.");
ABSL_FLAG(std::string, policy, "continuous", "Batching policy: continuous, static or dynamic.");
ABSL_FLAG(int, max_num_seqs, 64, "Most sequences in one step (and in a static/dynamic batch).");
ABSL_FLAG(int, max_step_tokens, 2048, "Token budget of one step (prefill chunks + decodes).");
ABSL_FLAG(int, block_size, 16, "Tokens per KV-cache block.");
ABSL_FLAG(uint64_t, kv_cache_bytes, 0,
          "KV-cache bytes per worker rank; 0 lets each worker size it from its free memory.");
ABSL_FLAG(bool, enable_prefix_caching, true, "Reuse the KV of repeated prompt prefixes.");
ABSL_FLAG(int, max_queue, 1024,
          "Requests waiting for admission before new ones get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, default_max_new_tokens, 256, "max_new_tokens when a request leaves it unset.");
ABSL_FLAG(int, batch_size, 8, "static: requests per batch.");
ABSL_FLAG(double, batch_timeout_ms, 100, "static: longest wait for a full batch.");
ABSL_FLAG(double, batch_window_ms, 10, "dynamic: collection window after the first arrival.");
ABSL_FLAG(double, drain_timeout_s, 30,
          "On SIGTERM: how long in-flight requests may finish before they are ended.");
ABSL_FLAG(double, worker_init_timeout_s, 600, "How long to wait for the workers to initialise.");
ABSL_FLAG(double, step_timeout_s, 60,
          "A step the workers do not answer in this time counts as a worker failure (a hung "
          "rank).");
ABSL_FLAG(int, max_steps_in_flight, 0,
          "Steps sent to the workers and not yet answered: 2 plans and sends the next step "
          "while the last one runs (the workers never wait for the scheduler; a request that "
          "stops is computed once more), 1 waits for each answer first, 0 chooses: 1 when a "
          "worker computes on its host's CPU cores (the CPU backend), else 2.");
ABSL_FLAG(double, worker_recovery_timeout_s, 120,
          "After a worker failure, how long requests wait for the workers to be back (resumed "
          "by recompute) before they fail with UNAVAILABLE.");
ABSL_FLAG(std::string, scheduler_id, "",
          "Identity presented to the workers, which serve only the scheduler that initialised "
          "them. Set a stable secret one (the Helm chart does) so a restarted scheduler takes "
          "its workers back at once; empty: a random one, and a restarted scheduler waits out "
          "the workers' --binding_lease_s.");
ABSL_FLAG(int, max_receive_bytes, 16 << 20,
          "Largest client request message accepted (a longer prompt is INVALID_ARGUMENT).");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off.");
ABSL_FLAG(int, http_port, 0,
          "Port for the OpenAI-compatible HTTP API (docs/http-api.md); 0 disables it.");
ABSL_FLAG(std::string, http_host, "", "Address for the HTTP API; empty means --host.");
ABSL_FLAG(int, http_io_threads, 2,
          "Threads that serve every HTTP connection's I/O (connections cost memory, not "
          "threads).");
ABSL_FLAG(int, http_offload_threads, 2,
          "Threads that parse, render (chat template) and tokenize HTTP requests.");
ABSL_FLAG(int, http_max_connections, 16384,
          "Most HTTP connections open at once; one more is answered 503 and closed. Capped "
          "by the open-files limit (ulimit -n).");
ABSL_FLAG(double, http_idle_timeout_s, 60,
          "How long an HTTP connection may wait, idle, for its next request.");
ABSL_FLAG(double, http_header_timeout_s, 10,
          "How long a request's headers may take to arrive from its first byte (408 after).");
ABSL_FLAG(double, http_body_timeout_s, 60,
          "How long a request's body may take to arrive after its headers (408 after).");
ABSL_FLAG(double, http_send_timeout_s, 60,
          "How long a write to an HTTP client may wait for it to read; longer, and a streamed "
          "request counts as abandoned (cancelled).");
ABSL_FLAG(uint64_t, http_max_buffered_body_bytes, 256ull << 20,
          "Bytes of HTTP request bodies being received or parsed at once, all connections "
          "together; a body that does not fit is answered 503 (retry).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate for the client APIs (gRPC and HTTP). With --tls_key_file they "
          "serve TLS only; a plaintext client is refused.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "mTLS on the client APIs: clients must present a certificate issued by this CA.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer tokens the client APIs require, one per line: <token> [<name> "
          "[<max_concurrent>]] (docs/security.md). Re-read when it changes. Empty: no "
          "authentication.");
ABSL_FLAG(int, max_concurrent_requests_per_token, 0,
          "Generate calls one token may have in flight (a line of the tokens file may set "
          "its own); more get RESOURCE_EXHAUSTED. 0: no limit.");
ABSL_FLAG(bool, enable_reflection, false,
          "Serve gRPC server reflection on the client port (for grpcurl and the like).");
ABSL_FLAG(int, health_port, 0,
          "Plaintext port that serves only gRPC health, for probes that cannot speak TLS "
          "(the kubelet's); 0 disables. Health is also served on --port.");
ABSL_FLAG(std::string, worker_tls_ca_file, "",
          "mTLS to the workers: the CA that issued their certificates. Needs "
          "--worker_tls_cert_file and --worker_tls_key_file, the scheduler's own certificate "
          "(issued by the CA the workers trust).");
ABSL_FLAG(std::string, worker_tls_cert_file, "",
          "mTLS to the workers: this scheduler's certificate.");
ABSL_FLAG(std::string, worker_tls_key_file, "", "mTLS to the workers: its private key.");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "Name the workers' certificates must carry; empty: each --workers host.");
ABSL_FLAG(int, tls_refresh_s, 60,
          "How often the gRPC certificate files are re-read, so rotated ones are used "
          "without a restart.");

namespace {

using conveyor::scheduler::Engine;
using conveyor::scheduler::WorkerGroup;
namespace v1 = conveyor::v1;

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
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientCredentials() {
  conveyor::TlsFiles files{absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                           absl::GetFlag(FLAGS_tls_client_ca_file),
                           absl::GetFlag(FLAGS_tls_refresh_s)};
  if (!files.any()) return grpc::InsecureServerCredentials();
  return conveyor::MakeTlsServerCredentials(files, files.ca_file.empty()
                                                       ? conveyor::ClientCertificates::kNotRequested
                                                       : conveyor::ClientCertificates::kRequired);
}

// The channels to the workers: mTLS from the --worker_tls_* flags, or null (plaintext).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> WorkerCredentials() {
  conveyor::TlsFiles files{
      absl::GetFlag(FLAGS_worker_tls_cert_file), absl::GetFlag(FLAGS_worker_tls_key_file),
      absl::GetFlag(FLAGS_worker_tls_ca_file), absl::GetFlag(FLAGS_tls_refresh_s)};
  if (!files.any()) return nullptr;
  if (!files.complete()) {
    return absl::InvalidArgumentError(
        "mTLS to the workers needs all of --worker_tls_ca_file, --worker_tls_cert_file and "
        "--worker_tls_key_file");
  }
  return conveyor::MakeTlsChannelCredentials(files);
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "Serves streaming text generation over gRPC, batching requests onto model workers.\n"
      "Usage: conveyor-scheduler --model=DIR --workers=HOST:PORT[,HOST:PORT...] [flags]");
  absl::ParseCommandLine(argc, argv);
  // Logs go to stderr; stdout carries only the "listening on" line that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("conveyor"));
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  const sigset_t signals = BlockTerminationSignals();

  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    spdlog::error("--model is required (the model directory the workers load)");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<conveyor::Tokenizer>> tokenizer =
      conveyor::Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) {
    spdlog::error("cannot load the tokenizer: {}", tokenizer.status().ToString());
    return 2;
  }
  // A chat template the interpreter cannot run fails here, naming its line, rather than
  // at the first chat request.
  absl::StatusOr<std::unique_ptr<conveyor::jinja::ChatTemplate>> chat_template =
      conveyor::jinja::LoadChatTemplate(model_dir);
  if (!chat_template.ok()) {
    spdlog::error("cannot load the chat template: {}", chat_template.status().ToString());
    return 2;
  }
  const int max_steps_in_flight = absl::GetFlag(FLAGS_max_steps_in_flight);
  if (max_steps_in_flight < 0 || max_steps_in_flight > 2) {
    spdlog::error("--max_steps_in_flight must be 0 (choose), 1 or 2, got {}", max_steps_in_flight);
    return 2;
  }
  conveyor::scheduler::PolicyOptions policy_options;
  policy_options.name = absl::GetFlag(FLAGS_policy);
  policy_options.limits.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  policy_options.limits.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  policy_options.batch_size = absl::GetFlag(FLAGS_batch_size);
  policy_options.batch_timeout_ms = absl::GetFlag(FLAGS_batch_timeout_ms);
  policy_options.batch_window_ms = absl::GetFlag(FLAGS_batch_window_ms);
  auto policy = conveyor::scheduler::MakePolicy(policy_options);
  if (!policy.ok()) {
    spdlog::error("{}", policy.status().ToString());
    return 2;
  }

  // Security settings are checked before anything listens: a bad file stops us here.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> client_credentials = ClientCredentials();
  if (!client_credentials.ok()) {
    spdlog::error("client API TLS: {}", std::string(client_credentials.status().message()));
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker_credentials =
      WorkerCredentials();
  if (!worker_credentials.ok()) {
    spdlog::error("worker mTLS: {}", std::string(worker_credentials.status().message()));
    return 2;
  }
  std::unique_ptr<conveyor::scheduler::TokenAuthenticator> authenticator;
  if (!absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
    conveyor::scheduler::TokenAuthenticator::Options auth_options;
    auth_options.tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
    auth_options.default_max_concurrent = absl::GetFlag(FLAGS_max_concurrent_requests_per_token);
    auto created = conveyor::scheduler::TokenAuthenticator::Create(auth_options);
    if (!created.ok()) {
      spdlog::error("--auth_tokens_file: {}", std::string(created.status().message()));
      return 2;
    }
    authenticator = *std::move(created);
  }
  const bool client_tls = !absl::GetFlag(FLAGS_tls_cert_file).empty();
  if (!client_tls && authenticator != nullptr && absl::GetFlag(FLAGS_host) != "127.0.0.1") {
    spdlog::warn("bearer tokens are checked, but without TLS they cross the network in clear");
  }

  const std::string model_name = std::filesystem::path(model_dir).filename().string();
  auto registry = std::make_shared<prometheus::Registry>();
  conveyor::scheduler::SchedulerMetrics metrics(*registry, model_name, absl::GetFlag(FLAGS_policy));
  std::unique_ptr<prometheus::Exposer> exposer;
  if (absl::GetFlag(FLAGS_metrics_port) != 0) {
    const std::string address =
        absl::GetFlag(FLAGS_host) + ":" + std::to_string(absl::GetFlag(FLAGS_metrics_port));
    // prometheus-cpp reports a port it cannot bind by throwing; say which flag to fix
    // instead of aborting.
    try {
      exposer = std::make_unique<prometheus::Exposer>(address);
    } catch (const std::exception& e) {
      spdlog::error("cannot serve metrics on {} (--metrics_port): {}", address, e.what());
      return 1;
    }
    exposer->RegisterCollectable(registry);
    spdlog::info("metrics on http://{}/metrics", address);
  }

  // Serve health (NOT_SERVING until the workers are ready) from the start.
  conveyor::scheduler::ApiService api(tokenizer->get(), v1::ModelInfoResponse(), &metrics);
  api.SetAuthenticator(authenticator.get());
  grpc::EnableDefaultHealthCheckService(true);
  // Registers reflection for every server (also done at load); WithoutReflection below
  // takes it off unless --enable_reflection.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::unique_ptr<conveyor::HealthOnlyServer> health_server;
  if (absl::GetFlag(FLAGS_health_port) != 0) {
    const std::string health_address =
        absl::GetFlag(FLAGS_host) + ":" + std::to_string(absl::GetFlag(FLAGS_health_port));
    auto started = conveyor::HealthOnlyServer::Start(health_address);
    if (!started.ok()) {
      spdlog::error("{} (--health_port)", std::string(started.status().message()));
      return 1;
    }
    health_server = *std::move(started);
    spdlog::info("gRPC health (plaintext) on {}", health_address);
  }
  grpc::ServerBuilder builder;
  if (!absl::GetFlag(FLAGS_enable_reflection)) conveyor::WithoutReflection(&builder);
  int port = 0;
  const std::string address =
      absl::GetFlag(FLAGS_host) + ":" + std::to_string(absl::GetFlag(FLAGS_port));
  builder.AddListeningPort(address, *client_credentials, &port);
  builder.RegisterService(&api);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_receive_bytes));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("cannot listen on {}", address);
    return 1;
  }
  // Health says the same on both ports.
  auto set_health = [health = server->GetHealthCheckService(),
                     plain = health_server.get()](bool serving) {
    health->SetServingStatus(serving);
    if (plain != nullptr) plain->SetServing(serving);
  };
  set_health(false);

  // The HTTP API answers from the start too (/health says 503 until the workers are ready),
  // and is listening before the line that tells scripts the scheduler is up.
  std::unique_ptr<conveyor::scheduler::HttpServer> http;
  if (absl::GetFlag(FLAGS_http_port) != 0) {
    conveyor::scheduler::HttpServer::Options http_options;
    conveyor::scheduler::HttpTransport::Options& transport = http_options.transport;
    transport.host = absl::GetFlag(FLAGS_http_host).empty() ? absl::GetFlag(FLAGS_host)
                                                            : absl::GetFlag(FLAGS_http_host);
    transport.port = absl::GetFlag(FLAGS_http_port);
    transport.io_threads = absl::GetFlag(FLAGS_http_io_threads);
    transport.offload_threads = absl::GetFlag(FLAGS_http_offload_threads);
    transport.max_connections = absl::GetFlag(FLAGS_http_max_connections);
    transport.max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_receive_bytes));
    transport.max_buffered_body_bytes =
        static_cast<size_t>(absl::GetFlag(FLAGS_http_max_buffered_body_bytes));
    const auto ms = [](double s) {
      return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    };
    transport.idle_timeout = ms(absl::GetFlag(FLAGS_http_idle_timeout_s));
    transport.header_timeout = ms(absl::GetFlag(FLAGS_http_header_timeout_s));
    transport.body_timeout = ms(absl::GetFlag(FLAGS_http_body_timeout_s));
    transport.send_timeout = ms(absl::GetFlag(FLAGS_http_send_timeout_s));
    if (transport.io_threads < 1 || transport.offload_threads < 1 ||
        transport.max_connections < 1 || transport.idle_timeout.count() <= 0 ||
        transport.header_timeout.count() <= 0 || transport.body_timeout.count() <= 0 ||
        transport.send_timeout.count() <= 0) {
      spdlog::error(
          "--http_io_threads, --http_offload_threads, --http_max_connections and the "
          "--http_*_timeout_s flags must be positive");
      return 2;
    }
    http_options.model_dir = model_dir;
    http_options.model_name = model_name;
    http_options.model_aliases = {model_dir};
    http_options.chat_template = chat_template->get();
    http =
        std::make_unique<conveyor::scheduler::HttpServer>(http_options, tokenizer->get(), &metrics);
    http->SetAuthenticator(authenticator.get());
    if (client_tls) {
      http->SetTls(absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                   absl::GetFlag(FLAGS_tls_client_ca_file), absl::GetFlag(FLAGS_tls_refresh_s));
    }
    if (absl::Status started = http->Start(); !started.ok()) {
      spdlog::error("{}", started.ToString());
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      return 1;
    }
    spdlog::info("OpenAI-compatible HTTP API on {}://{}:{}/v1", client_tls ? "https" : "http",
                 transport.host, http->port());
  }

  std::printf("conveyor-scheduler listening on %s:%d\n", absl::GetFlag(FLAGS_host).c_str(), port);
  std::fflush(stdout);
  spdlog::info(
      "conveyor-scheduler listening on {}:{} (policy {}, model {}; {}{}{})",
      absl::GetFlag(FLAGS_host), port, absl::GetFlag(FLAGS_policy), model_dir,
      client_tls ? (absl::GetFlag(FLAGS_tls_client_ca_file).empty() ? "TLS" : "mTLS") : "plaintext",
      authenticator != nullptr ? ", bearer tokens" : "",
      *worker_credentials != nullptr ? ", mTLS to the workers" : "");

  WorkerGroup::Options worker_options;
  worker_options.scheduler_id = absl::GetFlag(FLAGS_scheduler_id);
  if (worker_options.scheduler_id.empty()) {
    std::random_device random;
    worker_options.scheduler_id =
        absl::StrCat(absl::Hex(static_cast<uint64_t>(random()) << 32 | random(), absl::kZeroPad16),
                     absl::Hex(static_cast<uint64_t>(random()) << 32 | random(), absl::kZeroPad16));
  }
  worker_options.addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipWhitespace());
  worker_options.model_path = model_dir;
  worker_options.block_size = absl::GetFlag(FLAGS_block_size);
  worker_options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  worker_options.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  worker_options.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  worker_options.step_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_step_timeout_s) * 1000));
  worker_options.credentials = *worker_credentials;
  worker_options.tls_server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  WorkerGroup workers(worker_options);

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

  const auto init_deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                             absl::GetFlag(FLAGS_worker_init_timeout_s) * 1000));
  absl::StatusOr<WorkerGroup::Info> info = workers.Initialize(init_deadline);
  if (!info.ok() && stop_requested) {
    // Nothing was accepted yet, so there is nothing to drain.
    spdlog::info("stopped before the workers were ready");
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 0;
  }
  if (!info.ok()) {
    spdlog::error("the workers did not initialise: {}", info.status().ToString());
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 1;
  }
  const v1::ModelInfoResponse model_info = [&] {
    v1::ModelInfoResponse m;
    m.set_model(model_name);
    m.set_architecture(info->model.architecture());
    m.set_vocab_size(info->model.vocab_size());
    m.set_max_context_tokens(info->model.max_context_tokens());
    m.set_num_layers(info->model.num_layers());
    m.set_num_parameters(info->model.num_parameters());
    m.set_tensor_parallel_size(workers.world_size());
    m.set_policy(absl::GetFlag(FLAGS_policy));
    m.set_kv_block_size(info->block_size);
    m.set_num_kv_blocks(info->num_kv_blocks);
    m.set_max_num_seqs(absl::GetFlag(FLAGS_max_num_seqs));
    m.set_default_max_new_tokens(absl::GetFlag(FLAGS_default_max_new_tokens));
    m.set_bos_token_id(info->model.bos_token_id());
    m.mutable_eos_token_ids()->Add(info->model.eos_token_ids().begin(),
                                   info->model.eos_token_ids().end());
    m.set_pad_token_id((*tokenizer)->pad_id());
    m.set_tokenizer(std::string((*tokenizer)->kind()));
    m.set_has_chat_template(*chat_template != nullptr);
    return m;
  }();

  // Made again now that the workers told us the model's context.
  policy_options.limits.max_context_tokens = info->model.max_context_tokens();
  policy = conveyor::scheduler::MakePolicy(policy_options);

  Engine::Options engine_options;
  engine_options.num_kv_blocks = info->num_kv_blocks;
  engine_options.block_size = info->block_size;
  engine_options.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  engine_options.max_queue = absl::GetFlag(FLAGS_max_queue);
  engine_options.max_context_tokens = info->model.max_context_tokens();
  // Overlapping the scheduler's work with a step pays where the workers' host cores are
  // free while it runs (an accelerator computes); with the CPU backend it takes cores
  // from the forward pass (measured: docs/design.md, "The scheduler loop").
  engine_options.max_steps_in_flight =
      max_steps_in_flight != 0 ? max_steps_in_flight : (info->computes_on_host_cores ? 1 : 2);
  if (engine_options.max_steps_in_flight > 1 && !info->orders_steps) {
    spdlog::warn(
        "a worker rank does not order the steps it gets (an older conveyor-worker): one step "
        "in flight at a time");
    engine_options.max_steps_in_flight = 1;
  }
  engine_options.worker_recovery_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_worker_recovery_timeout_s) * 1000));
  // Health and the metrics follow the workers: NOT_SERVING from a failure until they
  // are back, so an orchestrator sees the outage.
  engine_options.on_workers_ready = [&](bool ready) {
    set_health(ready);
    metrics.SetWorkersReady(ready ? workers.world_size() : 0);
    if (http != nullptr) http->SetServing(ready);
  };
  Engine engine(engine_options, std::move(*policy), &workers, tokenizer->get(), &metrics);
  engine.Start();

  conveyor::scheduler::ServingLimits limits;
  limits.vocab_size = info->model.vocab_size();
  limits.max_context_tokens = info->model.max_context_tokens();
  limits.kv_capacity_tokens = info->num_kv_blocks * info->block_size;
  limits.eos_token_ids.assign(info->model.eos_token_ids().begin(),
                              info->model.eos_token_ids().end());
  limits.bos_token_id = info->model.bos_token_id();
  limits.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  if (http != nullptr) {
    http->SetEngine(&engine, limits);
    http->SetServing(true);
  }
  api.SetEngine(&engine, limits, model_info);
  set_health(true);
  metrics.SetWorkersReady(workers.world_size());
  spdlog::info(
      "ready: {} ({} parameters) on {} worker rank(s) [{}]; KV cache {} blocks x {} "
      "tokens; policy {}; max_num_seqs {}; max_step_tokens {}; {} step(s) in flight",
      model_name, info->model.num_parameters(), workers.world_size(), info->backend,
      info->num_kv_blocks, info->block_size, absl::GetFlag(FLAGS_policy),
      absl::GetFlag(FLAGS_max_num_seqs), absl::GetFlag(FLAGS_max_step_tokens),
      engine_options.max_steps_in_flight);

  while (!stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // Drain: refuse new calls, let in-flight ones finish, then end what is left.
  set_health(false);
  if (http != nullptr) http->SetServing(false);
  engine.StartDrain();
  const auto drain_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_drain_timeout_s) * 1000));
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
