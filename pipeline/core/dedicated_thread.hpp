#pragma once
// A thread of its own that runs one task at a time for whoever holds it, the caller waiting
// for the task as if it had run it itself (its exception rethrown in the caller). For work whose
// cost depends on which thread does it: CUDA libraries keep state per thread (a cuBLAS handle
// per thread, a workspace per handle and stream), so a task pool that lets any thread call a
// model grows that state with the pool (Note [One thread per CUDA stream] in
// encoders/torch_encoder.cpp).

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace precompute {

class DedicatedThread {
 public:
  DedicatedThread();
  ~DedicatedThread();  // joins; no task may be running
  DedicatedThread(const DedicatedThread&) = delete;
  DedicatedThread& operator=(const DedicatedThread&) = delete;

  // Runs `task` on this thread and returns when it has; rethrows what it threw. One caller at a
  // time (the owner hands the thread to one caller).
  void run(const std::function<void()>& task);

  std::thread::id id() const { return thread_.get_id(); }

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void()>* task_ = nullptr;
  std::exception_ptr error_;
  bool finished_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace precompute
