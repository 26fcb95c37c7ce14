#pragma once
// Keeping a file that crashes or hangs a decoder from making a job unfinishable
// (Note [Crash containment] in crash_containment.cpp): the run journals which samples are being
// prepared in a memory-mapped file that survives the process, a watchdog ends a process whose
// sample overruns its time, the supervisor (tools/cli/supervisor.hpp) restarts it and marks the
// samples that were in flight as suspects in a quarantine file, and the next run prepares each
// suspect alone, recording it as failed once it has brought the process down twice.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pipeline/core/sample.hpp"

namespace precompute {

inline constexpr std::string_view kInflightFileName = ".precompute.inflight";
inline constexpr std::string_view kQuarantineFileName = ".precompute.quarantine";

// A sample that was being prepared when the process died.
struct QuarantineEntry {
  int64_t seq = 0;
  int crashes = 0;       // process deaths while it was in flight
  bool timed_out = false;  // the watchdog ended the process over this very sample
  std::string reason;    // for the failure record
};
using Quarantine = std::map<int64_t, QuarantineEntry>;

// The output folder's quarantine; empty when there is none. Throws StorageError when damaged.
Quarantine read_quarantine(const std::filesystem::path& output_dir);
// Replaces it atomically.
void write_quarantine(const std::filesystem::path& output_dir, const Quarantine& quarantine);

// The samples in flight, in a file mapped into memory: stores are plain memory writes, and the
// page cache keeps them when the process dies, for the supervisor to read.
class InflightJournal {
 public:
  InflightJournal(const std::filesystem::path& output_dir, int slots);
  ~InflightJournal();  // removes the file: only a process that died leaves one
  InflightJournal(const InflightJournal&) = delete;
  InflightJournal& operator=(const InflightJournal&) = delete;

  // Marks `seq` in flight until the returned guard is destroyed.
  class Entry {
   public:
    Entry(InflightJournal* journal, int slot) : journal_(journal), slot_(slot) {}
    Entry(Entry&& other) noexcept : journal_(other.journal_), slot_(other.slot_) {
      other.journal_ = nullptr;
    }
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    Entry& operator=(Entry&&) = delete;
    ~Entry();

   private:
    InflightJournal* journal_;
    int slot_;
  };
  Entry begin(int64_t seq);

  // Samples in flight for longer than `limit`; they are flagged as timed out in the file.
  std::vector<int64_t> flag_overdue(std::chrono::nanoseconds limit);

  struct Record {
    int64_t seq = 0;
    bool timed_out = false;
  };
  // What a dead run's journal says was in flight; empty when there is no journal.
  static std::vector<Record> read(const std::filesystem::path& output_dir);

 private:
  struct Slot;
  void release(int slot);

  std::filesystem::path file_;
  Slot* slots_ = nullptr;
  int num_slots_ = 0;
  size_t mapped_bytes_ = 0;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<int> free_;
};

// Ends the process with exit code 75 (the supervisor restarts it) when a sample has been in
// flight for longer than `limit`: a decoder stuck in a loop cannot be interrupted in-process.
class SampleWatchdog {
 public:
  SampleWatchdog(InflightJournal& journal, std::chrono::nanoseconds limit);
  ~SampleWatchdog();
  SampleWatchdog(const SampleWatchdog&) = delete;
  SampleWatchdog& operator=(const SampleWatchdog&) = delete;

 private:
  InflightJournal* journal_;
  std::chrono::nanoseconds limit_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

// The prepare stage with crash containment around it: each sample is journalled while it is
// prepared; a suspect from the quarantine is prepared alone (no other sample in flight), and one
// that crashed the process twice, or hung it, is not decoded again: its media modalities get
// failure records of category `crash` or `timeout`, its text is still embedded.
class ContainedPreparer {
 public:
  // SamplePreparer: prepares a sample, or, given SkippedMedia, all of it but its media.
  using Prepare = std::function<PreparedSamplePtr(const SampleSpec&, const SkippedMedia*)>;
  ContainedPreparer(Prepare prepare, InflightJournal& journal, Quarantine quarantine);

  PreparedSamplePtr operator()(const SampleSpec& spec);

 private:
  Prepare prepare_;
  InflightJournal* journal_;
  Quarantine quarantine_;
  std::shared_mutex alone_;  // suspects hold it exclusively
};

}  // namespace precompute
