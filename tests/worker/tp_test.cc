// Tensor parallelism over Gloo. The sharded model gives the logits and greedy tokens of
// the unsharded one: as ranks on threads of this process (full logits compared), as two
// real conveyor-worker processes (top-20 log-probabilities compared, on the test
// checkpoints and the `small` preset), and through a conveyor-scheduler over two ranks.
//
// Two ranks sum the row-parallel layers in another order than one rank, so logits agree
// to rounding (kRelativeLogitTolerance), not bit for bit; a group's ranks agree exactly.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <span>
#include <thread>

#include "conveyor.grpc.pb.h"
#include "gtest/gtest.h"
#include "model/communicator.h"
#include "model/cpu/gloo_communicator.h"
#include "testing/random_weights.h"
#include "testing/subprocess.h"
#include "tests/support/scheduler_context.h"
#include "tests/support/test_support.h"
#include "worker.grpc.pb.h"
#include "worker/grpc_rendezvous.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
namespace wv1 = worker::v1;

constexpr int kBlockSize = 16;
constexpr int kDecodeSteps = 16;
constexpr int kNumLogprobs = 20;
// Largest difference allowed between a logit (or log-probability) of two ranks and of
// one, relative to the row's largest logit magnitude: float32 rounding of sums that grow
// with the logits (absolute differences reach 4e-5 on `small`, whose logits reach ~16),
// where a wrong shard would be off by O(1).
constexpr double kRelativeLogitTolerance = 1e-5;

// The largest |logit| of a row, at least 1 (so tiny rows keep an absolute tolerance).
double LogitScale(std::span<const float> logits) {
  double scale = 1.0;
  for (float x : logits) scale = std::max(scale, std::abs(static_cast<double>(x)));
  return scale;
}

// The models the tests run: the tiny checkpoints whose heads split over two ranks (all but
// qwen3_moe_norm_bf16, which has one KV head) and `small`.
std::vector<std::string> TpModels() {
  std::vector<std::string> models = TestModelVariants();
  std::erase(models, "qwen3_moe_norm_bf16");
  models.emplace_back("small");
  return models;
}

// The `small` preset, generated into the test data folder on first use (about 5 s).
std::string SmallModelDir() {
  std::string dir = TestDataDir() + "/small";
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  // Built aside and renamed, so an interrupted run leaves no half-written model.
  const std::string tmp = dir + ".tmp" + std::to_string(getpid());
  std::filesystem::remove_all(tmp);
  const std::string command = std::string("/usr/bin/python3 ") + CONVEYOR_MODEL_GEN +
                              " --preset small --out " + tmp + " >/dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::error_code error;
  std::filesystem::rename(tmp, dir, error);
  std::filesystem::remove_all(tmp);  // Left only if another run renamed first.
  return dir;
}

std::string ModelDir(const std::string& model) {
  return model == "small" ? SmallModelDir() : TestModelDir(model);
}

// The reference prompts of a tiny checkpoint (1 to 40 tokens, batched); for `small`,
// kept short, one prompt of 20 tokens.
std::vector<std::vector<int32_t>> Prompts(const std::string& model) {
  if (model != "small") return LoadReference(model).prompts;
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < 20; ++i) prompt.push_back(100 + 37 * i);
  return {prompt};
}

// --- Step requests --------------------------------------------------------------------

// Step requests that prefill `prompts` together (sequence i + 1 for prompt i), then decode
// every sequence greedily for `decode_steps` steps. Sets *num_blocks to the blocks used.
std::vector<wv1::StepRequest> GreedySteps(const std::vector<std::vector<int32_t>>& prompts,
                                          int decode_steps, int num_logprobs, int* num_blocks) {
  std::vector<wv1::StepRequest> steps(1 + decode_steps);
  int next_block = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    wv1::NewSequence* seq = steps[0].add_new_sequences();
    seq->set_seq_id(i + 1);
    seq->mutable_token_ids()->Add(prompts[i].begin(), prompts[i].end());
    seq->set_num_tokens(static_cast<int>(prompts[i].size()));
    seq->mutable_sampling()->set_num_logprobs(num_logprobs);
    const int tokens = static_cast<int>(prompts[i].size()) + decode_steps;
    for (int b = 0; b * kBlockSize < tokens; ++b) seq->add_block_ids(next_block++);
    for (int s = 1; s <= decode_steps; ++s) {
      wv1::RunningSequence* running = steps[s].add_running();
      running->set_seq_id(i + 1);
      running->set_num_tokens(1);
    }
  }
  for (size_t s = 0; s < steps.size(); ++s) steps[s].set_step_id(s);
  *num_blocks = next_block;
  return steps;
}

// --- Ranks in this process ------------------------------------------------------------

// One rank: a one-thread CPU backend, its communicator, model shard, KV cache and engine.
struct Rank {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::Communicator> comm;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::KvCache> cache;
  std::unique_ptr<worker::StepRunner> engine;
  LogitsRecorder logits;  // The engine's logits tap.
};

using ModelFactory = std::function<absl::StatusOr<std::unique_ptr<model::LlamaModel>>(
    kernels::Backend*, model::Communicator*)>;

// `world` ranks of the model `make_model` builds, connected over Gloo on loopback when
// `world` > 1. Fails the test (returns fewer ranks) on error.
std::vector<std::unique_ptr<Rank>> MakeGroup(int world, const ModelFactory& make_model,
                                             int num_blocks) {
  std::vector<std::unique_ptr<Rank>> ranks(world);
  for (auto& rank : ranks) rank = std::make_unique<Rank>();
  if (world == 1) {
    ranks[0]->comm = model::MakeSingleRankCommunicator();
  } else {
    // The worker's own rendezvous: a gRPC store on loopback.
    const std::shared_ptr<model::Rendezvous> rendezvous = worker::MakeGrpcRendezvous(TlsFiles());
    auto store = model::ServeGlooStore(*rendezvous, "127.0.0.1");
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return {};
    const std::string collective_id = model::GlooCollectiveId(**store);
    std::vector<absl::StatusOr<std::unique_ptr<model::Communicator>>> comms(world);
    std::vector<std::thread> threads;
    threads.reserve(world);
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        comms[r] = model::ConnectGloo(collective_id, r, world, "127.0.0.1",
                                      std::chrono::system_clock::now() + 30s, *rendezvous);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(comms[r].ok()) << comms[r].status();
      if (!comms[r].ok()) return {};
      ranks[r]->comm = *std::move(comms[r]);
    }
  }
  for (int r = 0; r < world; ++r) {
    Rank& rank = *ranks[r];
    rank.backend = kernels::MakeCpuBackend(1);
    auto model = make_model(rank.backend.get(), rank.comm.get());
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    rank.model = *std::move(model);
    const ModelConfig& c = rank.model->config();
    EXPECT_EQ(rank.model->local_num_kv_heads() * world, c.num_kv_heads);
    auto cache =
        model::KvCache::Create(rank.backend.get(), c.num_layers, rank.model->local_num_kv_heads(),
                               c.head_dim, kBlockSize, num_blocks);
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (!cache.ok()) return {};
    rank.cache = *std::move(cache);
    worker::StepRunner::Options options;
    options.tp_rank = r;
    rank.engine = std::make_unique<worker::StepRunner>(rank.model.get(), rank.cache.get(), options);
    rank.engine->set_logits_tap(&rank.logits);
  }
  return ranks;
}

// Runs `request` on every rank at once (their collectives pair up) and returns rank 0's
// response.
wv1::StepResponse StepAll(const std::vector<std::unique_ptr<Rank>>& ranks,
                          const wv1::StepRequest& request) {
  std::vector<wv1::StepResponse> responses(ranks.size());
  std::vector<absl::Status> statuses(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] { statuses[r] = ranks[r]->engine->Step(request, &responses[r]); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    if (r > 0) {
      EXPECT_EQ(responses[r].tokens_size(), 0) << "only rank 0 reports tokens";
    }
  }
  return responses[0];
}

// The largest differences seen between two ranks' and one rank's logits.
struct LogitDiff {
  double absolute = 0.0;
  double relative = 0.0;  // To the row's LogitScale.
  void Add(double diff, double scale) {
    absolute = std::max(absolute, diff);
    relative = std::max(relative, diff / scale);
  }
};

// Steps one rank and `world` ranks of the same model through greedy generation from
// `prompts` and compares: the same tokens, the same logits on every rank of the group,
// and logits within tolerance of one rank's.
LogitDiff CompareShardedLogits(int world, const ModelFactory& make_model,
                               const std::vector<std::vector<int32_t>>& prompts) {
  int num_blocks = 0;
  const std::vector<wv1::StepRequest> steps =
      GreedySteps(prompts, kDecodeSteps, /*num_logprobs=*/0, &num_blocks);
  const auto single = MakeGroup(1, make_model, num_blocks);
  const auto group = MakeGroup(world, make_model, num_blocks);
  LogitDiff diff;
  if (single.size() != 1 || group.size() != static_cast<size_t>(world)) return diff;
  const int vocab = single[0]->model->config().vocab_size;
  for (const wv1::StepRequest& step : steps) {
    const wv1::StepResponse expected = StepAll(single, step);
    const wv1::StepResponse actual = StepAll(group, step);
    EXPECT_EQ(actual.tokens_size(), expected.tokens_size());
    for (int i = 0; i < std::min(actual.tokens_size(), expected.tokens_size()); ++i) {
      const uint64_t seq = expected.tokens(i).seq_id();
      EXPECT_EQ(actual.tokens(i).token_id(), expected.tokens(i).token_id())
          << "sequence " << seq << ", step " << step.step_id();
      const std::span<const float> want = single[0]->logits.Last(seq);
      const std::span<const float> got = group[0]->logits.Last(seq);
      EXPECT_EQ(got.size(), static_cast<size_t>(vocab));
      if (got.size() != want.size()) continue;
      for (int r = 1; r < world; ++r) {
        const std::span<const float> other = group[r]->logits.Last(seq);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), other.begin(), other.end()))
            << "ranks 0 and " << r << " hold different logits for sequence " << seq;
      }
      const double scale = LogitScale(want);
      for (int v = 0; v < vocab; ++v) {
        diff.Add(std::abs(static_cast<double>(got[v]) - want[v]), scale);
      }
    }
  }
  EXPECT_LE(diff.relative, kRelativeLogitTolerance);
  return diff;
}

class TpShardingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TpShardingTest, TwoRanksGiveTheLogitsOfOne) {
  const std::string dir = ModelDir(GetParam());
  const LogitDiff diff = CompareShardedLogits(
      2,
      [&](kernels::Backend* backend, model::Communicator* comm) {
        return model::LlamaModel::Load(dir, backend, comm);
      },
      Prompts(GetParam()));
  std::printf("%s: max |logit(TP=2) - logit(TP=1)| = %.3g (%.3g of the largest |logit|)\n",
              GetParam().c_str(), diff.absolute, diff.relative);
}

INSTANTIATE_TEST_SUITE_P(Models, TpShardingTest, ::testing::ValuesIn(TpModels()));

// Random weights (the WeightSource slicing) with a vocabulary that three ranks split
// unevenly (the last shard padded) and an lm_head tied to the embedding.
TEST(TpShardingRandomTest, ThreeRanksWithPaddedVocabularyGiveTheLogitsOfOne) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 100;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_attention_heads = 6;
  c.num_kv_heads = 3;
  c.head_dim = 8;
  c.max_context_tokens = 256;
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = true;
  const auto weights = testing::MakeRandomWeightSource(7);
  const LogitDiff diff =
      CompareShardedLogits(3,
                           [&](kernels::Backend* backend, model::Communicator* comm) {
                             return model::LlamaModel::Create(c, *weights, backend, comm);
                           },
                           {{1, 5, 99, 42, 66, 67, 3}, {98, 97}, {34}});
  std::printf("random weights: max |logit(TP=3) - logit(TP=1)| = %.3g\n", diff.absolute);
}

// Claims a world size without connecting anyone: enough for the shape checks.
class UnconnectedCommunicator final : public model::Communicator {
 public:
  explicit UnconnectedCommunicator(int world) : world_(world) {}
  int rank() const override { return 0; }
  int world_size() const override { return world_; }
  absl::Status AllReduceSum(void*, size_t) override { return absl::InternalError("unused"); }
  absl::Status AllGather(void*, size_t) override { return absl::InternalError("unused"); }

 private:
  int world_;
};

TEST(TpShardingRandomTest, HeadsThatDoNotDivideAreInvalidArgument) {
  auto backend = kernels::MakeCpuBackend(1);
  UnconnectedCommunicator three(3);
  const auto model = model::LlamaModel::Load(TestModelDir("llama3_gqa"), backend.get(), &three);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("num_attention_heads"), std::string::npos)
      << model.status();
}

// --- Worker processes -----------------------------------------------------------------

// A conveyor-worker process and a client of it.
struct WorkerProcess {
  std::optional<Subprocess> process;
  std::string address;
  std::unique_ptr<wv1::Worker::Stub> stub;
};

std::unique_ptr<WorkerProcess> StartWorker() {
  auto w = std::make_unique<WorkerProcess>();
  // f32 weights, as the in-process rank they are compared with (auto would store an f16
  // checkpoint as bf16 on a CPU with AVX512-BF16).
  auto process = Subprocess::Start({WorkerBinary(), "--port=0", "--metrics_port=0", "--threads=1",
                                    "--log_level=warn", "--cpu_weight_dtype=f32"});
  EXPECT_TRUE(process.has_value());
  if (!process) return nullptr;
  w->process.emplace(std::move(*process));
  const auto line = w->process->WaitForLine("listening on", 30s);
  EXPECT_TRUE(line.has_value()) << "worker did not start";
  if (!line) return nullptr;
  w->process->DrainStdout();
  w->address = "127.0.0.1:" + std::to_string(PortFromListeningLine(*line));
  w->stub =
      wv1::Worker::NewStub(grpc::CreateChannel(w->address, grpc::InsecureChannelCredentials()));
  return w;
}

// Calls `call` on every worker at once (a group's ranks wait for each other).
template <typename Call>
std::vector<grpc::Status> OnAll(const std::vector<std::unique_ptr<WorkerProcess>>& workers,
                                Call call) {
  std::vector<grpc::Status> statuses(workers.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < workers.size(); ++r) {
    threads.emplace_back([&, r] {
      SchedulerContext context;
      context.set_deadline(std::chrono::system_clock::now() + 120s);
      statuses[r] = call(static_cast<int>(r), *workers[r]->stub, &context);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

// Inits `workers` as the ranks of one group, as the scheduler does: rank 0 creates the
// collective id, every rank's Init carries it.
std::vector<wv1::InitRequest> InitGroup(const std::vector<std::unique_ptr<WorkerProcess>>& workers,
                                        const std::string& model_dir,
                                        std::vector<wv1::InitResponse>* responses) {
  wv1::CreateCollectiveIdResponse id;
  {
    SchedulerContext context;
    const grpc::Status status =
        workers[0]->stub->CreateCollectiveId(&context, wv1::CreateCollectiveIdRequest(), &id);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  std::vector<wv1::InitRequest> requests(workers.size());
  for (size_t r = 0; r < workers.size(); ++r) {
    requests[r].set_model_path(model_dir);
    requests[r].set_tp_rank(static_cast<int>(r));
    requests[r].set_tp_world_size(static_cast<int>(workers.size()));
    requests[r].set_collective_id(id.collective_id());
    requests[r].set_block_size(kBlockSize);
    requests[r].set_kv_cache_bytes(16 << 20);
  }
  responses->resize(workers.size());
  const auto statuses =
      OnAll(workers, [&](int r, wv1::Worker::Stub& stub, grpc::ClientContext* context) {
        return stub.Init(context, requests[r], &(*responses)[r]);
      });
  for (size_t r = 0; r < workers.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].error_message();
  }
  return requests;
}

// Log-probabilities of a sampled token's alternatives, largest first: sorted values do
// not depend on how near-ties are ordered.
std::vector<float> SortedLogprobs(const wv1::SampledToken& token) {
  std::vector<float> values;
  for (const wv1::TokenLogprob& alt : token.top_logprobs()) values.push_back(alt.logprob());
  std::sort(values.rbegin(), values.rend());
  return values;
}

class TpWorkerProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TpWorkerProcessTest, TwoWorkersGiveTheTokensAndLogprobsOfOne) {
  const std::string dir = ModelDir(GetParam());
  int num_blocks = 0;
  const std::vector<wv1::StepRequest> steps =
      GreedySteps(Prompts(GetParam()), kDecodeSteps, kNumLogprobs, &num_blocks);

  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(StartWorker());
    ASSERT_NE(workers.back(), nullptr);
  }
  std::vector<wv1::InitResponse> inits;
  std::vector<wv1::InitRequest> init_requests = InitGroup(workers, dir, &inits);
  ASSERT_FALSE(HasFailure());
  EXPECT_GE(inits[0].num_kv_blocks(), num_blocks);
  const auto single = LocalWorker::Create(dir, 1, num_blocks, kBlockSize);
  ASSERT_NE(single, nullptr);

  LogitDiff diff;
  for (const wv1::StepRequest& step : steps) {
    wv1::StepResponse expected;
    ASSERT_TRUE(single->engine->Step(step, &expected).ok());
    std::vector<wv1::StepResponse> responses(workers.size());
    const auto statuses =
        OnAll(workers, [&](int r, wv1::Worker::Stub& stub, grpc::ClientContext* context) {
          return stub.Step(context, step, &responses[r]);
        });
    for (size_t r = 0; r < workers.size(); ++r) {
      ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].error_message();
    }
    EXPECT_EQ(responses[1].tokens_size(), 0);  // Only rank 0 reports tokens.
    ASSERT_EQ(responses[0].tokens_size(), expected.tokens_size());
    for (int i = 0; i < expected.tokens_size(); ++i) {
      const wv1::SampledToken& want = expected.tokens(i);
      const wv1::SampledToken& got = responses[0].tokens(i);
      EXPECT_EQ(got.token_id(), want.token_id()) << "sequence " << want.seq_id();
      const double scale = LogitScale(single->logits.Last(want.seq_id()));
      diff.Add(std::abs(static_cast<double>(got.logprob()) - want.logprob()), scale);
      const std::vector<float> got_top = SortedLogprobs(got);
      const std::vector<float> want_top = SortedLogprobs(want);
      ASSERT_EQ(got_top.size(), static_cast<size_t>(kNumLogprobs));
      ASSERT_EQ(want_top.size(), got_top.size());
      for (size_t k = 0; k < got_top.size(); ++k) {
        diff.Add(std::abs(static_cast<double>(got_top[k]) - want_top[k]), scale);
      }
    }
  }
  EXPECT_LE(diff.relative, kRelativeLogitTolerance);
  std::printf(
      "%s: max |logprob(TP=2 processes) - logprob(TP=1)| = %.3g (%.3g of the largest "
      "|logit|)\n",
      GetParam().c_str(), diff.absolute, diff.relative);

  // A recovering (or restarted) scheduler asks rank 0 for a new id and initialises every
  // rank with it again: the group forms anew and answers as before.
  {
    SchedulerContext context;
    wv1::CreateCollectiveIdResponse id;
    ASSERT_TRUE(
        workers[0]->stub->CreateCollectiveId(&context, wv1::CreateCollectiveIdRequest(), &id).ok());
    EXPECT_NE(id.collective_id(), init_requests[0].collective_id());
    for (wv1::InitRequest& request : init_requests) request.set_collective_id(id.collective_id());
  }
  std::vector<wv1::InitResponse> again(workers.size());
  const auto statuses =
      OnAll(workers, [&](int r, wv1::Worker::Stub& stub, grpc::ClientContext* context) {
        return stub.Init(context, init_requests[r], &again[r]);
      });
  for (size_t r = 0; r < workers.size(); ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].error_message();
    EXPECT_EQ(again[r].num_kv_blocks(), inits[r].num_kv_blocks());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TpWorkerProcessTest, ::testing::ValuesIn(TpModels()));

TEST(TpWorkerProcessErrorsTest, InitWithoutAValidCollectiveIdIsRefused) {
  const auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  wv1::InitRequest request;
  request.set_model_path(TestModelDir("llama3_gqa"));
  request.set_tp_world_size(2);
  {
    SchedulerContext context;
    wv1::InitResponse response;
    const grpc::Status status = worker->stub->Init(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("CreateCollectiveId"), std::string::npos)
        << status.error_message();
  }
  {
    // Rank 0 accepts only the id it created.
    request.set_collective_id("gloo:127.0.0.1:1");
    SchedulerContext context;
    wv1::InitResponse response;
    EXPECT_EQ(worker->stub->Init(&context, request, &response).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    // Another rank is told when the id is of another backend's kind.
    request.set_tp_rank(1);
    request.set_collective_id("nccl:0123");
    SchedulerContext context;
    wv1::InitResponse response;
    const grpc::Status status = worker->stub->Init(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("--backend"), std::string::npos)
        << status.error_message();
  }
}

// --- Through the scheduler ------------------------------------------------------------

// Starts a conveyor-scheduler over `workers` (comma-separated addresses) serving the tiny
// test model `model`, streams greedy completions of `prompts`, and stops it (workers keep
// running).
std::vector<std::vector<int>> GenerateThroughScheduler(
    const std::string& workers, const std::vector<std::vector<int32_t>>& prompts,
    int expected_tp_size, const std::string& model = "llama3_gqa",
    const std::vector<std::string>& extra_flags = {}) {
  std::vector<std::string> args = {SchedulerBinary(),      "--port=0",
                                   "--metrics_port=0",     "--model=" + TestModelDir(model),
                                   "--workers=" + workers, "--block_size=4",
                                   "--log_level=warn",     "--scheduler_id=tp-test-scheduler"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  auto process = Subprocess::Start(args);
  EXPECT_TRUE(process.has_value());
  if (!process) return {};
  const auto line = process->WaitForLine("listening on", 30s);
  EXPECT_TRUE(line.has_value()) << "scheduler did not start";
  if (!line) return {};
  process->DrainStdout();
  auto stub = v1::Conveyor::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(PortFromListeningLine(*line)),
                          grpc::InsecureChannelCredentials()));
  v1::ModelInfoResponse info;
  for (int i = 0; i < 600; ++i) {
    SchedulerContext context;
    if (stub->GetModelInfo(&context, v1::ModelInfoRequest(), &info).ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(info.tensor_parallel_size(), expected_tp_size);

  std::vector<std::vector<int>> outputs;
  for (const std::vector<int32_t>& prompt : prompts) {
    v1::GenerateRequest request;
    request.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    request.set_max_new_tokens(12);
    request.set_temperature(0);
    request.set_ignore_eos(true);
    SchedulerContext context;
    context.set_deadline(std::chrono::system_clock::now() + 60s);
    auto reader = stub->Generate(&context, request);
    std::vector<int> tokens;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      tokens.insert(tokens.end(), response.token_ids().begin(), response.token_ids().end());
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(tokens.size(), 12u);
    outputs.push_back(std::move(tokens));
  }
  process->Signal(SIGTERM);
  EXPECT_EQ(process->Wait(30s), 0);
  return outputs;
}

TEST(TpSchedulerTest, TwoRanksStreamTheTokensOfOne) {
  const auto single = StartWorker();
  const auto rank0 = StartWorker();
  const auto rank1 = StartWorker();
  ASSERT_TRUE(single != nullptr && rank0 != nullptr && rank1 != nullptr);
  const std::vector<std::vector<int32_t>> prompts = LoadReference("llama3_gqa").prompts;
  const auto expected = GenerateThroughScheduler(single->address, prompts, 1);
  ASSERT_EQ(expected.size(), prompts.size());
  const std::string group = rank0->address + "," + rank1->address;
  EXPECT_EQ(GenerateThroughScheduler(group, prompts, 2), expected);
  // A second scheduler over the same, already initialised ranks (a restart).
  EXPECT_EQ(GenerateThroughScheduler(group, prompts, 2), expected);
}

// Speculative decoding with a draft model across processes and ranks: every rank loads
// the draft (here the model itself, so that every greedy proposal is kept and a wrong
// proposal anywhere would show), rank 0 answers the proposals, and the streams are those
// of one rank without speculation.
TEST(TpSchedulerTest, TwoRanksWithADraftModelStreamTheTokensOfOne) {
  const auto single = StartWorker();
  const auto rank0 = StartWorker();
  const auto rank1 = StartWorker();
  const auto alone = StartWorker();
  ASSERT_TRUE(single != nullptr && rank0 != nullptr && rank1 != nullptr && alone != nullptr);
  const std::vector<std::vector<int32_t>> prompts = LoadReference("llama3_gqa").prompts;
  const auto expected = GenerateThroughScheduler(single->address, prompts, 1);
  ASSERT_EQ(expected.size(), prompts.size());
  const std::vector<std::string> draft = {"--speculative_method=draft",
                                          "--speculative_model=" + TestModelDir("llama3_gqa"),
                                          "--num_speculative_tokens=3"};
  EXPECT_EQ(GenerateThroughScheduler(alone->address, prompts, 1, "llama3_gqa", draft), expected);
  EXPECT_EQ(GenerateThroughScheduler(rank0->address + "," + rank1->address, prompts, 2,
                                     "llama3_gqa", draft),
            expected);
}

// The mixture-of-experts models end to end: the scheduler over worker processes, one rank
// and two (each expert sharded), give the float64 reference's greedy tokens; each prompt
// goes twice, the second time from the prefix cache.
class TpSchedulerMoeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TpSchedulerMoeTest, OneAndTwoRanksStreamTheReferenceTokens) {
  const auto single = StartWorker();
  const auto rank0 = StartWorker();
  const auto rank1 = StartWorker();
  ASSERT_TRUE(single != nullptr && rank0 != nullptr && rank1 != nullptr);
  const Reference ref = LoadReference(GetParam());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int>> expected;
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    for (int twice = 0; twice < 2; ++twice) {
      prompts.push_back(ref.prompts[p]);
      expected.emplace_back(ref.greedy[p].begin(), ref.greedy[p].begin() + 12);
    }
  }
  EXPECT_EQ(GenerateThroughScheduler(single->address, prompts, 1, GetParam()), expected);
  EXPECT_EQ(GenerateThroughScheduler(rank0->address + "," + rank1->address, prompts, 2, GetParam()),
            expected);
}

INSTANTIATE_TEST_SUITE_P(Models, TpSchedulerMoeTest,
                         ::testing::Values("qwen3_moe", "mixtral_moe_tied"));

}  // namespace
}  // namespace conveyor::testing
