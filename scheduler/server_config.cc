#include "scheduler/server_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {

absl::Status ValidateServerConfig(const ServerConfig& config) {
  if (config.model_dir.empty()) {
    return absl::InvalidArgumentError(
        "--model is required (the model directory or .gguf file the workers load)");
  }
  // A name a client can write in "model": printable, no spaces, not too long.
  if (config.model_name.empty() || config.model_name.size() > 256 ||
      std::any_of(config.model_name.begin(), config.model_name.end(),
                  [](unsigned char c) { return c <= ' ' || c == 0x7f; })) {
    return absl::InvalidArgumentError(
        absl::StrCat("--served_model_name must be 1 to 256 characters without spaces or control "
                     "characters, got \"",
                     absl::CHexEscape(config.model_name.substr(0, 300)), "\""));
  }
  if (config.max_steps_in_flight < 0 || config.max_steps_in_flight > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_steps_in_flight must be 0 (choose), 1 or 2, got ", config.max_steps_in_flight));
  }
  const Engine::Options::Speculative& spec = config.speculative;
  if (spec.method != "off" && spec.method != "ngram" && spec.method != "suffix" &&
      spec.method != "draft") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative_method must be off, ngram, suffix or draft, got \"", spec.method, "\""));
  }
  if (spec.method == "draft" && spec.model.empty()) {
    return absl::InvalidArgumentError(
        "--speculative_method=draft needs --speculative_model (the draft model's path as the "
        "workers see it)");
  }
  if (spec.method != "draft" && !spec.model.empty()) {
    return absl::InvalidArgumentError("--speculative_model is for --speculative_method=draft only");
  }
  if (spec.num_tokens < 1 || spec.num_tokens > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_speculative_tokens must be in [1, 32], got ", spec.num_tokens));
  }
  if (spec.ngram.min_n < 1 || spec.ngram.max_n < spec.ngram.min_n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt_lookup_min must be >= 1 and --prompt_lookup_max >= it, got ",
                     spec.ngram.min_n, " and ", spec.ngram.max_n));
  }
  if (spec.max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative_max_batch must be >= 1, got ", spec.max_batch));
  }
  if (config.worker_tls.any() && !config.worker_tls.complete()) {
    return absl::InvalidArgumentError(
        "mTLS to the workers needs all of --worker_tls_ca_file, --worker_tls_cert_file and "
        "--worker_tls_key_file");
  }
  if (config.max_reasoning_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_reasoning_tokens must be 0 (no budget) or positive, got ",
                     config.max_reasoning_tokens));
  }
  const HttpTransport::Options& http = config.http;
  if (http.port != 0 &&
      (http.io_threads < 1 || http.offload_threads < 1 || http.max_connections < 1 ||
       http.idle_timeout.count() <= 0 || http.header_timeout.count() <= 0 ||
       http.body_timeout.count() <= 0 || http.send_timeout.count() <= 0)) {
    return absl::InvalidArgumentError(
        "--http_io_threads, --http_offload_threads, --http_max_connections and the "
        "--http_*_timeout_s flags must be positive");
  }
  return absl::OkStatus();
}

WorkerGroup::Options MakeWorkerGroupOptions(const ServerConfig& config,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials) {
  WorkerGroup::Options options;
  options.addresses = config.worker_addresses;
  options.scheduler_id = config.scheduler_id;
  options.model_path = config.model_dir;
  if (config.speculative.method == "draft") options.draft_model_path = config.speculative.model;
  options.block_size = config.block_size;
  options.kv_cache_bytes = config.kv_cache_bytes;
  options.max_step_tokens = config.policy.limits.max_step_tokens;
  options.max_num_seqs = config.policy.limits.max_num_seqs;
  options.step_timeout = config.step_timeout;
  options.credentials = std::move(credentials);
  options.tls_server_name = config.worker_tls_server_name;
  return options;
}

ReplicaSettings MakeReplicaSettings(const ServerConfig& config, const WorkerGroup::Info& workers,
                                    int world_size, const TextFacts& text) {
  const worker::v1::ModelInfo& model = workers.model;
  ReplicaSettings s;

  s.policy = config.policy;
  s.policy.limits.max_context_tokens = model.max_context_tokens();
  s.policy.limits.max_scored_tokens = ScoredTokensFor(model.vocab_size());

  s.engine.num_kv_blocks = workers.num_kv_blocks;
  s.engine.block_size = workers.block_size;
  s.engine.enable_prefix_caching = config.enable_prefix_caching;
  s.engine.max_queue = config.max_queue;
  s.engine.max_context_tokens = model.max_context_tokens();
  // Overlapping the scheduler's work with a step pays where the workers' host cores are
  // free while it runs (an accelerator computes); with the CPU backend it takes cores
  // from the forward pass (measured: docs/design.md, "The scheduler loop").
  s.engine.max_steps_in_flight = config.max_steps_in_flight != 0
                                     ? config.max_steps_in_flight
                                     : (workers.computes_on_host_cores ? 1 : 2);
  if (s.engine.max_steps_in_flight > 1 && !workers.orders_steps) {
    spdlog::warn(
        "a worker rank does not order the steps it gets (an older conveyor-worker): one step "
        "in flight at a time");
    s.engine.max_steps_in_flight = 1;
  }
  s.engine.worker_recovery_timeout = config.worker_recovery_timeout;
  s.engine.speculative = config.speculative;
  s.engine.speculative.max_step_tokens = config.policy.limits.max_step_tokens;
  if (s.engine.speculative.enabled() && s.engine.max_steps_in_flight > 1) {
    spdlog::info(
        "speculative decoding: one step in flight at a time (how many tokens a step keeps is "
        "known only from its answer)");
    s.engine.max_steps_in_flight = 1;
  }

  s.limits.vocab_size = model.vocab_size();
  s.limits.max_context_tokens = model.max_context_tokens();
  s.limits.kv_capacity_tokens = workers.num_kv_blocks * workers.block_size;
  s.limits.eos_token_ids.assign(model.eos_token_ids().begin(), model.eos_token_ids().end());
  s.limits.bos_token_id = model.bos_token_id();
  s.limits.default_max_new_tokens = config.default_max_new_tokens;

  v1::ModelInfoResponse& m = s.model_info;
  m.set_model(config.model_name);
  m.set_architecture(model.architecture());
  m.set_vocab_size(model.vocab_size());
  m.set_max_context_tokens(model.max_context_tokens());
  m.set_num_layers(model.num_layers());
  m.set_num_parameters(model.num_parameters());
  m.set_tensor_parallel_size(world_size);
  m.set_policy(config.policy.name);
  m.set_kv_block_size(workers.block_size);
  m.set_num_kv_blocks(workers.num_kv_blocks);
  m.set_max_num_seqs(config.policy.limits.max_num_seqs);
  m.set_default_max_new_tokens(config.default_max_new_tokens);
  m.set_bos_token_id(model.bos_token_id());
  m.mutable_eos_token_ids()->Add(model.eos_token_ids().begin(), model.eos_token_ids().end());
  m.set_pad_token_id(text.pad_token_id);
  m.set_tokenizer(text.tokenizer_kind);
  m.set_has_chat_template(text.has_chat_template);
  return s;
}

}  // namespace conveyor::scheduler
