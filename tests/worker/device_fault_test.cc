// A device error reaches the caller: a backend that fails one operation (as a CUDA
// kernel fault would) makes the worker answer that Step with INTERNAL naming the
// operation, unload its model and keep serving; the scheduler ends the request that was
// computing with that status, re-initialises the worker, and serves the next request.
// Real gRPC between an in-process worker service and an in-process engine.
#include <grpcpp/grpcpp.h>

#include <atomic>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_device.h"
#include "rpc/scheduler_id_metadata.h"
#include "scheduler/engine.h"
#include "scheduler/request_builder.h"
#include "scheduler/worker_group.h"
#include "tests/support/recording_sink.h"
#include "tests/support/test_support.h"
#include "text/tokenizer.h"
#include "worker/service.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Forwards to a real backend, except that the `fail_at`-th Linear records a device
// error and computes nothing, as a faulting kernel would.
class FaultyBackend final : public kernels::Backend {
 public:
  FaultyBackend(std::unique_ptr<kernels::Backend> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}

  std::string name() const override { return "faulty " + inner_->name(); }
  size_t activation_bytes() const override { return inner_->activation_bytes(); }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* ptr) override { inner_->Free(ptr); }
  void CopyToBackend(void* dst, const void* src, size_t bytes) override {
    inner_->CopyToBackend(dst, src, bytes);
  }
  void CopyActivationsToHost(float* dst, const void* src, size_t count) override {
    inner_->CopyActivationsToHost(dst, src, count);
  }
  absl::Status Synchronize() override {
    if (!error_.ok()) return error_;
    return inner_->Synchronize();
  }
  absl::Status last_error() const override { return error_; }
  absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> PackLinear(const float* w, int out, int in,
                                                                    const float* bias) override {
    return inner_->PackLinear(w, out, in, bias);
  }
  absl::StatusOr<void*> UploadCompute(const float* host, size_t count) override {
    return inner_->UploadCompute(host, count);
  }
  absl::StatusOr<void*> UploadF32(const float* host, size_t count) override {
    return inner_->UploadF32(host, count);
  }
  void Embedding(const void* table, int hidden, const int32_t* ids, int n, void* out) override {
    inner_->Embedding(table, hidden, ids, n, out);
  }
  void RmsNorm(const void* x, const void* w, int n, int hidden, float eps, void* out) override {
    inner_->RmsNorm(x, w, n, hidden, eps, out);
  }
  void AddRmsNorm(void* residual, const void* x, const void* w, int n, int hidden, float eps,
                  void* out) override {
    inner_->AddRmsNorm(residual, x, w, n, hidden, eps, out);
  }
  void Linear(const void* x, int n, const kernels::LinearWeight& weight, void* out) override {
    if (++linear_calls_ == fail_at_ && error_.ok()) {
      error_ = absl::InternalError("Linear launch: an illegal memory access was encountered");
    }
    if (!error_.ok()) return;
    inner_->Linear(x, n, weight, out);
  }
  void Rope(void* q, void* k, int n, int row_stride, const int32_t* positions,
            const void* rope_table, int max_positions,
            const kernels::AttentionShape& shape) override {
    inner_->Rope(q, k, n, row_stride, positions, rope_table, max_positions, shape);
  }
  void WriteKv(const void* k, const void* v, int n, int row_stride, const int32_t* slots,
               const kernels::AttentionShape& shape, kernels::KvLayer layer) override {
    inner_->WriteKv(k, v, n, row_stride, slots, shape, layer);
  }
  void PagedAttention(const void* q, int q_row_stride, const kernels::AttentionBatch& batch,
                      const kernels::AttentionShape& shape, kernels::KvLayer layer,
                      void* out) override {
    inner_->PagedAttention(q, q_row_stride, batch, shape, layer, out);
  }
  void SiluMul(const void* gate_up, int n, int ffn, void* out) override {
    inner_->SiluMul(gate_up, n, ffn, out);
  }
  void GatherRows(const void* x, int hidden, const int32_t* rows, int n_rows, void* out) override {
    inner_->GatherRows(x, hidden, rows, n_rows, out);
  }
  void HeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim, const void* w,
                   float eps) override {
    inner_->HeadRmsNorm(x, n, row_stride, num_heads, head_dim, w, eps);
  }
  void WeightedRowSum(const void* rows, int width, const int32_t* sources, const float* weights,
                      int n, int k, void* out) override {
    inner_->WeightedRowSum(rows, width, sources, weights, n, k, out);
  }

 private:
  std::unique_ptr<kernels::Backend> inner_;
  const int fail_at_;
  int linear_calls_ = 0;
  absl::Status error_;
};

// The CPU device, whose first backend faults on its first Linear.
class FaultyDevice final : public model::Device {
 public:
  FaultyDevice() : inner_(model::MakeCpuDevice({.num_threads = 1})) {}
  std::string_view name() const override { return "faulty-cpu"; }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const ModelConfig& model) override {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = inner_->MakeBackend(model);
    if (!backend.ok() || backends_made_++ > 0) return backend;
    return std::unique_ptr<kernels::Backend>(new FaultyBackend(*std::move(backend), 1));
  }
  absl::StatusOr<std::string> CreateCollectiveId() override { return inner_->CreateCollectiveId(); }
  absl::StatusOr<std::unique_ptr<model::Communicator>> Connect(
      std::string_view id, int rank, int world, kernels::Backend* backend,
      std::chrono::system_clock::time_point deadline) override {
    return inner_->Connect(id, rank, world, backend, deadline);
  }
  absl::StatusOr<std::unique_ptr<model::DeviceSampler>> MakeSampler(kernels::Backend* backend,
                                                                    int vocab, int rows) override {
    return inner_->MakeSampler(backend, vocab, rows);
  }
  absl::StatusOr<uint64_t> DefaultKvBudgetBytes(kernels::Backend* backend) const override {
    return inner_->DefaultKvBudgetBytes(backend);
  }
  int backends_made() const { return backends_made_; }

 private:
  std::unique_ptr<model::Device> inner_;
  std::atomic<int> backends_made_{0};
};

TEST(DeviceFaultTest, FaultEndsTheStreamWithItsOperationAndTheWorkerRecovers) {
  auto owned_device = std::make_unique<FaultyDevice>();
  FaultyDevice* device = owned_device.get();
  worker::WorkerService service(std::move(owned_device), {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  scheduler::WorkerGroup::Options group_options;
  group_options.addresses = {"127.0.0.1:" + std::to_string(port)};
  group_options.scheduler_id = "device-fault-test";
  group_options.model_path = TestModelDir("llama3_gqa");
  group_options.block_size = 4;
  group_options.kv_cache_bytes = 4 << 20;
  scheduler::WorkerGroup group(group_options);
  auto info = group.Initialize(std::chrono::system_clock::now() + 60s);
  ASSERT_TRUE(info.ok()) << info.status();

  auto tokenizer = Tokenizer::Load(TestModelDir("llama3_gqa"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  scheduler::PolicyOptions policy_options;
  auto policy = scheduler::MakePolicy(policy_options);
  ASSERT_TRUE(policy.ok());
  scheduler::Engine::Options options;
  options.num_kv_blocks = info->num_kv_blocks;
  options.block_size = info->block_size;
  options.max_context_tokens = info->model.max_context_tokens();
  std::atomic<int> unready{0};
  options.on_workers_ready = [&](bool ready) {
    if (!ready) ++unready;
  };
  scheduler::Engine engine(options, *std::move(policy), &group, tokenizer->get(), nullptr);
  engine.Start();

  scheduler::ServingLimits limits;
  limits.vocab_size = info->model.vocab_size();
  limits.max_context_tokens = info->model.max_context_tokens();
  limits.kv_capacity_tokens = info->num_kv_blocks * info->block_size;
  auto submit = [&](const std::shared_ptr<RecordingSink>& sink) {
    v1::GenerateRequest proto;
    for (int t : {5, 6, 7, 8}) proto.mutable_token_ids()->add_ids(t);
    proto.set_max_new_tokens(8);
    proto.set_temperature(0);
    proto.set_ignore_eos(true);
    auto request = scheduler::BuildRequest(proto, limits, **tokenizer);
    ASSERT_TRUE(request.ok()) << request.status();
    (*request)->sink = sink;
    ASSERT_TRUE(engine.Submit(*std::move(request)).ok());
  };

  auto faulted = std::make_shared<RecordingSink>();
  submit(faulted);
  ASSERT_TRUE(faulted->WaitDone());
  const absl::Status& status = faulted->status_;
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(), HasSubstr("Linear launch"));
  EXPECT_THAT(status.message(), HasSubstr("failed on the device"));
  EXPECT_TRUE(faulted->tokens_.empty());  // No token came from the faulted step.
  EXPECT_GE(unready.load(), 1);           // The outage was visible.

  // The worker process (here: its service) is still up, and once re-initialised with a
  // new backend it serves again.
  auto ok = std::make_shared<RecordingSink>();
  submit(ok);
  ASSERT_TRUE(ok->WaitDone());
  EXPECT_TRUE(ok->status_.ok()) << ok->status_;
  EXPECT_EQ(ok->tokens_.size(), 8u);
  EXPECT_EQ(device->backends_made(), 2);
  EXPECT_TRUE(engine.workers_ready());
  engine.Stop(absl::CancelledError("test over"));
  service.RequestShutdown();  // Ends the group's step stream, as the worker's main does.
  server->Shutdown();
}

}  // namespace
}  // namespace conveyor::testing
