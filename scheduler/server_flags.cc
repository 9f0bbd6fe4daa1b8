// conveyor-scheduler's command-line flags, and the one place that reads them into a
// ServerConfig. Linked into the binary only (tests build configs directly).
#include "scheduler/server_flags.h"

#include <filesystem>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address for the client API (0.0.0.0: all).");
ABSL_FLAG(int, port, 50051, "Port for the client API (gRPC); 0 picks a free one.");
ABSL_FLAG(int, metrics_port, 9400, "Port for Prometheus metrics (/metrics); 0 disables.");
ABSL_FLAG(std::string, model, "",
          "Model the workers load: a directory (Hugging Face layout) or one .gguf file, "
          "which then also gives the tokenizer and chat template.");
ABSL_FLAG(std::string, served_model_name, "",
          "The model's name in the APIs and the metrics' model label (a request's \"model\"); "
          "empty: the --model directory's or file's name. Replicas behind one router serve "
          "one name.");
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
ABSL_FLAG(std::string, speculative_method, "off",
          "Speculative decoding: off; ngram (prompt lookup: tokens that followed the last n "
          "tokens where they occurred before in the prompt or output); suffix (what followed "
          "the longest suffix that occurred before, any length); draft (a small model of the "
          "same tokenizer, --speculative_model, run by the workers). Outputs are the same as "
          "without it; see docs/speculative-decoding.md.");
ABSL_FLAG(std::string, speculative_model, "",
          "--speculative_method=draft: the draft model's directory (or .gguf file) as the "
          "workers see it; its vocabulary must be the model's.");
ABSL_FLAG(int, num_speculative_tokens, 4, "Speculative decoding: most draft tokens per step.");
ABSL_FLAG(int, prompt_lookup_min, 2, "ngram and suffix: shortest suffix matched.");
ABSL_FLAG(int, prompt_lookup_max, 4, "ngram: longest suffix matched (tried first).");
ABSL_FLAG(int, speculative_max_batch, 8,
          "Speculative decoding: decodes in a step above which none gets drafts (a large "
          "batch is no longer bound by reading the weights).");
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
ABSL_FLAG(std::string, chat_template, "",
          "A Jinja chat template file that replaces the model's templates for every chat "
          "request (vLLM's --chat-template); empty: the model's own.");
ABSL_FLAG(std::string, tool_call_format, "auto",
          "The syntax the model writes tool calls in: llama3_json, hermes, mistral, or auto "
          "(recognised from the chat template). Requests with tools need one.");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "How chat outputs are split into reasoning_content and content (docs/reasoning.md): "
          "none, qwen3, deepseek_r1, or auto (recognised from the chat template: <think> in "
          "it).");
ABSL_FLAG(int, max_reasoning_tokens, 0,
          "Reasoning tokens a chat request may spend before the server ends its thinking "
          "(</think>) and lets the answer follow, for requests that set no "
          "max_reasoning_tokens; 0: no budget.");
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

namespace conveyor::scheduler {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// A random identity for a scheduler not given one (128 bits, hex).
std::string RandomSchedulerId() {
  std::random_device random;
  return absl::StrCat(
      absl::Hex(static_cast<uint64_t>(random()) << 32 | random(), absl::kZeroPad16),
      absl::Hex(static_cast<uint64_t>(random()) << 32 | random(), absl::kZeroPad16));
}

}  // namespace

absl::StatusOr<ServerConfig> ServerConfigFromFlags() {
  ServerConfig c;
  c.model_dir = absl::GetFlag(FLAGS_model);
  c.model_name = absl::GetFlag(FLAGS_served_model_name);
  if (c.model_name.empty()) {
    c.model_name = std::filesystem::path(c.model_dir).filename().string();
  }

  c.host = absl::GetFlag(FLAGS_host);
  c.port = absl::GetFlag(FLAGS_port);
  c.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  c.health_port = absl::GetFlag(FLAGS_health_port);
  c.enable_reflection = absl::GetFlag(FLAGS_enable_reflection);
  c.max_receive_bytes = absl::GetFlag(FLAGS_max_receive_bytes);
  c.client_tls = {absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                  absl::GetFlag(FLAGS_tls_client_ca_file), absl::GetFlag(FLAGS_tls_refresh_s)};
  c.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  c.max_concurrent_requests_per_token = absl::GetFlag(FLAGS_max_concurrent_requests_per_token);

  HttpTransport::Options& http = c.http;
  http.host = absl::GetFlag(FLAGS_http_host).empty() ? c.host : absl::GetFlag(FLAGS_http_host);
  http.port = absl::GetFlag(FLAGS_http_port);
  c.chat_template_file = absl::GetFlag(FLAGS_chat_template);
  c.tool_call_format = absl::GetFlag(FLAGS_tool_call_format);
  c.reasoning_parser = absl::GetFlag(FLAGS_reasoning_parser);
  c.max_reasoning_tokens = absl::GetFlag(FLAGS_max_reasoning_tokens);
  http.io_threads = absl::GetFlag(FLAGS_http_io_threads);
  http.offload_threads = absl::GetFlag(FLAGS_http_offload_threads);
  http.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  http.max_body_bytes = static_cast<size_t>(c.max_receive_bytes);
  http.max_buffered_body_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_http_max_buffered_body_bytes));
  http.idle_timeout = Millis(absl::GetFlag(FLAGS_http_idle_timeout_s));
  http.header_timeout = Millis(absl::GetFlag(FLAGS_http_header_timeout_s));
  http.body_timeout = Millis(absl::GetFlag(FLAGS_http_body_timeout_s));
  http.send_timeout = Millis(absl::GetFlag(FLAGS_http_send_timeout_s));

  c.policy.name = absl::GetFlag(FLAGS_policy);
  c.policy.limits.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  c.policy.limits.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  c.policy.batch_size = absl::GetFlag(FLAGS_batch_size);
  c.policy.batch_timeout_ms = absl::GetFlag(FLAGS_batch_timeout_ms);
  c.policy.batch_window_ms = absl::GetFlag(FLAGS_batch_window_ms);
  c.max_queue = absl::GetFlag(FLAGS_max_queue);
  c.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  c.block_size = absl::GetFlag(FLAGS_block_size);
  c.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  c.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  c.max_steps_in_flight = absl::GetFlag(FLAGS_max_steps_in_flight);
  c.speculative.method = absl::GetFlag(FLAGS_speculative_method);
  c.speculative.num_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  c.speculative.model = absl::GetFlag(FLAGS_speculative_model);
  c.speculative.ngram.min_n = absl::GetFlag(FLAGS_prompt_lookup_min);
  c.speculative.ngram.max_n = absl::GetFlag(FLAGS_prompt_lookup_max);
  c.speculative.max_batch = absl::GetFlag(FLAGS_speculative_max_batch);

  c.worker_addresses = absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipWhitespace());
  c.scheduler_id = absl::GetFlag(FLAGS_scheduler_id);
  if (c.scheduler_id.empty()) c.scheduler_id = RandomSchedulerId();
  c.worker_tls = {absl::GetFlag(FLAGS_worker_tls_cert_file),
                  absl::GetFlag(FLAGS_worker_tls_key_file), absl::GetFlag(FLAGS_worker_tls_ca_file),
                  absl::GetFlag(FLAGS_tls_refresh_s)};
  c.worker_tls_server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  c.worker_init_timeout = Millis(absl::GetFlag(FLAGS_worker_init_timeout_s));
  c.step_timeout = Millis(absl::GetFlag(FLAGS_step_timeout_s));
  c.worker_recovery_timeout = Millis(absl::GetFlag(FLAGS_worker_recovery_timeout_s));
  c.drain_timeout = Millis(absl::GetFlag(FLAGS_drain_timeout_s));
  c.log_level = absl::GetFlag(FLAGS_log_level);

  if (absl::Status valid = ValidateServerConfig(c); !valid.ok()) return valid;
  return c;
}

}  // namespace conveyor::scheduler
