#pragma once
// Threads at a lower scheduling priority than the rest of the process, each running one job for
// a caller that waits for it: how CPU video decodes step aside for the threads that keep NVDEC's
// engines fed (Note [CPU decoders at a lower priority] in
// pipeline/stages/video_decoder_scheduler.cpp).
// Linux lets a thread lower its own priority but not raise it again without privilege, so the
// lowered threads are kept for this and never return to the caller's work.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace precompute {

class LowPriorityThreads {
 public:
  // `nice_increment`: how much higher the threads' nice value is than the creating thread's
  // (capped at 19, the lowest priority).
  explicit LowPriorityThreads(int nice_increment);
  ~LowPriorityThreads();  // joins the threads; no job may still be waited for
  LowPriorityThreads(const LowPriorityThreads&) = delete;
  LowPriorityThreads& operator=(const LowPriorityThreads&) = delete;

  // Runs `fn` on one of the threads and returns what it returns, or rethrows what it throws, as
  // is. A call never queues behind another: a thread is added when every thread is busy, so
  // there are as many threads as callers were ever waiting at once.
  template <class Fn>
  std::invoke_result_t<Fn&> run(Fn&& fn) {
    using Result = std::invoke_result_t<Fn&>;
    if constexpr (std::is_void_v<Result>) {
      run_and_wait([&] { fn(); });
    } else {
      std::optional<Result> result;
      run_and_wait([&] { result.emplace(fn()); });
      return std::move(*result);
    }
  }

  int threads() const;
  // Threads whose priority was lowered; fewer than threads() when the system refused (the jobs
  // then run at the caller's priority, which is only slower).
  int lowered() const;

 private:
  struct Job;
  void run_and_wait(const std::function<void()>& fn);
  void serve();

  const int nice_increment_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Job*> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  int lowered_ = 0;
  bool stopping_ = false;
};

}  // namespace precompute
