#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor::kernels {
namespace {

// Runs one ParallelFor and checks that every index was visited exactly once, in chunks
// of at most `grain` (or one chunk, where the pool runs the job inline).
void ExpectCoversOnce(ThreadPool* pool, int64_t count, int64_t grain) {
  std::vector<std::atomic<int>> visits(count);
  const bool inline_job = pool->num_threads() == 1 || count <= grain;
  pool->ParallelFor(count, grain, [&](int64_t begin, int64_t end) {
    EXPECT_LE(end - begin, inline_job ? count : grain);
    for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(visits[i].load(), 1) << i << " of " << count;
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t count : {0, 1, 2, 15, 16, 17, 100, 1000}) {
      for (int64_t grain : {1, 3, 16, 1000}) ExpectCoversOnce(&pool, count, grain);
    }
  }
}

// Back-to-back jobs hand over while the workers spin; each must see its own job.
TEST(ThreadPoolTest, ManyShortJobsBackToBack) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20000; ++job) {
    pool.ParallelFor(8, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
  }
  EXPECT_EQ(total.load(), 8 * 20000);
}

// Gaps longer than the spin put the workers to sleep; jobs still reach them, and the
// caller sleeps and wakes when a worker outlasts its spin.
TEST(ThreadPoolTest, WakesSleepingThreads) {
  ThreadPool pool(2);
  for (int job = 0; job < 20; ++job) {
    std::this_thread::sleep_for(std::chrono::microseconds(5 * ThreadPool::kSpinMicros));
    std::atomic<int> chunks{0};
    pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
      // Long chunks: whoever finishes first waits past its spin for the other.
      std::this_thread::sleep_for(std::chrono::microseconds(4 * ThreadPool::kSpinMicros));
      chunks.fetch_add(1);
    });
    EXPECT_EQ(chunks.load(), 2);
  }
}

// Both threads take part: with a barrier-like job, neither chunk can finish alone.
TEST(ThreadPoolTest, WorkersRunConcurrently) {
  ThreadPool pool(2);
  std::atomic<int> arrived{0};
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(arrived.load(), 2);
}

TEST(ThreadPoolTest, DestroysWhileWorkersSpinOrSleep) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    if (i % 2 == 0) pool.ParallelFor(10, 1, [](int64_t, int64_t) {});
    if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace
}  // namespace conveyor::kernels
