// precompute: video, audio and text embeddings into sharded HDF5. See README.md.

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"
#include "pipeline/core/media_names.hpp"
#include "pipeline/start_up_trace.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {

int exit_code_for(const Error& e) {
  if (dynamic_cast<const OutputLockedError*>(&e) != nullptr) return kExitOutputLocked;
  if (dynamic_cast<const OutputFolderError*>(&e) != nullptr) return kExitOutputUnavailable;
  if (const auto* stopped = dynamic_cast<const StoppedError*>(&e)) return 128 + stopped->signal();
  switch (e.kind()) {
    case ErrorKind::kConfig:
    case ErrorKind::kModel:
      return kExitUsage;
    case ErrorKind::kInput:
      return kExitInvalidInput;
    case ErrorKind::kStorage:
      return kExitIoError;
    case ErrorKind::kStopped:
      return kExitRestart;  // not reached: a StoppedError has its signal
    case ErrorKind::kMedia:
    case ErrorKind::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

namespace {

int main_impl(int argc, char** argv) {
  CLI::App app{"precompute: turn videos, audio and captions into embeddings in sharded HDF5"};
  app.set_version_flag("--version", std::string("precompute ") + PRECOMPUTE_VERSION);
  app.require_subcommand(1);
  const auto run = add_run_command(app, std::vector<std::string>(argv, argv + argc));
  const auto inspect = add_inspect_command(app);
  const auto tokenize = add_tokenize_command(app);
  const auto doctor = add_doctor_command(app);
  const auto verify = add_verify_command(app);
  const auto merge = add_merge_command(app);
  const auto status = add_status_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // `--input shards/{0..9}.tar` unquoted: the shell expands the range into many arguments,
    // of which --input takes the first; precompute expands the range itself when it is quoted.
    for (int i = 2; i < argc; ++i) {
      if (is_tar_name(argv[i]) && is_tar_name(argv[i - 1])) {
        std::cerr << "Tar shards after --input: a brace range the shell expanded? Quote it, as "
                     "in --input 'shards/{000000..000099}.tar', and precompute expands it "
                     "itself.\n";
        break;
      }
    }
    return code == 0 ? 0 : kExitUsage;
  }
  try {
    if (app.got_subcommand("run")) return run();
    if (app.got_subcommand("inspect")) return inspect();
    if (app.got_subcommand("tokenize")) return tokenize();
    if (app.got_subcommand("doctor")) return doctor();
    if (app.got_subcommand("verify")) return verify();
    if (app.got_subcommand("merge")) return merge();
    if (app.got_subcommand("status")) return status();
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    if (e.kind() == ErrorKind::kInternal) {
      spdlog::error("this is a bug in precompute ({}:{}); please report it", e.file(), e.line());
    }
    return exit_code_for(e);
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return kExitInternal;
  }
  return kExitUsage;
}

// Note [Leaving without tearing down]
// When a command returns, what it wrote is closed, synced and renamed into place (a run is safe
// at every step against SIGKILL, which the resume tests send), and its log lines are written.
// What exit() would add is teardown no one needs: LibTorch's static objects and the CUDA
// runtime's exit handlers, which take down the device's context: after a GPU text job, a few
// tenths of a second between the run's process and the supervisor's (docs/benchmarks.md, "What
// bounds it, and the start-up timeline"). So main flushes the log and the standard streams and ends
// with _Exit; the kernel takes back the memory and the device either way. Not under Address- or
// ThreadSanitizer, whose leak check and exit code come from handlers that run at exit.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kTearDownAtExit = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kTearDownAtExit = true;
#else
constexpr bool kTearDownAtExit = false;
#endif
#else
constexpr bool kTearDownAtExit = false;
#endif

}  // namespace

bool tears_down_at_exit() { return kTearDownAtExit; }

namespace {

[[noreturn]] void leave(int code) {
  spdlog::debug("exit: leaving with code {}", code);
  if (kTearDownAtExit) std::exit(code);
  spdlog::default_logger()->flush();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace
}  // namespace precompute

int main(int argc, char** argv) {
  // Note [Host memory and glibc malloc]
  // Decoders and batches allocate and free buffers of hundreds of KB to MBs from many threads.
  // glibc raises its mmap threshold each time such a buffer is freed, after which big buffers
  // come from per-thread heaps that rarely shrink: resident memory then drifts up with run time.
  // A fixed threshold keeps every buffer above 256 KiB in its own mapping, returned to the system
  // when freed, so peak memory stays flat as runs grow (docs/benchmarks.md, "Host memory does not
  // grow with the dataset"). Set before any thread starts.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  precompute::setup_logging("info");
  precompute::note_process_start();
  const int code = precompute::main_impl(argc, argv);
  precompute::leave(code);
}
