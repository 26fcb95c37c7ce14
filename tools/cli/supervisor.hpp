#pragma once
// The process that watches a run (Note [Crash containment] in pipeline/crash_containment.cpp):
// it forks the run as a child, forwards SIGINT, SIGTERM and SIGHUP to it, and when the child dies of a
// crash signal or exits with 75 (its watchdog found a stuck decoder), quarantines the samples
// that were in flight and starts it again, which resumes from the committed shards.

#include <filesystem>
#include <optional>

namespace precompute {

// A flag shared by a supervisor and every child it starts (one shared anonymous page, made
// before the first fork): the first child sets it, the restarted ones read it
// (Note [Overwrite once] in pipeline/runner.cpp).
class SharedFlag {
 public:
  SharedFlag();
  ~SharedFlag();
  SharedFlag(const SharedFlag&) = delete;
  SharedFlag& operator=(const SharedFlag&) = delete;

  void set();
  bool is_set() const;

 private:
  void* page_ = nullptr;
};

// Forks. In the child returns std::nullopt at once: the caller runs the job and exits. In the
// parent returns the exit code to end with: the child's, once it ends other than by a crash, or
// kExitInternal after `max_restarts` crashes in a row that quarantined nothing new.
// `quarantined`, when given, is set once this supervisor has written the folder's quarantine:
// the restarted runs know it for this command's (Note [Decoding while the encoders load] in
// pipeline/early_decoding.cpp).
std::optional<int> supervise(const std::filesystem::path& output_dir, int max_restarts,
                             SharedFlag* quarantined = nullptr);

}  // namespace precompute
