#include "pipeline/core/low_priority_threads.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

namespace precompute {

struct LowPriorityThreads::Job {
  const std::function<void()>* fn = nullptr;
  std::exception_ptr error;
  bool done = false;
  std::condition_variable finished;
};

LowPriorityThreads::LowPriorityThreads(int nice_increment)
    : nice_increment_(std::max(0, nice_increment)) {}

LowPriorityThreads::~LowPriorityThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (auto& thread : threads_) thread.join();
}

int LowPriorityThreads::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(threads_.size());
}

int LowPriorityThreads::lowered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lowered_;
}

void LowPriorityThreads::run_and_wait(const std::function<void()>& fn) {
  Job job;
  job.fn = &fn;
  std::unique_lock<std::mutex> lock(mutex_);
  queue_.push_back(&job);
  if (idle_ < static_cast<int>(queue_.size())) {
    // Nice values belong to threads on Linux; a new thread starts with its creator's, which is
    // the caller's here, and lowers it in serve().
    threads_.emplace_back([this] { serve(); });
  } else {
    work_.notify_one();
  }
  job.finished.wait(lock, [&] { return job.done; });
  lock.unlock();
  if (job.error) std::rethrow_exception(job.error);
}

void LowPriorityThreads::serve() {
  // getpriority may return -1 as a value: errno tells it from a failure.
  errno = 0;
  const int own = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  const bool read = errno == 0;
  const bool lowered =
      read && ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()),
                            std::min(19, own + nice_increment_)) == 0;
  std::unique_lock<std::mutex> lock(mutex_);
  if (lowered) ++lowered_;
  for (;;) {
    ++idle_;
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stopping, nothing left
    Job* job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    try {
      (*job->fn)();
    } catch (...) {
      job->error = std::current_exception();
    }
    lock.lock();
    job->done = true;
    job->finished.notify_one();
  }
}

}  // namespace precompute
