// OutputFolder::remove_previous_run (--overwrite): every run file goes, on several threads, the
// index last; nothing else in the folder is touched; a file that cannot be removed is an error
// naming it, and the index then stays.

#include "storage/output_folder.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "pipeline/core/error.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string shard_name(int i) {
  std::string digits = std::to_string(i);
  return "shard-" + std::string(6 - digits.size(), '0') + digits + ".h5";
}

void fill_with_an_earlier_run(const fs::path& dir, int shards) {
  for (int i = 0; i < shards; ++i) std::ofstream(dir / shard_name(i)) << "shard " << i;
  std::ofstream(dir / "index.json") << "{}";
  std::ofstream(dir / "notes.txt") << "the user's own file";
  std::ofstream(dir / "shard-final-results.h5") << "not a shard name the writer makes";
}

TEST(OutputFolderTest, OverwriteRemovesEveryRunFileAndNothingElse) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  fill_with_an_earlier_run(dir, 100);
  OutputFolderOptions options;
  options.allow_foreign = true;
  const OutputFolder folder = OutputFolder::open(dir, options);
  folder.remove_previous_run();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(fs::exists(dir / shard_name(i))) << i;
  EXPECT_FALSE(fs::exists(dir / "index.json"));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / "shard-final-results.h5"));
  EXPECT_TRUE(fs::exists(dir / kLockFileName)) << "the lock must outlive --overwrite";
}

TEST(OutputFolderTest, AShardThatCannotBeRemovedIsNamedAndTheIndexStays) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  fill_with_an_earlier_run(dir, 40);
  // A folder under a shard's name, with something in it: remove() refuses it.
  fs::remove(dir / shard_name(17));
  fs::create_directories(dir / shard_name(17) / "inside");
  OutputFolderOptions options;
  options.allow_foreign = true;
  const OutputFolder folder = OutputFolder::open(dir, options);
  try {
    folder.remove_previous_run();
    FAIL() << "a shard that cannot be removed was not reported";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(shard_name(17)), std::string::npos) << e.what();
  }
  // Interrupted there, the folder still has its index, for a resume to repair from.
  EXPECT_TRUE(fs::exists(dir / "index.json"));
}

}  // namespace
}  // namespace precompute
