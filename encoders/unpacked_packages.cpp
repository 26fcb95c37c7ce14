#include "encoders/unpacked_packages.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <system_error>

namespace precompute {
namespace {

// Note [Unpacked packages]
// LibTorch's loader unpacks a package (its compiled code, and weights as big as the model) into
// a fresh folder /tmp/XXXXXX, whatever TMPDIR says, and removes it only when the model is
// destroyed: a crash, a kill -9 or the OOM killer leaves a copy of the model in /tmp each time,
// and a node that restarts precompute for weeks fills up. Which folders are this process's is
// read from /proc/self/maps (the package's library is mapped from there).
// - A CPU package needs nothing more from the folder once loaded (its code is mapped, its weights
//   in memory), so the folder is removed at once.
// - A CUDA package loads each kernel's cubin from the folder the first time the kernel runs, and
//   which kernels run depends on the batch's shape, so the folder must outlive the model. Its
//   name goes into a ledger instead, /tmp/precompute-pt2/<pid>.<folder>, and each load first
//   removes the folders of ledger entries whose process is gone. So a killed run's copy is
//   removed by the next run that loads a package on that machine.
// - A run that dies while a package is loading (a decoder crash among the samples decoded
//   meanwhile: Note [Decoding while the encoders load] in pipeline/early_decoding.cpp) leaves a
//   folder nobody has named yet. So each load first records "<pid>.loading" in the ledger, with
//   the /tmp/XXXXXX folders there were, and the supervisor, once it sees the run dead, removes
//   the folders made since that are not in the ledger and look like an unpacking package. Loads
//   hold the ledger's lock shared and the supervisor takes it alone, so no other run's package is
//   being unpacked while it looks. Without a supervisor (--no-supervisor, or one that died too),
//   the next load on the machine that finds the lock free does the same for every record whose
//   process has ended: it tries the lock alone without waiting, because waiting would hold its
//   own load up behind every other run's, and a copy not removed now is removed by a later load.
constexpr const char* kLedger = "/tmp/precompute-pt2";

// Whether `name` is one the loader gives its folders in /tmp: six characters (mkdtemp's XXXXXX).
bool loader_folder_name(const std::string& name) { return name.size() == 6; }

// The folders /tmp/XXXXXX that hold a package this process has loaded.
std::vector<std::filesystem::path> unpacked_folders() {
  std::vector<std::filesystem::path> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const std::string marker = "/data/aotinductor/";
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos || line.find(" (deleted)") != std::string::npos) continue;
    const std::filesystem::path mapped = line.substr(slash);
    const auto at = mapped.string().find(marker);
    if (at == std::string::npos) continue;
    // /tmp/XXXXXX/<package>/data/aotinductor/<model>/<name>.so: the folder is two above "data".
    const std::filesystem::path root =
        std::filesystem::path(mapped.string().substr(0, at)).parent_path();
    if (root.parent_path() != "/tmp" || !loader_folder_name(root.filename().string())) continue;
    if (std::find(found.begin(), found.end(), root) == found.end()) found.push_back(root);
  }
  return found;
}

// A ledger entry's name, "<pid>.<what>": a loaded folder's name, or "loading".
struct LedgerEntry {
  pid_t pid = 0;
  std::string what;
};

std::optional<LedgerEntry> ledger_entry(const std::string& name) {
  const auto dot = name.find('.');
  if (dot == std::string::npos || dot == 0) return std::nullopt;
  char* end = nullptr;
  const long pid = std::strtol(name.c_str(), &end, 10);
  if (end != name.c_str() + dot || pid <= 0 || pid > std::numeric_limits<pid_t>::max()) {
    return std::nullopt;
  }
  return LedgerEntry{static_cast<pid_t>(pid), name.substr(dot + 1)};
}

// Whether `pid` has ended. One alive, or not ours to ask about, is kept until it has.
bool has_ended(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Removes the folders of ledger entries whose process has ended, and those entries.
void remove_folders_of_ended_runs() {
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(kLedger, ec)) {
    const auto entry = ledger_entry(file.path().filename().string());
    // A load's record: what it unpacked is only known under the lock alone.
    if (!entry || entry->what == "loading" || !has_ended(entry->pid)) continue;
    std::error_code ignored;
    if (loader_folder_name(entry->what)) {
      std::filesystem::remove_all(std::filesystem::path("/tmp") / entry->what, ignored);
    }
    std::filesystem::remove(file.path(), ignored);
  }
}

// Creates the ledger's folder where it is missing. Anyone's runs on the machine share it; each
// removes only ended processes' folders.
void make_ledger() {
  std::error_code ec;
  std::filesystem::create_directories(kLedger, ec);
  std::filesystem::permissions(
      kLedger, std::filesystem::perms::all | std::filesystem::perms::sticky_bit, ec);
}

// After a load, for the folders it unpacked (those not in `before`): removes them (CPU), or
// writes them into the ledger (CUDA). The process's other packages keep theirs: a CPU package
// loaded after a CUDA one must not take the CUDA one's kernels away.
void settle_unpacked_folders(const std::vector<std::filesystem::path>& before, bool keep) {
  std::error_code ec;
  if (keep) make_ledger();
  for (const auto& folder : unpacked_folders()) {
    if (std::find(before.begin(), before.end(), folder) != before.end()) continue;
    if (keep) {
      std::ofstream(std::filesystem::path(kLedger) /
                    (std::to_string(::getpid()) + "." + folder.filename().string()));
    } else {
      std::filesystem::remove_all(folder, ec);
    }
  }
}

// The /tmp/XXXXXX folders there are now, by name.
std::set<std::string> folders_in_tmp() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    if (loader_folder_name(name) && entry.is_directory(ignored) && !entry.is_symlink(ignored)) {
      names.insert(name);
    }
  }
  return names;
}

// Whether `folder` holds what an interrupted unpacking leaves: nothing yet, or the package's
// folders, each empty or holding its "data".
bool looks_unpacked(const std::filesystem::path& folder) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    std::error_code ignored;
    if (entry.is_symlink(ignored) || !entry.is_directory(ignored)) return false;
    for (const auto& inside : std::filesystem::directory_iterator(entry.path(), ignored)) {
      if (inside.path().filename() != "data") return false;
    }
  }
  return !ec;
}

std::filesystem::path loading_record(int pid) {
  return std::filesystem::path(kLedger) / (std::to_string(pid) + ".loading");
}

// The ledger's lock file, opened (-1 where it cannot be: the lock is then skipped).
int open_ledger_lock() {
  const auto lock = std::filesystem::path(kLedger) / ".lock";
  return ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
}

// With the ledger's lock held alone: removes what run `pid`, now ended, was unpacking when it
// died, and its record.
void remove_unpacking_of(int pid) {
  const auto record = loading_record(pid);
  std::error_code ec;
  const auto started = std::filesystem::last_write_time(record, ec);
  if (ec) return;  // it died loading no package
  std::set<std::string> before;
  {
    std::ifstream in(record);
    for (std::string name; std::getline(in, name);) before.insert(name);
  }
  std::set<std::string> named;  // folders the ledger names: loaded, and someone's
  for (const auto& file : std::filesystem::directory_iterator(kLedger, ec)) {
    if (const auto entry = ledger_entry(file.path().filename().string())) {
      named.insert(entry->what);
    }
  }
  for (const auto& name : folders_in_tmp()) {
    if (before.count(name) > 0 || named.count(name) > 0) continue;
    const auto folder = std::filesystem::path("/tmp") / name;
    std::error_code time_error;
    if (std::filesystem::last_write_time(folder, time_error) < started || time_error) continue;
    if (!looks_unpacked(folder)) continue;
    std::error_code ignored;
    std::filesystem::remove_all(folder, ignored);
  }
  std::error_code ignored;
  std::filesystem::remove(record, ignored);
}

// With the ledger's lock held alone: remove_unpacking_of() for every load record whose process
// has ended.
void remove_unpackings_of_ended_runs() {
  std::vector<pid_t> ended;
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(kLedger, ec)) {
    const auto entry = ledger_entry(file.path().filename().string());
    if (entry && entry->what == "loading" && has_ended(entry->pid)) ended.push_back(entry->pid);
  }
  for (const pid_t pid : ended) remove_unpacking_of(pid);
}

}  // namespace

void forget_removed_packages() {
  std::error_code ec;
  const std::string mine = std::to_string(::getpid()) + ".";
  for (const auto& entry : std::filesystem::directory_iterator(kLedger, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(mine, 0) != 0) continue;
    std::error_code ignored;
    if (!std::filesystem::exists(std::filesystem::path("/tmp") / name.substr(mine.size()),
                                 ignored)) {
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

PackageUnpacking::PackageUnpacking() {
  make_ledger();
  lock_fd_ = open_ledger_lock();
  if (lock_fd_ >= 0) {
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) remove_unpackings_of_ended_runs();
    // From alone to shared, or waiting for a supervisor's clean-up to end.
    while (::flock(lock_fd_, LOCK_SH) != 0 && errno == EINTR) {
    }
  }
  remove_folders_of_ended_runs();
  record_ = loading_record(::getpid());
  std::ofstream record(record_);
  for (const auto& name : folders_in_tmp()) record << name << "\n";
  before_ = unpacked_folders();
}

PackageUnpacking::~PackageUnpacking() {
  std::error_code ignored;
  std::filesystem::remove(record_, ignored);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

void PackageUnpacking::settle(bool keep) { settle_unpacked_folders(before_, keep); }

void remove_packages_left_by(int pid) {
  std::error_code ec;
  if (!std::filesystem::exists(loading_record(pid), ec)) return;  // it died loading no package
  const int lock = open_ledger_lock();
  if (lock >= 0) {
    while (::flock(lock, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  remove_unpacking_of(pid);
  if (lock >= 0) ::close(lock);
}

}  // namespace precompute
