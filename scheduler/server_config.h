// conveyor-scheduler's configuration in one value: read from the command line in one
// place (scheduler/server_flags.cc), checked in one place (ValidateServerConfig), and
// turned into each part's options in one place. What depends on the model the workers
// loaded (its context length, the KV cache they made, whether they can overlap steps) is
// derived once, when they answer (ReplicaSettings), so that the policy, the engine, the
// request limits and ModelInfo cannot disagree.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "conveyor.pb.h"
#include "rpc/grpc_tls.h"
#include "scheduler/engine.h"
#include "scheduler/http/http_transport.h"
#include "scheduler/policy.h"
#include "scheduler/request_builder.h"
#include "scheduler/worker_group.h"

namespace conveyor::scheduler {

struct ServerConfig {
  // The model the workers load, a directory (Hugging Face layout) or a .gguf file (which
  // then also holds the tokenizer and chat template), and the name the APIs give the
  // model (--served_model_name, else the directory's or file's name).
  std::string model_dir;
  std::string model_name;

  // The client APIs.
  std::string host = "127.0.0.1";
  int port = 50051;         // gRPC; 0 picks a free one.
  int metrics_port = 9400;  // 0: no metrics endpoint.
  int health_port = 0;      // Plaintext gRPC health only; 0: none.
  bool enable_reflection = false;
  int max_receive_bytes = 16 << 20;  // Largest request message (and HTTP body).
  TlsFiles client_tls;               // ca_file set: mTLS.
  std::string auth_tokens_file;      // Empty: no authentication.
  int max_concurrent_requests_per_token = 0;
  // The OpenAI-compatible HTTP API: off while http.port is 0. Its host is resolved (the
  // client API's unless set) and its body limit is max_receive_bytes.
  HttpTransport::Options http;
  // A Jinja file that replaces the model's chat templates (all of them); empty: none.
  std::string chat_template_file;
  // The syntax the model writes tool calls in ("llama3_json", "hermes", "mistral"), or
  // "auto": recognised from the chat template (docs/structured-output.md).
  std::string tool_call_format = "auto";
  // How chat outputs are split into reasoning and answer ("none", "qwen3",
  // "deepseek_r1"), or "auto": recognised from the chat template; and the reasoning
  // budget of chat requests that set none (0: none) (docs/reasoning.md).
  std::string reasoning_parser = "auto";
  int max_reasoning_tokens = 0;

  // Batching and the KV cache.
  PolicyOptions policy;  // Its max_context_tokens comes with the model (ReplicaSettings).
  int max_queue = 1024;
  int default_max_new_tokens = 256;
  int block_size = 16;
  uint64_t kv_cache_bytes = 0;  // Per rank; 0: each worker sizes it.
  bool enable_prefix_caching = true;
  int max_steps_in_flight = 0;  // 0 chooses (ReplicaSettings).
  // Speculative decoding (max_step_tokens is filled in from the policy's limits).
  Engine::Options::Speculative speculative;

  // The workers.
  std::vector<std::string> worker_addresses;  // Rank 0 first.
  std::string scheduler_id;
  TlsFiles worker_tls;  // mTLS to the workers: all three files, or none.
  std::string worker_tls_server_name;
  std::chrono::milliseconds worker_init_timeout{600'000};
  std::chrono::milliseconds step_timeout{60'000};
  std::chrono::milliseconds worker_recovery_timeout{120'000};
  std::chrono::milliseconds drain_timeout{30'000};
  std::string log_level = "info";
};

// What the flags' types cannot check: required values, ranges and combinations.
// INVALID_ARGUMENT names the flag to fix.
absl::Status ValidateServerConfig(const ServerConfig& config);

// The worker group's options; `credentials` are made from config.worker_tls (null:
// plaintext).
WorkerGroup::Options MakeWorkerGroupOptions(const ServerConfig& config,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials);

// The settings that depend on what the workers hold, all made here.
struct ReplicaSettings {
  PolicyOptions policy;
  Engine::Options engine;  // on_workers_ready is the caller's to set.
  ServingLimits limits;
  v1::ModelInfoResponse model_info;
};
// What the tokenizer and the chat template tell ModelInfo.
struct TextFacts {
  int pad_token_id = -1;
  std::string tokenizer_kind;
  bool has_chat_template = false;
};
ReplicaSettings MakeReplicaSettings(const ServerConfig& config, const WorkerGroup::Info& workers,
                                    int world_size, const TextFacts& text);

}  // namespace conveyor::scheduler
