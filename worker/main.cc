// conveyor-worker: serves one tensor-parallel rank of a model over gRPC
// (proto/worker.proto). The scheduler tells it what to load (Init) and what to run (Step).
#include <unistd.h>

#include <csignal>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "model/cpu/cpu_device.h"
#include "model/cuda/cuda_device.h"
#include "prometheus/registry.h"
#include "rpc/grpc_servers.h"
#include "rpc/grpc_tls.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "worker/grpc_rendezvous.h"
#include "worker/metrics_server.h"
#include "worker/service.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for all interfaces).");
ABSL_FLAG(int, port, 50061, "Port to listen on; 0 picks a free one (printed on stdout).");
ABSL_FLAG(std::string, unix_socket, "",
          "Also serve on this Unix socket path (a scheduler on the same machine then uses "
          "--workers=unix:PATH). A bare round trip costs about half of loopback TCP's; end "
          "to end no consistent gain was measured (docs/step-protocol.md).");
ABSL_FLAG(int, metrics_port, 9401, "Port for Prometheus metrics (/metrics); 0 disables.");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu, or cuda (needs a CUDA build).");
ABSL_FLAG(int, device, 0, "CUDA device for --backend=cuda.");
ABSL_FLAG(double, gpu_memory_fraction, 0.85,
          "cuda: share of the free device memory (after weights) for the KV cache when the "
          "scheduler does not set kv_cache_bytes.");
ABSL_FLAG(bool, device_sampling, true,
          "cuda: sample on the GPU (only token ids are copied back); false copies each "
          "sampled row's logits to the host and samples there.");
ABSL_FLAG(bool, cuda_graphs, false,
          "cuda: replay CUDA graphs for decode-only steps (captured per padded batch size "
          "and block-table width on first use); cuts kernel-launch cost at small batches.");
ABSL_FLAG(int, threads, 0, "CPU backend threads; 0 uses one per core.");
ABSL_FLAG(std::string, cpu_weight_dtype, "auto",
          "cpu: how linear-layer weights are stored: f32, bf16 (half the bytes), int8 "
          "(weight-only, per-channel scales: a quarter), gguf (a GGUF file's Q8_0/Q4_0/Q4_K/"
          "Q5_K/Q6_K blocks as they are), or auto (for such a GGUF file its blocks where the "
          "CPU has AVX-512 VNNI, else int8; bf16 for a bf16/f16 checkpoint where the kernels "
          "compute in bf16 (AVX512-BF16); else f32).");
ABSL_FLAG(std::string, cpu_kv_dtype, "auto",
          "cpu: how the KV cache is stored: f32, bf16 (half the bytes: twice the context per "
          "GiB, and decode attention reads half), or auto (bf16 where the weights are bf16 or "
          "int8, f32 where they are f32).");
ABSL_FLAG(std::string, collective_host, "",
          "Address the other tensor-parallel ranks reach this one at (cpu: Gloo's rendezvous "
          "store and TCP pairs). Empty: --host, or this machine's hostname when --host is "
          "0.0.0.0.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off.");
ABSL_FLAG(double, rendezvous_timeout_s, 60,
          "Longest an Init waits for the other tensor-parallel ranks to join.");
ABSL_FLAG(double, binding_lease_s, 30,
          "The worker serves the scheduler that initialised it, and accepts another only after "
          "that one has made no call for this long.");
ABSL_FLAG(int, max_receive_bytes, 64 << 20, "Largest request message the worker accepts.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "mTLS: this worker's PEM certificate (presented to the scheduler and to the other "
          "ranks). Needs --tls_key_file and --tls_ca_file.");
ABSL_FLAG(std::string, tls_key_file, "", "mTLS: the private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "mTLS: the CA whose certificates callers (the scheduler, the other ranks) must "
          "present; others are refused during the handshake.");
ABSL_FLAG(int, tls_refresh_s, 60,
          "How often the certificate files are re-read, so rotated ones are used without a "
          "restart.");
ABSL_FLAG(int, health_port, 0,
          "Plaintext port that serves only gRPC health, for probes that cannot speak TLS "
          "(the kubelet's); 0 disables.");

namespace {

// Stops the worker on SIGINT/SIGTERM as if Shutdown had been called.
void WaitForSignalThenShutdown(conveyor::worker::WorkerService* service, sigset_t signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("received signal {}, shutting down", sig);
  service->RequestShutdown();
}

// --collective_host, defaulted as its help says.
std::string CollectiveHost() {
  std::string host = absl::GetFlag(FLAGS_collective_host);
  if (!host.empty()) return host;
  host = absl::GetFlag(FLAGS_host);
  if (host != "0.0.0.0" && host != "::" && host != "[::]") return host;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

conveyor::TlsFiles TlsFilesFromFlags() {
  return conveyor::TlsFiles{absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                            absl::GetFlag(FLAGS_tls_ca_file), absl::GetFlag(FLAGS_tls_refresh_s)};
}

// The worker port's credentials: mTLS from the --tls_* flags (all three), or plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials() {
  const conveyor::TlsFiles files = TlsFilesFromFlags();
  if (!files.any()) return grpc::InsecureServerCredentials();
  if (!files.complete()) {
    return absl::InvalidArgumentError(
        "mTLS needs all of --tls_cert_file, --tls_key_file and --tls_ca_file: a worker "
        "verifies every caller's certificate");
  }
  return conveyor::MakeTlsServerCredentials(files, conveyor::ClientCertificates::kRequired);
}

// The device --backend names, configured from the flags that apply to it.
absl::StatusOr<std::unique_ptr<conveyor::model::Device>> MakeDevice(const std::string& name) {
  if (name == "cpu") {
    // The kernels' instruction set is fixed for the process on first use: refuse a
    // CONVEYOR_CPU_ISA that would be ignored, and say what runs.
    if (std::string error = conveyor::model::CpuIsaEnvironmentError(); !error.empty()) {
      return absl::InvalidArgumentError(error);
    }
    spdlog::info("CPU kernels: {}", conveyor::model::CpuKernelsSummary());
    conveyor::model::CpuDeviceOptions cpu;
    cpu.num_threads = absl::GetFlag(FLAGS_threads);
    ASSIGN_OR_RETURN(cpu.weights,
                     conveyor::model::ParseCpuWeightChoice(absl::GetFlag(FLAGS_cpu_weight_dtype)));
    ASSIGN_OR_RETURN(cpu.kv, conveyor::model::ParseCpuKvChoice(absl::GetFlag(FLAGS_cpu_kv_dtype)));
    cpu.collective_host = CollectiveHost();
    // The ranks meet through a store rank 0 serves over gRPC, with the workers' mTLS.
    cpu.rendezvous = conveyor::worker::MakeGrpcRendezvous(TlsFilesFromFlags());
    return conveyor::model::MakeCpuDevice(cpu);
  }
  if (name == "cuda") {
    conveyor::model::CudaDeviceOptions cuda;
    cuda.device = absl::GetFlag(FLAGS_device);
    cuda.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
    cuda.device_sampling = absl::GetFlag(FLAGS_device_sampling);
    cuda.decode_graphs = absl::GetFlag(FLAGS_cuda_graphs);
    return conveyor::model::MakeCudaDevice(cuda);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be cpu or cuda, got \"", name, "\""));
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "Serves one rank of a Llama-family model to a conveyor-scheduler over gRPC.\n"
      "Usage: conveyor-worker [--host=127.0.0.1] [--port=50061] [--threads=N]");
  absl::ParseCommandLine(argc, argv);
  // Logs go to stderr; stdout carries only the "listening on" line that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("conveyor"));
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));

  // A write to a socket whose peer is gone must fail with EPIPE, not end the process:
  // Gloo writes to the other ranks with plain writev, so without this a rank killed
  // mid-all-reduce took the ranks writing to it down too (silently, by SIGPIPE), and the
  // group could not recover. With it the collective fails, the step is UNAVAILABLE, and
  // the scheduler re-initialises the group (docs/failure-handling.md).
  std::signal(SIGPIPE, SIG_IGN);

  // Signals go to the waiting thread only; block them before gRPC starts its threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  conveyor::worker::WorkerMetrics metrics(*registry);
  std::unique_ptr<conveyor::worker::MetricsServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) != 0) {
    auto started = conveyor::worker::MetricsServer::Start(
        absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_metrics_port), registry);
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      return 1;
    }
    metrics_server = *std::move(started);
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials();
  if (!credentials.ok()) {
    spdlog::error("TLS: {}", std::string(credentials.status().message()));
    return 2;
  }
  absl::StatusOr<std::unique_ptr<conveyor::model::Device>> device =
      MakeDevice(absl::GetFlag(FLAGS_backend));
  if (!device.ok()) {
    spdlog::error("{}", device.status().ToString());
    return 2;
  }
  conveyor::worker::WorkerService::Options options;
  options.metrics = &metrics;
  options.rendezvous_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_rendezvous_timeout_s) * 1000));
  options.binding_lease =
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_binding_lease_s) * 1000));
  conveyor::worker::WorkerService service(*std::move(device), options);

  grpc::EnableDefaultHealthCheckService(true);
  // Health alone, in plaintext, for probes: it says whether this process serves, which
  // is what a kubelet restarts on, and nothing a caller could abuse.
  std::unique_ptr<conveyor::HealthOnlyServer> health_server;
  if (absl::GetFlag(FLAGS_health_port) != 0) {
    auto started = conveyor::HealthOnlyServer::Start(
        absl::GetFlag(FLAGS_host) + ":" + std::to_string(absl::GetFlag(FLAGS_health_port)));
    if (!started.ok()) {
      spdlog::error("{} (--health_port)", std::string(started.status().message()));
      return 1;
    }
    health_server = *std::move(started);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address =
      absl::GetFlag(FLAGS_host) + ":" + std::to_string(absl::GetFlag(FLAGS_port));
  builder.AddListeningPort(address, *credentials, &port);
  const std::string unix_socket = absl::GetFlag(FLAGS_unix_socket);
  int unix_bound = 0;
  if (!unix_socket.empty()) {
    builder.AddListeningPort("unix:" + unix_socket, *credentials, &unix_bound);
  }
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_receive_bytes));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("cannot listen on {}", address);
    return 1;
  }
  if (!unix_socket.empty() && unix_bound == 0) {
    spdlog::error("cannot listen on the Unix socket {} (--unix_socket)", unix_socket);
    return 1;
  }
  if (!unix_socket.empty()) spdlog::info("conveyor-worker also serving on unix:{}", unix_socket);
  // Tests and scripts read this line to find the port.
  std::printf("conveyor-worker listening on %s:%d\n", absl::GetFlag(FLAGS_host).c_str(), port);
  std::fflush(stdout);
  spdlog::info("conveyor-worker listening on {}:{} ({})", absl::GetFlag(FLAGS_host), port,
               TlsFilesFromFlags().any() ? "mTLS" : "plaintext");
  if (!TlsFilesFromFlags().any()) {
    // Once, here: the binding (worker/service.h) keeps a second scheduler out, but on a
    // plaintext port anyone can present an identity, so the first to Init a free worker
    // gets it.
    spdlog::warn(
        "no mTLS: any caller that reaches port {} first can bind this worker with an Init "
        "and drive it, or hold it while it calls within --binding_lease_s; set "
        "--tls_cert_file, --tls_key_file and --tls_ca_file here and --worker_tls_cert_file, "
        "--worker_tls_key_file and --worker_tls_ca_file on the scheduler (docs/security.md)",
        port);
  }

  std::thread signal_thread(WaitForSignalThenShutdown, &service, signals);
  signal_thread.detach();
  service.WaitForShutdownRequest();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  spdlog::info("conveyor-worker stopped");
  return 0;
}
