#pragma once
// The project's one exception hierarchy and its two kinds of checks:
// PC_CHECK for bad input, config or data, which the user can fix and which must name the input
// and the fix; PC_ASSERT for invariants of our own code, which only a bug can break.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "pipeline/core/failure.hpp"

namespace precompute {

// What went wrong, coarse enough to pick an exit code (tools/cli/exit_codes.hpp) and to decide
// whether one sample or the whole run fails.
enum class ErrorKind {
  kConfig,    // the config file or a flag: fix it and rerun
  kInput,     // the manifest or input folder as a whole (not one sample's media)
  kMedia,     // one sample's media or text: recorded as a failure, the run goes on
  kModel,     // an encoder cannot be loaded or run
  kStorage,   // the output folder or a shard cannot be written or read
  kInternal,  // a broken invariant: a bug in precompute
  kStopped,   // SIGINT or SIGTERM: complete shards were committed; rerun to resume
};

// Thrown by PC_CHECK / PC_THROW / PC_ASSERT. Thread-safe to copy; what() is the full message.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, const char* file, int line)
      : std::runtime_error(message), kind_(kind), file_(file), line_(line) {}

  ErrorKind kind() const noexcept { return kind_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorKind kind_;
  const char* file_;
  int line_;
};

class ConfigError : public Error {
 public:
  ConfigError(const std::string& m, const char* f, int l) : Error(ErrorKind::kConfig, m, f, l) {}
};

class InputError : public Error {
 public:
  InputError(const std::string& m, const char* f, int l) : Error(ErrorKind::kInput, m, f, l) {}
};

// One sample's media or text could not be used; `category` goes into its failure record.
class MediaError : public Error {
 public:
  MediaError(FailureCategory category, const std::string& m, const char* f, int l)
      : Error(ErrorKind::kMedia, m, f, l), category_(category) {}
  FailureCategory category() const noexcept { return category_; }

 private:
  FailureCategory category_;
};

class ModelError : public Error {
 public:
  ModelError(const std::string& m, const char* f, int l) : Error(ErrorKind::kModel, m, f, l) {}
};

// The device ran out of memory on a batch (c10::OutOfMemoryError underneath); the encode stage
// splits the batch and retries (Note [Out of memory] in pipeline/stages/encode_stage.cpp).
class DeviceOutOfMemoryError : public ModelError {
 public:
  using ModelError::ModelError;
};

class StorageError : public Error {
 public:
  StorageError(const std::string& m, const char* f, int l) : Error(ErrorKind::kStorage, m, f, l) {}
};

// The output folder cannot be created, written or used: nothing was decoded yet.
class OutputFolderError : public StorageError {
 public:
  using StorageError::StorageError;
};

// Another run holds the output folder's lock.
class OutputLockedError : public OutputFolderError {
 public:
  using OutputFolderError::OutputFolderError;
};

// The run stopped on a signal after committing its complete shards.
class StoppedError : public Error {
 public:
  StoppedError(int signal, const std::string& m, const char* f, int l)
      : Error(ErrorKind::kStopped, m, f, l), signal_(signal) {}
  int signal() const noexcept { return signal_; }

 private:
  int signal_;
};

class InternalError : public Error {
 public:
  InternalError(const std::string& m, const char* f, int l)
      : Error(ErrorKind::kInternal, m, f, l) {}
};

namespace detail {
// Concatenates anything with an operator<< into one string.
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace precompute

// Throws ErrorType(message) when `cond` is false; the message is the remaining arguments, joined.
#define PC_CHECK(cond, ErrorType, ...)                                                   \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      throw ErrorType(::precompute::detail::concat(__VA_ARGS__), __FILE__, __LINE__);    \
    }                                                                                    \
  } while (false)

#define PC_THROW(ErrorType, ...) \
  throw ErrorType(::precompute::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// For one sample's media: records `category` in the failure record.
#define PC_MEDIA_CHECK(cond, category, ...)                                                   \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      throw ::precompute::MediaError(category, ::precompute::detail::concat(__VA_ARGS__),     \
                                     __FILE__, __LINE__);                                     \
    }                                                                                         \
  } while (false)

#define PC_MEDIA_THROW(category, ...)                                                            \
  throw ::precompute::MediaError(category, ::precompute::detail::concat(__VA_ARGS__), __FILE__, \
                                 __LINE__)

// An invariant of precompute itself; failing it is a bug, reported with file:line.
#define PC_ASSERT(cond, ...)                                                             \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      throw ::precompute::InternalError(                                                 \
          ::precompute::detail::concat("internal error: ", #cond, " failed. ", ##__VA_ARGS__), \
          __FILE__, __LINE__);                                                           \
    }                                                                                    \
  } while (false)
