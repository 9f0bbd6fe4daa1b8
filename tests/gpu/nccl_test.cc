// The NCCL communicator of the CUDA backend (model/cuda/nccl_communicator.h) on the GPUs
// there are: a group of one rank on one GPU (NCCL's own code path, init to collectives),
// the connect deadline with a rank that never joins, and two ranks on two GPUs where a
// machine has them. Each test says SKIPPED, and why, without a GPU or without NCCL
// (libnccl.so.2 not found, or a build without nccl.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/communicator.h"
#include "model/cuda/nccl_communicator.h"

namespace conveyor::model {
namespace {

using std::chrono::system_clock;

// Skips unless `devices` GPUs are there and NCCL loads.
#define SKIP_UNLESS_NCCL(devices)                                              \
  do {                                                                         \
    if (kernels::CudaDeviceCount() < (devices)) {                              \
      GTEST_SKIP() << "needs " << (devices) << " CUDA device(s), found "       \
                   << kernels::CudaDeviceCount();                              \
    }                                                                          \
    if (absl::StatusOr<std::string> id = CreateNcclCollectiveId(); !id.ok()) { \
      GTEST_SKIP() << "no NCCL: " << id.status();                              \
    }                                                                          \
  } while (0)

// Small integers: exact in bf16, and so are their sums over two ranks.
std::vector<float> Values(int count, int rank) {
  std::vector<float> v(count);
  for (int i = 0; i < count; ++i) v[i] = static_cast<float>((i * 7 + rank * 3) % 61 - 30);
  return v;
}

std::vector<float> Read(kernels::Backend& backend, const void* data, size_t count) {
  std::vector<float> host(count);
  backend.CopyActivationsToHost(host.data(), data, count);
  EXPECT_TRUE(backend.Synchronize().ok()) << backend.last_error();
  return host;
}

// Either the library loaded ("NCCL 2.x.y from <file>"), or the message says how to get
// it: a file to install or name, or a build with nccl.h. Runs without a GPU too.
TEST(NcclTest, DescribesTheLibraryOrHowToGetIt) {
  const std::string description = DescribeNccl();
  std::printf("[ NCCL     ] %s\n", description.c_str());
  const bool loaded =
      description.rfind("NCCL 2.", 0) == 0 && description.find(" from ") != std::string::npos;
  const bool says_how = description.find("CONVEYOR_NCCL_LIBRARY") != std::string::npos ||
                        description.find("nccl.h") != std::string::npos;
  EXPECT_TRUE(loaded || says_how) << description;
}

// One rank: NCCL still initialises, queues the collectives on the backend's stream and
// completes them; the all-reduce of one rank and the all-gather of one part are copies.
TEST(NcclTest, GroupOfOneReducesAndGathers) {
  SKIP_UNLESS_NCCL(1);
  auto backend = kernels::MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::string id = CreateNcclCollectiveId().value();
  auto comm = ConnectNccl(id, 0, 1, backend->get(), (*backend)->dtype(),
                          system_clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->world_size(), 1);
  const std::vector<float> values = Values(4099, 0);
  void* data = (*backend)->UploadCompute(values.data(), values.size()).value();
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE((*comm)->AllReduceSum(data, values.size()).ok());
    ASSERT_TRUE((*comm)->AllGather(data, values.size()).ok());
  }
  EXPECT_EQ(Read(**backend, data, values.size()), values);
  comm->reset();
  (*backend)->Free(data);
  EXPECT_TRUE((*backend)->Synchronize().ok()) << (*backend)->last_error();
}

// A group of two whose second rank never comes: the first gives up at its deadline with
// UNAVAILABLE (what a lost Gloo rendezvous returns), and does not hang.
TEST(NcclTest, RankThatNeverJoinsFailsAtTheDeadline) {
  SKIP_UNLESS_NCCL(1);
  auto backend = kernels::MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::string id = CreateNcclCollectiveId().value();
  const auto start = std::chrono::steady_clock::now();
  auto comm = ConnectNccl(id, 0, 2, backend->get(), (*backend)->dtype(),
                          system_clock::now() + std::chrono::seconds(3));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable) << comm.status();
  EXPECT_NE(comm.status().message().find("deadline"), std::string::npos) << comm.status();
  EXPECT_LT(seconds, 30) << "the deadline was 3 s";
  std::printf("[ NCCL     ] missing rank refused after %.1f s: %s\n", seconds,
              comm.status().ToString().c_str());
}

// Two ranks on two GPUs, one thread each: sums and gathers across them.
TEST(NcclTest, TwoRanksReduceAndGatherAcrossGpus) {
  SKIP_UNLESS_NCCL(2);
  const std::string id = CreateNcclCollectiveId().value();
  const int count = 1000;
  std::vector<std::vector<float>> reduced(2), gathered(2);
  std::vector<absl::Status> status(2);
  auto rank_main = [&](int rank) {
    auto backend = kernels::MakeCudaBackend(rank);
    if (!backend.ok()) {
      status[rank] = backend.status();
      return;
    }
    auto comm = ConnectNccl(id, rank, 2, backend->get(), (*backend)->dtype(),
                            system_clock::now() + std::chrono::seconds(60));
    if (!comm.ok()) {
      status[rank] = comm.status();
      return;
    }
    const std::vector<float> mine = Values(count, rank);
    void* sum = (*backend)->UploadCompute(mine.data(), mine.size()).value();
    status[rank] = (*comm)->AllReduceSum(sum, count);
    reduced[rank] = Read(**backend, sum, count);
    std::vector<float> parts(2 * count, 0.0f);
    std::copy(mine.begin(), mine.end(), parts.begin() + rank * count);
    void* all = (*backend)->UploadCompute(parts.data(), parts.size()).value();
    if (status[rank].ok()) status[rank] = (*comm)->AllGather(all, count);
    gathered[rank] = Read(**backend, all, 2 * count);
    comm->reset();
    (*backend)->Free(sum);
    (*backend)->Free(all);
  };
  std::thread other(rank_main, 1);
  rank_main(0);
  other.join();
  const std::vector<float> a = Values(count, 0), b = Values(count, 1);
  std::vector<float> want_sum(count), want_all(a);
  for (int i = 0; i < count; ++i) want_sum[i] = a[i] + b[i];
  want_all.insert(want_all.end(), b.begin(), b.end());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << "rank " << rank << ": " << status[rank];
    EXPECT_EQ(reduced[rank], want_sum) << "rank " << rank;
    EXPECT_EQ(gathered[rank], want_all) << "rank " << rank;
  }
}

}  // namespace
}  // namespace conveyor::model
