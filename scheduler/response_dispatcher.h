// Hands the engine's messages to the requests' sinks on a thread of its own.
//
// Writing to a client is a system call per message for the gRPC front (and on loopback
// the kernel delivers it in the same call), so streaming one token to each of a batch's
// clients costs the loop a good part of a millisecond. Done on the loop's thread it
// delays the next step by that much, every step; here it overlaps the next step's
// planning and compute instead.
//
// The loop queues with Send and Finish (no lock, no wake-up) and hands over what it
// queued with Post, once per iteration. Deliveries keep their order (one FIFO, one
// thread), so each sink sees its messages in order and Finish last. Flush returns once
// everything posted has reached its sink.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "conveyor.pb.h"
#include "scheduler/request.h"

namespace conveyor::scheduler {

class ResponseDispatcher {
 public:
  ResponseDispatcher();
  // Delivers what was posted, then stops the thread. What was queued and never posted
  // is dropped (the engine posts before it lets go).
  ~ResponseDispatcher();
  ResponseDispatcher(const ResponseDispatcher&) = delete;
  ResponseDispatcher& operator=(const ResponseDispatcher&) = delete;

  // Queue for the next Post. Called on one thread (the engine's loop) only.
  void Send(std::shared_ptr<ResponseSink> sink, v1::GenerateResponse message);
  void Finish(std::shared_ptr<ResponseSink> sink, absl::Status status);
  // Hands what was queued to the delivery thread; nothing to hand over costs nothing.
  void Post();
  // Posts, and waits until every delivery posted so far has been made.
  void Flush();

 private:
  struct Delivery {
    std::shared_ptr<ResponseSink> sink;
    v1::GenerateResponse message;  // Unless `finish`.
    absl::Status status;           // If `finish`.
    bool finish = false;
  };

  void Run();

  std::vector<Delivery> queued_;  // The loop's, until Post.

  std::mutex mu_;
  std::condition_variable posted_cv_;     // The thread waits for work (or stop).
  std::condition_variable delivered_cv_;  // Flush waits for the thread.
  std::vector<Delivery> posted_;
  uint64_t num_posted_ = 0;     // Batches handed over so far.
  uint64_t num_delivered_ = 0;  // Batches the thread has finished.
  bool stopping_ = false;

  std::thread thread_;
};

}  // namespace conveyor::scheduler
