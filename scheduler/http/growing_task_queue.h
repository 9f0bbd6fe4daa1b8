// The thread pool behind the HTTP server. httplib runs each connection as one task on its
// task queue, for the connection's whole life (keep-alive included), so its fixed pool of
// max(8, cores - 1) threads serves that many connections and leaves the rest waiting,
// accepted but unanswered: 64 streams would go 8 at a time. This queue starts a thread
// whenever a task would otherwise wait, up to a cap; threads then stay for later
// connections, so the process holds as many as its peak of concurrent connections.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "httplib.h"

namespace conveyor::scheduler {

class GrowingTaskQueue final : public httplib::TaskQueue {
 public:
  // At most `max_threads` tasks run at once; later ones wait for a free thread.
  explicit GrowingTaskQueue(size_t max_threads) : max_threads_(max_threads) {}
  ~GrowingTaskQueue() override;

  // Runs `task` on an idle thread, or a new one while under the cap.
  void enqueue(std::function<void()> task) override;
  // Runs the tasks still queued, then joins every thread. No enqueue may follow.
  void shutdown() override;

  // Threads started so far.
  size_t num_threads();

 private:
  void Run();

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;  // Threads waiting for a task.
  bool shutdown_ = false;
};

}  // namespace conveyor::scheduler
