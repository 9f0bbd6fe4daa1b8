// A fixed set of threads that split index ranges among themselves. The caller's thread
// takes part, so a pool of N threads starts N - 1 of its own.
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
  // `num_threads` <= 0 means one per hardware thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls fn(begin, end) over disjoint chunks covering [0, count), of at most `grain`
  // indices each, on all threads; returns when every chunk is done. Not reentrant.
  void ParallelFor(int64_t count, int64_t grain,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // Guarded by mu_; bumped per ParallelFor.
  int busy_workers_ = 0;     // Guarded by mu_.
  bool stop_ = false;        // Guarded by mu_.

  // The current job; written before generation_ is bumped.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t count_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace conveyor::kernels
