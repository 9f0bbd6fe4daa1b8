// WorkerRecovery alone, over an executor whose Recover answers what the test tells it
// to: one recovery per outage, resuming only with workers the scheduler's blocks fit,
// failing what was kept after the timeout and trying on, and stopping promptly. The
// engine's outage handling end to end is tests/scheduler/chaos_test.cc.
#include "scheduler/worker_recovery.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Recover returns the answers queued by Answer, in order, waiting for one if none is
// queued (until CancelRecovery).
class RecoveringExecutor final : public StepExecutor {
 public:
  absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest&) override {
    return absl::InternalError("not used");
  }
  bool can_recover() const override { return true; }
  absl::StatusOr<RecoveredWorkers> Recover(
      std::chrono::system_clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++recover_calls_;
    last_deadline_ = deadline;
    cv_.notify_all();
    cv_.wait(lock, [&] { return cancelled_ || !answers_.empty(); });
    if (answers_.empty()) return absl::CancelledError("recovery cancelled");
    absl::StatusOr<RecoveredWorkers> answer = answers_.front();
    answers_.pop_front();
    return answer;
  }
  void CancelRecovery() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

  void Answer(absl::StatusOr<RecoveredWorkers> answer) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back(std::move(answer));
    cv_.notify_all();
  }
  // Waits until Recover has been called `n` times.
  bool WaitForRecoverCalls(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 30s, [&] { return recover_calls_ >= n; });
  }
  int recover_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return recover_calls_;
  }
  std::chrono::system_clock::time_point last_deadline() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_deadline_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<absl::StatusOr<RecoveredWorkers>> answers_;
  int recover_calls_ = 0;
  bool cancelled_ = false;
  std::chrono::system_clock::time_point last_deadline_;
};

class WorkerRecoveryTest : public ::testing::Test {
 protected:
  // Polls until the recovery's answer is in (the wake-up came).
  std::optional<WorkerRecovery::Outcome> PollWhenWoken(WorkerRecovery& recovery) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(wake_.wait_for(lock, 30s, [&] { return wakes_ > polled_wakes_; }));
    ++polled_wakes_;
    lock.unlock();
    EXPECT_TRUE(recovery.has_result());
    return recovery.Poll(kBlockSize);
  }
  std::function<void()> Waker() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ++wakes_;
      wake_.notify_all();
    };
  }

  static constexpr int kBlockSize = 16;
  RecoveringExecutor executor_;
  std::mutex mu_;
  std::condition_variable wake_;
  int wakes_ = 0;
  int polled_wakes_ = 0;
};

TEST_F(WorkerRecoveryTest, OneRecoveryPerOutageAndBackWithTheWorkersOffer) {
  WorkerRecovery recovery(&executor_, 5s, Waker());
  EXPECT_FALSE(recovery.active());
  EXPECT_FALSE(recovery.Poll(kBlockSize).has_value());  // Nothing under way.

  const auto before = std::chrono::system_clock::now();
  EXPECT_TRUE(recovery.Begin(absl::UnavailableError("rank 1 is gone")));
  EXPECT_TRUE(recovery.active());
  EXPECT_FALSE(recovery.Begin(absl::UnavailableError("rank 0 is gone too")));
  EXPECT_EQ(recovery.cause().message(), "rank 1 is gone");
  ASSERT_TRUE(executor_.WaitForRecoverCalls(1));
  EXPECT_GE(executor_.last_deadline(), before + 5s);
  EXPECT_FALSE(recovery.has_result());
  EXPECT_FALSE(recovery.Poll(kBlockSize).has_value());  // Not in yet.

  executor_.Answer(RecoveredWorkers{.num_kv_blocks = 300, .block_size = kBlockSize});
  std::optional<WorkerRecovery::Outcome> outcome = PollWhenWoken(recovery);
  ASSERT_TRUE(outcome.has_value());
  ASSERT_TRUE(outcome->recovered.has_value());
  EXPECT_EQ(outcome->recovered->num_kv_blocks, 300);
  EXPECT_GE(outcome->outage_s, 0);
  EXPECT_FALSE(recovery.active());
  EXPECT_FALSE(recovery.exceeded());
  EXPECT_EQ(executor_.recover_calls(), 1);

  // The next failure is a new outage.
  EXPECT_TRUE(recovery.Begin(absl::DeadlineExceededError("step timed out")));
  ASSERT_TRUE(executor_.WaitForRecoverCalls(2));
}

TEST_F(WorkerRecoveryTest, NotBackInTimeFailsWhatWasKeptAndTriesOn) {
  WorkerRecovery recovery(&executor_, 2s, Waker());
  recovery.Begin(absl::UnavailableError("rank 1 is gone"));
  executor_.Answer(absl::DeadlineExceededError("rank 1 did not answer"));
  std::optional<WorkerRecovery::Outcome> outcome = PollWhenWoken(recovery);
  ASSERT_TRUE(outcome.has_value());
  EXPECT_FALSE(outcome->recovered.has_value());
  EXPECT_EQ(outcome->failure.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(outcome->failure.message(), HasSubstr("rank 1 is gone"));
  EXPECT_THAT(outcome->failure.message(), HasSubstr("within 2 s (--worker_recovery_timeout_s)"));
  EXPECT_THAT(outcome->failure.message(), HasSubstr("rank 1 did not answer"));
  EXPECT_TRUE(recovery.active());
  EXPECT_TRUE(recovery.exceeded());
  ASSERT_TRUE(executor_.WaitForRecoverCalls(2));  // Started over.

  executor_.Answer(RecoveredWorkers{.num_kv_blocks = 8, .block_size = kBlockSize});
  outcome = PollWhenWoken(recovery);
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->recovered.has_value());
  EXPECT_FALSE(recovery.exceeded());
  EXPECT_FALSE(recovery.active());
}

TEST_F(WorkerRecoveryTest, WorkersWithAnotherBlockSizeAreNotBack) {
  WorkerRecovery recovery(&executor_, 5s, Waker());
  recovery.Begin(absl::UnavailableError("rank 0 restarted"));
  executor_.Answer(RecoveredWorkers{.num_kv_blocks = 8, .block_size = 32});
  std::optional<WorkerRecovery::Outcome> outcome = PollWhenWoken(recovery);
  ASSERT_TRUE(outcome.has_value());
  EXPECT_FALSE(outcome->recovered.has_value());
  EXPECT_THAT(outcome->failure.message(), HasSubstr("block_size 32, not 16"));
  EXPECT_TRUE(recovery.active());
}

TEST_F(WorkerRecoveryTest, StopEndsARecoveryUnderWay) {
  WorkerRecovery recovery(&executor_, 600s, Waker());
  recovery.Begin(absl::UnavailableError("rank 0 is gone"));
  ASSERT_TRUE(executor_.WaitForRecoverCalls(1));
  recovery.Stop();  // Returns once Recover did: CancelRecovery made it (else this hangs).
  EXPECT_FALSE(recovery.active());
  EXPECT_FALSE(recovery.has_result());
  EXPECT_FALSE(recovery.Poll(kBlockSize).has_value());
  recovery.Stop();  // Idempotent.
}

}  // namespace
}  // namespace conveyor::scheduler
