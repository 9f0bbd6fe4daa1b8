#include "scheduler/response_dispatcher.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

// Records what reaches it, and on which thread; optionally slow, so that a Flush that
// did not wait would be caught.
class LogSink final : public ResponseSink {
 public:
  explicit LogSink(std::chrono::microseconds delay = {}) : delay_(delay) {}
  void Send(v1::GenerateResponse message) override {
    std::this_thread::sleep_for(delay_);
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(message.text());
    threads_.push_back(std::this_thread::get_id());
  }
  void Finish(const absl::Status& status) override {
    std::this_thread::sleep_for(delay_);
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back("finish:" + std::string(absl::StatusCodeToString(status.code())));
    threads_.push_back(std::this_thread::get_id());
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  const std::chrono::microseconds delay_;
  std::mutex mu_;
  std::vector<std::string> events_;
  std::vector<std::thread::id> threads_;
};

v1::GenerateResponse Text(const std::string& text) {
  v1::GenerateResponse m;
  m.set_text(text);
  return m;
}

TEST(ResponseDispatcherTest, EachSinkGetsItsMessagesInOrderAndFinishLast) {
  ResponseDispatcher dispatcher;
  std::vector<std::shared_ptr<LogSink>> sinks(4);
  for (auto& sink : sinks) sink = std::make_shared<LogSink>();
  // Many small posts, the sinks' deliveries interleaved within each.
  for (int step = 0; step < 200; ++step) {
    for (auto& sink : sinks) dispatcher.Send(sink, Text(std::to_string(step)));
    dispatcher.Post();
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    dispatcher.Finish(sinks[i], i % 2 == 0 ? absl::OkStatus() : absl::CancelledError("gone"));
  }
  dispatcher.Flush();
  for (size_t i = 0; i < sinks.size(); ++i) {
    const std::vector<std::string> events = sinks[i]->events();
    ASSERT_EQ(events.size(), 201u);
    for (int step = 0; step < 200; ++step) EXPECT_EQ(events[step], std::to_string(step));
    EXPECT_EQ(events.back(), i % 2 == 0 ? "finish:OK" : "finish:CANCELLED");
  }
}

TEST(ResponseDispatcherTest, DeliversOnItsOwnThreadAndOnlyWhatWasPosted) {
  ResponseDispatcher dispatcher;
  auto sink = std::make_shared<LogSink>();
  dispatcher.Send(sink, Text("a"));
  // Not posted: the delivery thread cannot have it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(sink->events().empty());
  dispatcher.Flush();  // Posts first.
  EXPECT_THAT(sink->events(), ::testing::ElementsAre("a"));
  ASSERT_EQ(sink->threads().size(), 1u);
  EXPECT_NE(sink->threads()[0], std::this_thread::get_id());
}

TEST(ResponseDispatcherTest, FlushWaitsForSlowSinks) {
  ResponseDispatcher dispatcher;
  auto slow = std::make_shared<LogSink>(std::chrono::milliseconds(5));
  for (int i = 0; i < 10; ++i) {
    dispatcher.Send(slow, Text(std::to_string(i)));
    dispatcher.Post();
  }
  dispatcher.Finish(slow, absl::OkStatus());
  dispatcher.Flush();
  EXPECT_EQ(slow->events().size(), 11u);
  dispatcher.Flush();  // Nothing new: returns at once.
  EXPECT_EQ(slow->events().size(), 11u);
}

TEST(ResponseDispatcherTest, DestructionDeliversWhatWasPosted) {
  auto slow = std::make_shared<LogSink>(std::chrono::milliseconds(2));
  {
    ResponseDispatcher dispatcher;
    for (int i = 0; i < 20; ++i) dispatcher.Send(slow, Text(std::to_string(i)));
    dispatcher.Finish(slow, absl::OkStatus());
    dispatcher.Post();
  }
  EXPECT_EQ(slow->events().size(), 21u);
  EXPECT_EQ(slow->events().back(), "finish:OK");
}

TEST(ResponseDispatcherTest, ReleasesEachSinkOnceDelivered) {
  ResponseDispatcher dispatcher;
  auto sink = std::make_shared<LogSink>();
  std::weak_ptr<LogSink> watch = sink;
  dispatcher.Finish(std::move(sink), absl::OkStatus());
  dispatcher.Flush();
  // Delivered and released: the dispatcher keeps nothing once a delivery is made.
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace conveyor::scheduler
