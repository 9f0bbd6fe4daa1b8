// The scheduler's configuration: what ValidateServerConfig refuses (naming the flag),
// and that what the workers report reaches every part from one place.
#include "scheduler/server_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ServerConfig ValidConfig() {
  ServerConfig config;
  config.model_dir = "/models/tiny";
  config.model_name = "tiny";
  config.worker_addresses = {"127.0.0.1:50061", "127.0.0.1:50062"};
  return config;
}

TEST(ServerConfigTest, DefaultsWithAModelAreValid) {
  EXPECT_TRUE(ValidateServerConfig(ValidConfig()).ok());
}

TEST(ServerConfigTest, RefusalsNameTheFlagToFix) {
  struct Case {
    const char* what;
    void (*change)(ServerConfig&);
    const char* flag;
  };
  const Case cases[] = {
      {"no model", [](ServerConfig& c) { c.model_dir.clear(); }, "--model"},
      {"a model name with a space", [](ServerConfig& c) { c.model_name = "my model"; },
       "--served_model_name"},
      {"an empty model name", [](ServerConfig& c) { c.model_name.clear(); }, "--served_model_name"},
      {"a 257-character model name", [](ServerConfig& c) { c.model_name.assign(257, 'm'); },
       "--served_model_name"},
      {"3 steps in flight", [](ServerConfig& c) { c.max_steps_in_flight = 3; },
       "--max_steps_in_flight"},
      {"-1 steps in flight", [](ServerConfig& c) { c.max_steps_in_flight = -1; },
       "--max_steps_in_flight"},
      {"worker CA alone", [](ServerConfig& c) { c.worker_tls.ca_file = "ca.pem"; },
       "--worker_tls_cert_file"},
      {"an unknown proposer", [](ServerConfig& c) { c.speculative.method = "eagle"; },
       "--speculative_method"},
      {"33 draft tokens", [](ServerConfig& c) { c.speculative.num_tokens = 33; },
       "--num_speculative_tokens"},
      {"lookup max below min",
       [](ServerConfig& c) {
         c.speculative.ngram.min_n = 3;
         c.speculative.ngram.max_n = 2;
       },
       "--prompt_lookup_max"},
      {"no batch for drafts", [](ServerConfig& c) { c.speculative.max_batch = 0; },
       "--speculative_max_batch"},
      {"a draft method without a draft model",
       [](ServerConfig& c) { c.speculative.method = "draft"; }, "needs --speculative_model"},
      {"a draft model for another method",
       [](ServerConfig& c) {
         c.speculative.method = "ngram";
         c.speculative.model = "/models/draft";
       },
       "--speculative_model is for --speculative_method=draft only"},
      {"HTTP without I/O threads",
       [](ServerConfig& c) {
         c.http.port = 8000;
         c.http.io_threads = 0;
       },
       "--http_io_threads"},
      {"HTTP with a zero idle timeout",
       [](ServerConfig& c) {
         c.http.port = 8000;
         c.http.idle_timeout = std::chrono::milliseconds(0);
       },
       "--http_*_timeout_s"},
  };
  for (const Case& c : cases) {
    ServerConfig config = ValidConfig();
    c.change(config);
    const absl::Status status = ValidateServerConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(c.flag)) << c.what;
  }
}

TEST(ServerConfigTest, HttpSettingsDoNotMatterWhileItIsOff) {
  ServerConfig config = ValidConfig();
  config.http.port = 0;
  config.http.io_threads = 0;
  EXPECT_TRUE(ValidateServerConfig(config).ok());
}

TEST(ServerConfigTest, WorkerGroupOptionsCarryTheStepLimits) {
  ServerConfig config = ValidConfig();
  config.policy.limits.max_num_seqs = 12;
  config.policy.limits.max_step_tokens = 512;
  config.block_size = 32;
  config.kv_cache_bytes = 1 << 20;
  config.scheduler_id = "s1";
  const WorkerGroup::Options options = MakeWorkerGroupOptions(config, nullptr);
  EXPECT_THAT(options.addresses, ElementsAre("127.0.0.1:50061", "127.0.0.1:50062"));
  EXPECT_EQ(options.model_path, "/models/tiny");
  EXPECT_EQ(options.max_num_seqs, 12);
  EXPECT_EQ(options.max_step_tokens, 512);
  EXPECT_EQ(options.block_size, 32);
  EXPECT_EQ(options.kv_cache_bytes, 1u << 20);
  EXPECT_EQ(options.scheduler_id, "s1");
  EXPECT_EQ(options.credentials, nullptr);
  EXPECT_EQ(options.draft_model_path, "");
  config.speculative.method = "draft";
  config.speculative.model = "/models/draft";
  EXPECT_EQ(MakeWorkerGroupOptions(config, nullptr).draft_model_path, "/models/draft");
}

WorkerGroup::Info Workers(bool on_host_cores, bool orders_steps) {
  WorkerGroup::Info info;
  info.model.set_architecture("LlamaForCausalLM");
  info.model.set_vocab_size(1000);
  info.model.set_max_context_tokens(2048);
  info.model.set_bos_token_id(1);
  info.model.add_eos_token_ids(2);
  info.model.add_eos_token_ids(7);
  info.num_kv_blocks = 100;
  info.block_size = 16;
  info.computes_on_host_cores = on_host_cores;
  info.orders_steps = orders_steps;
  return info;
}

TEST(ServerConfigTest, TheModelsContextReachesEveryPart) {
  ServerConfig config = ValidConfig();
  config.default_max_new_tokens = 99;
  const ReplicaSettings s =
      MakeReplicaSettings(config, Workers(false, true), 2, {0, "sentencepiece", true});
  EXPECT_EQ(s.policy.limits.max_context_tokens, 2048);
  EXPECT_EQ(s.engine.max_context_tokens, 2048);
  EXPECT_EQ(s.limits.max_context_tokens, 2048);
  EXPECT_EQ(s.model_info.max_context_tokens(), 2048);
  EXPECT_EQ(s.engine.num_kv_blocks, 100);
  EXPECT_EQ(s.engine.block_size, 16);
  EXPECT_EQ(s.limits.kv_capacity_tokens, 1600);
  EXPECT_THAT(s.limits.eos_token_ids, ElementsAre(2, 7));
  EXPECT_EQ(s.limits.default_max_new_tokens, 99);
  EXPECT_EQ(s.model_info.model(), "tiny");
  EXPECT_EQ(s.model_info.tensor_parallel_size(), 2);
  EXPECT_EQ(s.model_info.tokenizer(), "sentencepiece");
  EXPECT_TRUE(s.model_info.has_chat_template());
  EXPECT_THAT(s.model_info.eos_token_ids(), ElementsAre(2, 7));
}

TEST(ServerConfigTest, StepsInFlightFollowWhereTheWorkersCompute) {
  const ServerConfig chosen = ValidConfig();  // max_steps_in_flight 0: choose.
  EXPECT_EQ(MakeReplicaSettings(chosen, Workers(true, true), 1, {}).engine.max_steps_in_flight, 1);
  EXPECT_EQ(MakeReplicaSettings(chosen, Workers(false, true), 1, {}).engine.max_steps_in_flight, 2);
  // Workers that do not order steps get one at a time, whatever was asked.
  ServerConfig two = ValidConfig();
  two.max_steps_in_flight = 2;
  EXPECT_EQ(MakeReplicaSettings(two, Workers(true, true), 1, {}).engine.max_steps_in_flight, 2);
  EXPECT_EQ(MakeReplicaSettings(two, Workers(false, false), 1, {}).engine.max_steps_in_flight, 1);
  // Speculating, one step at a time (a step's kept drafts are known from its answer);
  // the engine gets the step budget the drafts count against.
  two.speculative.method = "ngram";
  two.policy.limits.max_step_tokens = 512;
  const ReplicaSettings spec = MakeReplicaSettings(two, Workers(false, true), 1, {});
  EXPECT_EQ(spec.engine.max_steps_in_flight, 1);
  EXPECT_EQ(spec.engine.speculative.max_step_tokens, 512);
}

}  // namespace
}  // namespace conveyor::scheduler
