// The HTTP server's thread pool: as many tasks run at once as arrive, up to the cap.
#include "scheduler/http/growing_task_queue.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

// Tasks that each wait until `n` of them are running at the same time.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n) {}
  // Returns whether all n arrived (false after a limit that only ends a hung test).
  bool Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    all_.notify_all();
    return all_.wait_for(lock, std::chrono::seconds(60), [&] { return arrived_ >= n_; });
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable all_;
  int arrived_ = 0;
};

TEST(GrowingTaskQueueTest, RunsAsManyTasksAtOnceAsArrive) {
  constexpr int kTasks = 100;  // Like 100 open streams: each holds its thread.
  Rendezvous rendezvous(kTasks);
  std::atomic<int> met{0};
  GrowingTaskQueue queue(256);
  for (int i = 0; i < kTasks; ++i) {
    queue.enqueue([&] {
      if (rendezvous.Arrive()) ++met;
    });
  }
  queue.shutdown();
  EXPECT_EQ(met.load(), kTasks);
}

TEST(GrowingTaskQueueTest, StopsAtTheCapAndRunsTheRestLater) {
  GrowingTaskQueue queue(4);
  std::atomic<int> done{0};
  for (int i = 0; i < 100; ++i) queue.enqueue([&] { ++done; });
  EXPECT_LE(queue.num_threads(), 4u);
  queue.shutdown();  // Runs what is still queued first.
  EXPECT_EQ(done.load(), 100);
}

}  // namespace
}  // namespace conveyor::scheduler
