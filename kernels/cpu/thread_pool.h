// A fixed set of threads that split index ranges among themselves. The caller's thread
// takes part, so a pool of N threads starts N - 1 of its own.
//
// A forward pass is a chain of short parallel operations (a decode step makes about a
// hundred), so a blocking hand-off per operation would cost a futex wake-up each. Idle
// workers therefore spin for up to kSpinMicros on the job counter before they sleep, and
// the caller spins as long for the workers to finish; only longer gaps (between steps)
// pay for sleeping and waking. Spinning only pays while every thread has a core: when
// other processes take the cores, a spinning thread burns the time slice the thread it
// waits for needs. So each waiter halves its spin after each wait that outlasted it (down
// to none, with a full spin every kProbeInterval waits to notice the cores coming back)
// and restores the full spin after each wait that spinning caught.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace conveyor::kernels {

class ThreadPool {
 public:
  // How long an idle thread polls, at most, before it blocks.
  static constexpr int64_t kSpinMicros = 50;
  // Waits between probing spins while spinning does not pay.
  static constexpr int kProbeInterval = 16;

  // `num_threads` <= 0 means one per hardware thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls fn(begin, end) over disjoint chunks covering [0, count), of at most `grain`
  // indices each, on all threads; returns when every chunk is done. With one thread, or
  // count <= grain, that is a single call fn(0, count) on the caller. Not reentrant.
  void ParallelFor(int64_t count, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  // How long one waiting thread spins before it blocks (see the top of this file).
  class SpinBudget {
   public:
    // Polls done() for up to the budget; returns done() at the end. Adapts the budget.
    template <typename Done>
    bool Spin(Done&& done);

   private:
    int64_t micros_ = kSpinMicros;  // 0: spinning does not pay; only probe.
    int waits_since_probe_ = 0;
  };

  void WorkerLoop();
  // Waits until a job newer than *seen is posted (updating *seen); false: shut down.
  bool WaitForJob(uint64_t* seen, SpinBudget* spin);
  // Waits until every worker has finished the current job.
  void WaitForWorkers();
  void RunChunks();

  std::vector<std::thread> workers_;

  // Sleeping is guarded by mu_; the fast paths only touch the atomics. A thread that is
  // about to sleep first announces it (sleeping_workers_, caller_sleeping_), then
  // re-checks its condition under mu_; the other side changes the condition first, then
  // reads the announcement and, if set, notifies under mu_, so no wake-up is lost.
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};  // Bumped per ParallelFor (and at shutdown).
  std::atomic<int> busy_workers_{0};     // Workers yet to finish the current job.
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  SpinBudget caller_spin_;  // Used by ParallelFor's caller only.

  // The current job; written before generation_ is bumped.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace conveyor::kernels
