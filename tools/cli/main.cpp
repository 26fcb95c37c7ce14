// precompute: video, audio and text embeddings into sharded HDF5. See README.md.

#include <spdlog/spdlog.h>

#include <iostream>

#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

int exit_code_for(const Error& e) {
  if (dynamic_cast<const OutputFolderError*>(&e) != nullptr) return kExitOutputUnavailable;
  switch (e.kind()) {
    case ErrorKind::kConfig:
    case ErrorKind::kModel:
      return kExitUsage;
    case ErrorKind::kInput:
      return kExitInvalidInput;
    case ErrorKind::kStorage:
      return kExitIoError;
    case ErrorKind::kMedia:
    case ErrorKind::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"precompute: turn videos, audio and captions into embeddings in sharded HDF5"};
  app.set_version_flag("--version", std::string("precompute ") + PRECOMPUTE_VERSION);
  app.require_subcommand(1);
  const auto run = add_run_command(app);
  const auto inspect = add_inspect_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  try {
    if (app.got_subcommand("run")) return run();
    if (app.got_subcommand("inspect")) return inspect();
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

}  // namespace
}  // namespace precompute

int main(int argc, char** argv) {
  precompute::setup_logging("info");
  return precompute::main_impl(argc, argv);
}
