#include "pipeline/crash_containment.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include "pipeline/core/error.hpp"
#include "pipeline/core/pause_clock.hpp"
#include "storage/atomic_file.hpp"

namespace precompute {

// Note [Crash containment]
// FFmpeg's interrupt callback bounds I/O, not a decoder looping inside one packet, and a
// decoder that crashes takes the whole process with it (docs/reliability.md, "What HDF5 and
// FFmpeg do on their own"). Decoding in separate processes would cost a copy of every decoded
// frame; instead the run stays one process and makes its death cheap and attributable:
// - every sample being prepared has a slot in .precompute.inflight, a small file mapped into
//   memory (a store per sample, no system call);
// - a watchdog thread ends the process with exit code 75 when a slot is older than the time
//   limit, after flagging that slot;
// - the supervisor process (tools/cli/supervisor.cpp) sees the child die (crash signal or 75),
//   reads the slots and adds their samples to .precompute.quarantine, then restarts the run,
//   which resumes from its committed shards;
// - the restarted run prepares each suspect alone, so a second crash names it exactly; a sample
//   with two crashes, or the one the watchdog flagged, is recorded as failed without being
//   decoded again. Innocent samples that happened to be in flight are prepared alone once and
//   go on normally.
// A sample not decoded again still goes through the preparer, whole, told to skip its media
// (SkippedMedia): the preparer alone decides which modalities a line gives (audio may come from
// the clip) and records each skipped one once. Handed the line without its media instead, it
// would judge a line without a caption as giving nothing and add a no_input record for every
// modality beside the crash ones.
// A kill by the user or the scheduler (SIGKILL of the whole job) is not a crash: nothing is
// quarantined, the rerun simply resumes.

namespace {

// The in-flight file: a header, then one slot per concurrent sample.
constexpr uint64_t kJournalMagic = 0x70632d696e666c74ULL;  // "pc-inflt"

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Test hook for the crash-containment tests: PRECOMPUTE_TEST_DECODER_FAULT=crash:TEXT or
// hang:TEXT makes preparing any sample whose media path contains TEXT crash (SIGSEGV) or hang,
// as a broken decoder would; stop:TEXT stops the process (SIGSTOP) there, for the pause tests.
void inject_decoder_fault(const SampleSpec& spec) {
  static const std::string setting = [] {
    const char* value = std::getenv("PRECOMPUTE_TEST_DECODER_FAULT");
    return std::string(value == nullptr ? "" : value);
  }();
  if (setting.empty()) return;
  const auto colon = setting.find(':');
  if (colon == std::string::npos) return;
  const std::string kind = setting.substr(0, colon);
  const std::string needle = setting.substr(colon + 1);
  const auto matches = [&](const std::optional<MediaSource>& p) {
    return p && p->name().find(needle) != std::string::npos;
  };
  if (!matches(spec.video) && !matches(spec.audio)) return;
  if (kind == "crash") ::raise(SIGSEGV);
  // The process stops itself, as `kill -STOP` or Ctrl-Z would, with this sample in flight.
  if (kind == "stop") ::raise(SIGSTOP);
  if (kind == "hang") {
    for (;;) ::pause();
  }
}

}  // namespace

struct InflightJournal::Slot {
  std::atomic<int64_t> seq_plus_one;  // 0: free
  std::atomic<int64_t> started_ns;
  std::atomic<int64_t> timed_out;
};

struct JournalHeader {
  uint64_t magic;
  int64_t slots;
};

InflightJournal::InflightJournal(const std::filesystem::path& output_dir, int slots)
    : file_(output_dir / kInflightFileName), num_slots_(slots) {
  PC_ASSERT(slots >= 1, "in-flight journal needs a slot");
  const auto& file = file_;
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PC_CHECK(fd >= 0, StorageError, "cannot create ", file, ": ",
           std::generic_category().message(errno));
  mapped_bytes_ = sizeof(JournalHeader) + sizeof(Slot) * static_cast<size_t>(slots);
  // Allocate the blocks now: a mapping of a sparse file on a full disk would fail later with
  // SIGBUS on the first store, instead of an error here.
  if (const int error = ::posix_fallocate(fd, 0, static_cast<off_t>(mapped_bytes_));
      error != 0) {
    ::close(fd);
    PC_THROW(StorageError, "cannot write ", file, ": ",
             error == ENOSPC ? "disk full (" + std::generic_category().message(error) + ")"
                             : std::generic_category().message(error));
  }
  void* memory = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  ::close(fd);
  PC_CHECK(memory != MAP_FAILED, StorageError, "cannot map ", file, ": ",
           std::generic_category().message(error));
  auto* header = static_cast<JournalHeader*>(memory);
  header->magic = kJournalMagic;
  header->slots = slots;
  slots_ = reinterpret_cast<Slot*>(static_cast<char*>(memory) + sizeof(JournalHeader));
  for (int i = 0; i < slots; ++i) {
    new (&slots_[i]) Slot{};
    free_.push_back(slots - 1 - i);
  }
}

InflightJournal::~InflightJournal() {
  if (slots_ != nullptr) {
    ::munmap(reinterpret_cast<char*>(slots_) - sizeof(JournalHeader), mapped_bytes_);
  }
  ::unlink(file_.c_str());
}

InflightJournal::Entry InflightJournal::begin(int64_t seq) {
  std::unique_lock lock(mutex_);
  freed_.wait(lock, [&] { return !free_.empty(); });
  const int slot = free_.back();
  free_.pop_back();
  slots_[slot].started_ns.store(now_ns());
  slots_[slot].timed_out.store(0);
  slots_[slot].seq_plus_one.store(seq + 1);
  return Entry(this, slot);
}

void InflightJournal::release(int slot) {
  slots_[slot].seq_plus_one.store(0);
  {
    const std::lock_guard lock(mutex_);
    free_.push_back(slot);
  }
  freed_.notify_one();
}

InflightJournal::Entry::~Entry() {
  if (journal_ != nullptr) journal_->release(slot_);
}

std::vector<int64_t> InflightJournal::flag_overdue(std::chrono::nanoseconds limit) {
  std::vector<int64_t> overdue;
  const int64_t now = now_ns();
  for (int i = 0; i < num_slots_; ++i) {
    const int64_t seq_plus_one = slots_[i].seq_plus_one.load();
    if (seq_plus_one == 0) continue;
    // A limit counts from the last resume when the process was stopped since the sample
    // started (Note [Paused runs] in pipeline/core/pause_clock.cpp).
    const int64_t started = std::max(slots_[i].started_ns.load(), last_resume_ns());
    if (now - started > limit.count()) {
      slots_[i].timed_out.store(1);
      overdue.push_back(seq_plus_one - 1);
    }
  }
  return overdue;
}

std::vector<InflightJournal::Record> InflightJournal::read(
    const std::filesystem::path& output_dir) {
  std::vector<Record> records;
  std::ifstream in(output_dir / kInflightFileName, std::ios::binary);
  if (!in) return records;
  JournalHeader header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof(header)) ||
      header.magic != kJournalMagic || header.slots < 1 || header.slots > (1 << 20)) {
    return records;
  }
  for (int64_t i = 0; i < header.slots; ++i) {
    int64_t fields[3] = {};
    static_assert(sizeof(fields) == sizeof(Slot));
    if (!in.read(reinterpret_cast<char*>(fields), sizeof(fields))) break;
    if (fields[0] > 0) records.push_back({fields[0] - 1, fields[2] != 0});
  }
  return records;
}

Quarantine read_quarantine(const std::filesystem::path& output_dir) {
  Quarantine quarantine;
  const auto file = output_dir / kQuarantineFileName;
  std::ifstream in(file);
  if (!in) return quarantine;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    std::istringstream fields(line);
    QuarantineEntry e;
    int timed_out = 0;
    PC_CHECK(static_cast<bool>(fields >> e.seq >> e.crashes >> timed_out), StorageError, file,
             " line ", number, " is damaged; delete the file to retry its samples normally");
    std::getline(fields >> std::ws, e.reason);
    e.timed_out = timed_out != 0;
    quarantine[e.seq] = e;
  }
  return quarantine;
}

void write_quarantine(const std::filesystem::path& output_dir, const Quarantine& quarantine) {
  std::string text;
  for (const auto& [seq, e] : quarantine) {
    text += std::to_string(seq) + " " + std::to_string(e.crashes) + " " +
            (e.timed_out ? "1" : "0") + " " + e.reason + "\n";
  }
  write_file_atomically(output_dir / kQuarantineFileName, text);
}

SampleWatchdog::SampleWatchdog(InflightJournal& journal, std::chrono::nanoseconds limit)
    : journal_(&journal), limit_(limit) {
  // Ticks count from here, so that a stop before the first tick (or before the thread runs at
  // all) is seen too: the SIGCONT handler may run only after the thread's first tick, and a
  // freezer sends no SIGCONT. (Counted from 0 before, such a stop ended the run, exit 75: once
  // in the pause test of a CI run on a busy 2-core machine, and every time in
  // SampleWatchdogTest.AStopBeforeItsFirstTickIsAPauseNotATimeout.)
  const int64_t created_ns = steady_now_ns();
  thread_ = std::thread([this, created_ns] {
    std::unique_lock lock(mutex_);
    constexpr int64_t kPeriodNs = 200'000'000;
    // Far more than any scheduling delay of a running process: a pause, not a busy machine.
    constexpr int64_t kStallNs = 3'000'000'000;
    int64_t previous_tick = created_ns;
    while (!stop_.wait_for(lock, std::chrono::nanoseconds(kPeriodNs), [&] { return stopping_; })) {
      note_tick(steady_now_ns(), previous_tick, kPeriodNs, kStallNs);
      const auto overdue = journal_->flag_overdue(limit_);
      if (overdue.empty()) continue;
      spdlog::error("sample at input position {} has been prepared for over {:.0f} s "
                    "(run.sample_timeout_s); a decoder is stuck. The process exits (75) for its "
                    "supervisor to restart it without that sample; run with --no-supervisor, "
                    "rerun without that flag to resume",
                    overdue.front(), std::chrono::duration<double>(limit_).count());
      spdlog::default_logger()->flush();
      ::_exit(75);
    }
  });
}

SampleWatchdog::~SampleWatchdog() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  thread_.join();
}

ContainedPreparer::ContainedPreparer(Prepare prepare, InflightJournal& journal,
                                     Quarantine quarantine)
    : prepare_(std::move(prepare)), journal_(&journal), quarantine_(std::move(quarantine)) {}

PreparedSamplePtr ContainedPreparer::operator()(const SampleSpec& spec) {
  const auto suspect = quarantine_.find(spec.seq);
  if (suspect == quarantine_.end()) {
    const std::shared_lock shared(alone_);
    const auto entry = journal_->begin(spec.seq);
    inject_decoder_fault(spec);
    return prepare_(spec, nullptr);
  }
  const QuarantineEntry& q = suspect->second;
  if (q.timed_out || q.crashes >= 2) {
    // Not decoded again: text alone goes on, the media modalities are recorded as failed.
    const SkippedMedia skipped{q.timed_out ? FailureCategory::kTimeout : FailureCategory::kCrashed,
                               detail::concat("sample '", spec.id, "': ", q.reason,
                                              "; it was skipped so that the run could finish")};
    return prepare_(spec, &skipped);
  }
  // A suspect: prepared with nothing else in flight, so that a crash now names it.
  const std::unique_lock alone(alone_);
  spdlog::info("sample '{}' (input position {}) was in flight when the run crashed; preparing "
               "it alone", spec.id, spec.seq);
  const auto entry = journal_->begin(spec.seq);
  inject_decoder_fault(spec);
  return prepare_(spec, nullptr);
}

}  // namespace precompute
