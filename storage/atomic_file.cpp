#include "storage/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include "pipeline/core/crash_point.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

std::string describe_errno(int error) {
  const std::string text = std::generic_category().message(error);
  return error == ENOSPC ? "disk full (" + text + ")" : text;
}

[[noreturn]] void throw_write_error(const std::filesystem::path& target, std::string_view step,
                                    int error) {
  PC_THROW(StorageError, "cannot write ", target, " (while ", step, "): ", describe_errno(error));
}

// A file descriptor closed on scope exit unless close() was called and checked.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&&) = delete;

  int get() const { return fd_; }
  // Returns 0 or the errno of close(). The descriptor is gone either way: on Linux a failed
  // close still releases it, so retrying could close someone else's descriptor.
  int close() {
    const int status = ::close(fd_);
    fd_ = -1;
    return status == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// Removes the temporary file on scope exit unless it was renamed into place.
class TempFileRemover {
 public:
  explicit TempFileRemover(std::filesystem::path path) : path_(std::move(path)) {}
  ~TempFileRemover() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFileRemover(const TempFileRemover&) = delete;
  TempFileRemover& operator=(const TempFileRemover&) = delete;

  void renamed() { path_.clear(); }

 private:
  std::filesystem::path path_;
};

// Creates a new temporary file next to `target`; O_EXCL guarantees that it is ours alone. The
// name is unique within this process (pid and counter); a leftover of a crashed process that
// had the same pid is skipped.
std::pair<FileDescriptor, std::filesystem::path> create_temp_file(
    const std::filesystem::path& target, const std::filesystem::path& folder) {
  static std::atomic<uint64_t> counter{0};
  constexpr int kAttempts = 100;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const std::filesystem::path temp =
        folder / (std::string(kTempFilePrefix) + target.filename().string() + "." +
                  std::to_string(::getpid()) + "." + std::to_string(counter++));
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return {FileDescriptor(fd), temp};
    if (const int error = errno; error != EEXIST) {
      throw_write_error(target, "creating a temporary file in " + folder.string(), error);
    }
  }
  throw_write_error(target, "looking for a free temporary file name in " + folder.string(), EEXIST);
}

// write() until every byte is out: it may write less than asked, and may be interrupted.
void write_all(int fd, std::string_view bytes, const std::filesystem::path& target) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_write_error(target, "writing the temporary file", errno);
    }
    // write() returns 0 only for a request of 0 bytes; anything else would loop forever.
    if (written == 0) throw_write_error(target, "writing the temporary file", EIO);
    bytes.remove_prefix(static_cast<size_t>(written));
  }
}

// Makes the rename durable: until the folder is synced, a crash may forget it.
void sync_folder(const std::filesystem::path& folder, const std::filesystem::path& target) {
  FileDescriptor dir(::open(folder.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (dir.get() < 0) throw_write_error(target, "opening the folder to sync it", errno);
  // EINVAL: this file system cannot sync a folder (POSIX allows that); there is nothing to wait
  // for, so it is not an error.
  if (::fsync(dir.get()) != 0 && errno != EINVAL) {
    throw_write_error(target, "syncing the folder after the rename", errno);
  }
  if (const int error = dir.close(); error != 0) {
    throw_write_error(target, "closing the folder", error);
  }
}

// Crash points (pipeline/core/crash_point.hpp) are named by what is being written: "shard-" or
// "index-" followed by the step, e.g. shard-before-rename; other files have none.
std::string crash_point_prefix(std::string_view name) {
  if (name.rfind("shard-", 0) == 0) return "shard-";
  if (name == "index.json") return "index-";
  return {};
}

void crash_at(const std::string& prefix, std::string_view step) {
  if (!prefix.empty()) crash_point(prefix + std::string(step));
}

}  // namespace

namespace {

// Both forms of the atomic write: `stem` names the temporary file (and the crash points), and
// `target()` gives the final path once the temporary file is synced.
std::filesystem::path write_atomically(const std::filesystem::path& folder, std::string_view stem,
                                       std::string_view bytes,
                                       const std::function<std::filesystem::path()>& target) {
  const std::string crash_prefix = crash_point_prefix(stem);
  // Until the target is known, errors name the file by its stem.
  const std::filesystem::path provisional = folder / std::string(stem);
  auto [file, temp] = create_temp_file(provisional, folder);
  TempFileRemover remover(temp);

  // Half the bytes, then the rest, so that a crash point can leave a torn temporary file.
  write_all(file.get(), bytes.substr(0, bytes.size() / 2), provisional);
  crash_at(crash_prefix, "mid-write");
  write_all(file.get(), bytes.substr(bytes.size() / 2), provisional);
  crash_at(crash_prefix, "before-fsync");
  // A failed fsync is not retried on the same descriptor: Linux may already have dropped the
  // dirty pages and marked them clean, so a second fsync could succeed without writing them.
  if (::fsync(file.get()) != 0) throw_write_error(provisional, "syncing the temporary file", errno);
  if (const int error = file.close(); error != 0) {
    throw_write_error(provisional, "closing the temporary file", error);
  }
  const std::filesystem::path final_path = target();
  crash_at(crash_prefix, "before-rename");
  if (::rename(temp.c_str(), final_path.c_str()) != 0) {
    throw_write_error(final_path, "renaming the temporary file into place", errno);
  }
  remover.renamed();
  crash_at(crash_prefix, "before-folder-fsync");
  sync_folder(folder, final_path);
  return final_path;
}

}  // namespace

void write_file_atomically(const std::filesystem::path& target, std::string_view bytes) {
  const std::filesystem::path folder =
      target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  write_atomically(folder, target.filename().string(), bytes, [&] { return target; });
}

std::filesystem::path write_named_file_atomically(const std::filesystem::path& folder,
                                                  std::string_view stem, std::string_view bytes,
                                                  const std::function<std::string()>& name) {
  return write_atomically(folder, stem, bytes, [&] { return folder / name(); });
}

}  // namespace precompute
