#include "tools/cli/supervisor.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "encoders/unpacked_packages.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/crash_containment.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

std::atomic<pid_t> g_child{0};
std::atomic<int> g_forwarded{0};

// SIGINT/SIGTERM/SIGHUP reach the supervisor (the child has its own process group, so a Ctrl-C in a
// terminal reaches only the supervisor) and go on to the child, which stops gracefully; a
// second one makes the child exit at once (pipeline/core/stop_request.cpp).
void forward(int signal) {
  g_forwarded.store(signal);
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, signal);
}

bool is_crash_signal(int signal) {
  switch (signal) {
    case SIGSEGV:
    case SIGBUS:
    case SIGABRT:
    case SIGFPE:
    case SIGILL:
    case SIGSYS:
    case SIGTRAP:
      return true;
    default:
      return false;
  }
}

// Adds the samples the dead child had in flight to the quarantine; returns how many entries
// changed (0: the crash cannot be pinned on any sample).
int quarantine_in_flight(const std::filesystem::path& output_dir, const std::string& cause,
                         bool watchdog) {
  const auto in_flight = InflightJournal::read(output_dir);
  Quarantine quarantine = read_quarantine(output_dir);
  int changed = 0;
  for (const auto& record : in_flight) {
    // After a watchdog exit only the flagged samples are to blame; the others were waiting.
    if (watchdog && !record.timed_out) continue;
    auto& entry = quarantine[record.seq];
    entry.seq = record.seq;
    if (record.timed_out) {
      entry.timed_out = true;
      entry.reason = "preparing it took longer than run.sample_timeout_s (a stuck decoder)";
    } else {
      ++entry.crashes;
      entry.reason = "the process crashed (" + cause + ") twice while preparing it";
    }
    ++changed;
  }
  if (changed > 0) write_quarantine(output_dir, quarantine);
  return changed;
}

}  // namespace

SharedFlag::SharedFlag() {
  void* page = ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  PC_CHECK(page != MAP_FAILED, InternalError, "cannot map a shared page: ", std::strerror(errno));
  page_ = new (page) std::atomic<int>(0);
}

SharedFlag::~SharedFlag() {
  if (page_ != nullptr) ::munmap(page_, sizeof(std::atomic<int>));
}

void SharedFlag::set() { static_cast<std::atomic<int>*>(page_)->store(1); }

bool SharedFlag::is_set() const { return static_cast<std::atomic<int>*>(page_)->load() != 0; }

std::optional<int> supervise(const std::filesystem::path& output_dir, int max_restarts,
                             SharedFlag* quarantined) {
  handle_stop_signals(forward);

  const pid_t parent = ::getpid();
  int fruitless = 0;  // crashes in a row that quarantined nothing new
  for (int start = 0;; ++start) {
    spdlog::default_logger()->flush();
    const pid_t child = ::fork();
    PC_CHECK(child >= 0, InternalError, "cannot start the run: fork failed: ",
             std::strerror(errno));
    if (child == 0) {
      // Dies with the supervisor, whatever kills it; and takes signals only through it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(kExitRestart);
      ::setpgid(0, 0);
      handle_stop_signals(SIG_DFL);
      return std::nullopt;
    }
    g_child.store(child);
    // A signal that arrived between fork() and the store above was not forwarded.
    if (const int early = g_forwarded.load(); early != 0) ::kill(child, early);

    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
      PC_CHECK(errno == EINTR, InternalError, "waiting for the run failed: ",
               std::strerror(errno));
    }
    g_child.store(0);
    remove_packages_left_by(child);  // a run that died loading a package (Note [Unpacked packages])
    if (g_forwarded.load() != 0) {
      // Stopped on request: never restart, end as the child did.
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + g_forwarded.load();
    }
    std::string cause;
    bool watchdog = false;
    if (WIFEXITED(status)) {
      if (WEXITSTATUS(status) != kExitRestart) return WEXITSTATUS(status);
      watchdog = true;
      cause = "its watchdog ended it";
    } else if (WIFSIGNALED(status) && (is_crash_signal(WTERMSIG(status)) ||
                                       WTERMSIG(status) == SIGKILL)) {
      cause = std::string("signal ") + std::to_string(WTERMSIG(status)) + ", " +
              strsignal(WTERMSIG(status));
    } else {
      return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : kExitInternal;
    }
    // A SIGKILL of the child alone comes from the kernel's OOM killer, not from a sample:
    // restart without blaming the samples in flight. (A kill of the whole job takes the
    // supervisor too.)
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    const int blamed = killed ? 0 : quarantine_in_flight(output_dir, cause, watchdog);
    if (blamed > 0 && quarantined != nullptr) quarantined->set();
    fruitless = blamed > 0 ? 0 : fruitless + 1;
    if (fruitless > max_restarts) {
      spdlog::error("the run died {} times in a row ({}) with no sample to blame; giving up. "
                    "Rerun the same command to resume from the committed shards",
                    fruitless, cause);
      return kExitInternal;
    }
    spdlog::warn("the run died ({}); {} sample(s) in flight quarantined; restarting it to "
                 "resume (restart {})", cause, blamed, start + 1);
  }
}

}  // namespace precompute
