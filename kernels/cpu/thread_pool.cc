#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace conveyor::kernels {
namespace {

// Tells the core we are spinning (frees the sibling hyperthread, saves power).
void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

template <typename Done>
bool ThreadPool::SpinBudget::Spin(Done&& done) {
  const bool probe = micros_ == 0;
  if (probe && ++waits_since_probe_ < kProbeInterval) return done();
  waits_since_probe_ = 0;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(probe ? kSpinMicros : micros_);
  for (;;) {
    // Reading the clock costs more than a poll, so poll a few times between reads.
    for (int i = 0; i < 16; ++i) {
      if (done()) {
        micros_ = kSpinMicros;
        return true;
      }
      CpuRelax();
    }
    if (Clock::now() >= deadline) break;
  }
  // A failed probe keeps the budget at 0; under 1 us, halving reaches it.
  micros_ = probe ? 0 : micros_ / 2;
  return done();
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= count_) return;
    (*fn_)(begin, std::min(count_, begin + grain_));
  }
}

bool ThreadPool::WaitForJob(uint64_t* seen, SpinBudget* spin) {
  // Sequentially consistent loads here and below: see the comment on mu_.
  auto posted = [&] { return generation_.load() != *seen; };
  if (!spin->Spin(posted)) {
    sleeping_workers_.fetch_add(1);
    std::unique_lock<std::mutex> lock(mu_);
    start_cv_.wait(lock, posted);
    sleeping_workers_.fetch_sub(1);
  }
  *seen = generation_.load();
  return !stop_.load();
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  SpinBudget spin;
  while (WaitForJob(&seen, &spin)) {
    RunChunks();
    if (busy_workers_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::WaitForWorkers() {
  auto finished = [&] { return busy_workers_.load() == 0; };
  if (caller_spin_.Spin(finished)) return;
  caller_sleeping_.store(true);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, finished);
  }
  caller_sleeping_.store(false);
}

void ThreadPool::ParallelFor(int64_t count, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // Small jobs are not worth handing out.
  if (workers_.empty() || count <= grain) {
    fn(0, count);
    return;
  }
  fn_ = &fn;
  count_ = count;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1);  // Publishes the job (sequentially consistent: see mu_).
  if (sleeping_workers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    start_cv_.notify_all();
  }
  RunChunks();
  WaitForWorkers();
  fn_ = nullptr;
}

}  // namespace conveyor::kernels
