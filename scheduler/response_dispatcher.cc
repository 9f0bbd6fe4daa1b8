#include "scheduler/response_dispatcher.h"

#include <utility>

namespace conveyor::scheduler {

ResponseDispatcher::ResponseDispatcher() : thread_([this] { Run(); }) {}

ResponseDispatcher::~ResponseDispatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  posted_cv_.notify_one();
  thread_.join();
}

void ResponseDispatcher::Send(std::shared_ptr<ResponseSink> sink, v1::GenerateResponse message) {
  queued_.push_back(Delivery{std::move(sink), std::move(message), absl::OkStatus(), false});
}

void ResponseDispatcher::Finish(std::shared_ptr<ResponseSink> sink, absl::Status status) {
  queued_.push_back(Delivery{std::move(sink), v1::GenerateResponse(), std::move(status), true});
}

void ResponseDispatcher::Post() {
  if (queued_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (posted_.empty()) {
      posted_.swap(queued_);
    } else {
      for (Delivery& d : queued_) posted_.push_back(std::move(d));
      queued_.clear();
    }
    ++num_posted_;
  }
  posted_cv_.notify_one();
}

void ResponseDispatcher::Flush() {
  Post();
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = num_posted_;
  delivered_cv_.wait(lock, [&] { return num_delivered_ >= target; });
}

void ResponseDispatcher::Run() {
  std::vector<Delivery> batch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    posted_cv_.wait(lock, [&] { return stopping_ || !posted_.empty(); });
    if (posted_.empty()) return;  // Stopping, and everything posted is delivered.
    batch.swap(posted_);
    const uint64_t taken = num_posted_;
    lock.unlock();
    for (Delivery& d : batch) {
      if (d.finish) {
        d.sink->Finish(d.status);
      } else {
        d.sink->Send(std::move(d.message));
      }
    }
    batch.clear();  // Drops the sinks outside the lock too.
    lock.lock();
    num_delivered_ = taken;
    delivered_cv_.notify_all();
  }
}

}  // namespace conveyor::scheduler
