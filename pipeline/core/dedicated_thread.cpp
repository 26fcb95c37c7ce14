#include "pipeline/core/dedicated_thread.hpp"

#include <utility>

namespace precompute {

DedicatedThread::DedicatedThread() : thread_([this] { loop(); }) {}

DedicatedThread::~DedicatedThread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void DedicatedThread::run(const std::function<void()>& task) {
  std::unique_lock lock(mutex_);
  task_ = &task;
  finished_ = false;
  error_ = nullptr;
  wake_.notify_one();
  done_.wait(lock, [this] { return finished_; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void DedicatedThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || (task_ != nullptr && !finished_); });
    if (stop_) return;
    const auto* task = task_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*task)();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    finished_ = true;
    done_.notify_one();
  }
}

}  // namespace precompute
