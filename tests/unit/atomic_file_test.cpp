#include "storage/atomic_file.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> folder_entries(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Each test gets a fresh folder, removed afterwards.
class AtomicFileTest : public ::testing::Test {
 protected:

  testing::TempDir temp_;
  const fs::path dir_ = temp_.path();
};

TEST_F(AtomicFileTest, WritesANewFile) {
  const std::string bytes("binary\0bytes\xff", 13);
  write_file_atomically(dir_ / "out.bin", bytes);
  EXPECT_EQ(read_file(dir_ / "out.bin"), bytes);
  EXPECT_EQ(fs::status(dir_ / "out.bin").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read);
}

TEST_F(AtomicFileTest, WritesAnEmptyFile) {
  write_file_atomically(dir_ / "empty", "");
  EXPECT_TRUE(fs::exists(dir_ / "empty"));
  EXPECT_EQ(fs::file_size(dir_ / "empty"), 0u);
}

TEST_F(AtomicFileTest, WritesALargeFile) {
  std::string bytes(9 << 20, '\0');
  std::mt19937 random(7);
  for (char& c : bytes) c = static_cast<char>(random());
  write_file_atomically(dir_ / "large", bytes);
  EXPECT_EQ(read_file(dir_ / "large"), bytes);
}

TEST_F(AtomicFileTest, ReplacesAnExistingFileAndLeavesNoTemporaryFiles) {
  write_file_atomically(dir_ / "index.json", "old contents, longer than the new ones");
  write_file_atomically(dir_ / "index.json", "new");
  EXPECT_EQ(read_file(dir_ / "index.json"), "new");
  EXPECT_EQ(folder_entries(dir_), std::vector<std::string>{"index.json"});
}

TEST_F(AtomicFileTest, WritesRelativeToTheWorkingDirectory) {
  const fs::path previous = fs::current_path();
  fs::current_path(dir_);
  write_file_atomically("plain-name", "here");
  fs::current_path(previous);
  EXPECT_EQ(read_file(dir_ / "plain-name"), "here");
  EXPECT_EQ(folder_entries(dir_), std::vector<std::string>{"plain-name"});
}

TEST_F(AtomicFileTest, FailsClearlyWhenTheParentIsARegularFile) {
  // Running as root, permissions do not stop writes; a path below a regular file always fails.
  write_file_atomically(dir_ / "plain-file", "x");
  const fs::path target = dir_ / "plain-file" / "shard-000000.h5";
  try {
    write_file_atomically(target, "bytes");
    FAIL() << "expected a StorageError";
  } catch (const StorageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(target.string()), std::string::npos) << message;
    EXPECT_NE(message.find("Not a directory"), std::string::npos) << message;
  }
  EXPECT_EQ(folder_entries(dir_), std::vector<std::string>{"plain-file"});
}

TEST_F(AtomicFileTest, FailsClearlyWhenTheFolderIsMissing) {
  const fs::path target = dir_ / "missing" / "index.json";
  try {
    write_file_atomically(target, "bytes");
    FAIL() << "expected a StorageError";
  } catch (const StorageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(target.string()), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
}

TEST_F(AtomicFileTest, RemovesTheTemporaryFileWhenTheRenameFails) {
  // The bytes are written and synced, then rename() cannot put a file in place of a folder.
  const fs::path target = dir_ / "occupied";
  fs::create_directory(target);
  try {
    write_file_atomically(target, "bytes");
    FAIL() << "expected a StorageError";
  } catch (const StorageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(target.string()), std::string::npos) << message;
    EXPECT_NE(message.find("renaming"), std::string::npos) << message;
  }
  EXPECT_EQ(folder_entries(dir_), std::vector<std::string>{"occupied"});
}

}  // namespace
}  // namespace precompute
