#include "scheduler/http/growing_task_queue.h"

#include <utility>

namespace conveyor::scheduler {

GrowingTaskQueue::~GrowingTaskQueue() { shutdown(); }

void GrowingTaskQueue::enqueue(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  // An idle thread leaves idle_ when it takes a task, under mu_: tasks beyond idle_ have
  // no thread coming for them.
  if (tasks_.size() > idle_ && threads_.size() < max_threads_) {
    threads_.emplace_back([this] { Run(); });
  } else {
    ready_.notify_one();
  }
}

void GrowingTaskQueue::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  ready_.notify_all();
  for (std::thread& t : threads) t.join();
}

size_t GrowingTaskQueue::num_threads() {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void GrowingTaskQueue::Run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++idle_;
      ready_.wait(lock, [&] { return shutdown_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // Shut down, nothing left to run.
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace conveyor::scheduler
