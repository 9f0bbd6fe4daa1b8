#include "scheduler/worker_recovery.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {

WorkerRecovery::WorkerRecovery(StepExecutor* executor, std::chrono::milliseconds timeout,
                               std::function<void()> wake)
    : executor_(executor), timeout_(timeout), wake_(std::move(wake)) {}

WorkerRecovery::~WorkerRecovery() { Stop(); }

bool WorkerRecovery::Begin(const absl::Status& cause) {
  if (active_) return false;
  active_ = true;
  started_ = Clock::now();
  cause_ = cause;
  StartThread();
  return true;
}

void WorkerRecovery::StartThread() {
  if (thread_.joinable()) thread_.join();
  const auto deadline = std::chrono::system_clock::now() + timeout_;
  thread_ = std::thread([this, deadline] {
    absl::StatusOr<RecoveredWorkers> result = executor_->Recover(deadline);
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_ = std::move(result);
    }
    if (wake_) wake_();
  });
}

bool WorkerRecovery::has_result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_.has_value();
}

std::optional<WorkerRecovery::Outcome> WorkerRecovery::Poll(int block_size) {
  std::optional<absl::StatusOr<RecoveredWorkers>> result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    result.swap(result_);
  }
  if (!result.has_value()) return std::nullopt;
  thread_.join();
  Outcome outcome;
  outcome.outage_s = std::chrono::duration<double>(Clock::now() - started_).count();
  if (result->ok() && (*result)->block_size == block_size) {
    active_ = false;
    exceeded_.store(false);
    outcome.recovered = **result;
    return outcome;
  }
  const absl::Status why =
      result->ok()
          ? absl::FailedPreconditionError(absl::StrCat("the workers came back with block_size ",
                                                       (*result)->block_size, ", not ", block_size))
          : result->status();
  spdlog::error("the model workers are still down after {:.1f} s: {}", outcome.outage_s,
                why.ToString());
  outcome.failure = absl::UnavailableError(
      absl::StrCat("the model workers failed (", cause_.message(), ") and were not back within ",
                   std::chrono::duration_cast<std::chrono::seconds>(timeout_).count(),
                   " s (--worker_recovery_timeout_s): ", why.message()));
  exceeded_.store(true);
  StartThread();  // Keep trying: serve again as soon as the workers are back.
  return outcome;
}

void WorkerRecovery::Stop() {
  if (thread_.joinable()) {
    executor_->CancelRecovery();
    thread_.join();
  }
  active_ = false;
  std::lock_guard<std::mutex> lock(mu_);
  result_.reset();  // A cancelled recovery's answer.
}

}  // namespace conveyor::scheduler
