// A ResponseSink (scheduler/request.h) that records one request's stream for tests: the
// tokens, the text, the final message and status. It checks what every sink may rely
// on: well-formed UTF-8 in texts, nothing after Finish, Finish exactly once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/utf8.h"
#include "gtest/gtest.h"
#include "scheduler/request.h"

namespace conveyor::testing {

class RecordingSink final : public scheduler::ResponseSink {
 public:
  void Send(v1::GenerateResponse message) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(finished_) << "Send after Finish";
    EXPECT_EQ(FindInvalidUtf8(message.text()), std::string::npos)
        << "invalid UTF-8 in a streamed message";
    for (const auto& lp : message.logprobs()) {
      EXPECT_EQ(FindInvalidUtf8(lp.token().text()), std::string::npos)
          << "invalid UTF-8 in a logprob's text";
    }
    if (messages_ == 0) first_ = message;
    for (int id : message.token_ids()) tokens_.push_back(id);
    text_ += message.text();
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last_ = message;
    ++messages_;
    cv_.notify_all();
  }
  void Finish(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(finished_) << "Finish called twice";
    status_ = status;
    finished_ = true;
    cv_.notify_all();
  }

  // Whether Finish came within `timeout`.
  bool WaitDone(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return finished_; });
  }
  // Whether `n` messages came within 30 s.
  bool WaitMessages(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return messages_ >= n; });
  }
  int messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }

  // Read once WaitDone returned true.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> tokens_;
  std::string text_;
  v1::GenerateResponse first_;  // The first message.
  v1::GenerateResponse last_;
  absl::Status status_;
  bool finished_ = false;
  int messages_ = 0;
};

}  // namespace conveyor::testing
