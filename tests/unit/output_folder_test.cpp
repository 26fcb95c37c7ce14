// OutputFolder: open() proves that every file with one of the tool's names carries the folder's
// output id before anything is removed or replaced, and remove_previous_run (--overwrite) removes
// every run file, on several threads, the index last, and nothing else; a file that cannot be
// removed is an error naming it, and the index then stays.

#include "storage/output_folder.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "storage/output_id.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const std::string kId = output_id_for(std::string(64, 'a'));
const std::string kOtherId = output_id_for(std::string(64, 'b'));

std::string shard_name(int i) { return shard_file_name(i, std::string(64, 'c')); }

void fill_with_an_earlier_run(const fs::path& dir, int shards) {
  for (int i = 0; i < shards; ++i) std::ofstream(dir / shard_name(i)) << "shard " << i << kId;
  std::ofstream(dir / "index.json") << R"({"format": "precompute-index", "output_id": ")" << kId
                                     << "\"}";
  std::ofstream(dir / "notes.txt") << "the user's own file";
  std::ofstream(dir / "shard-final-results.h5") << "not a shard name the writer makes";
  std::ofstream(dir / "shard-000000.h5") << "named as an earlier version named shards";
}

OutputFolderOptions foreign_allowed() {
  OutputFolderOptions options;
  options.allow_foreign = true;
  return options;
}

TEST(OutputFolderTest, OverwriteRemovesEveryRunFileAndNothingElse) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  fill_with_an_earlier_run(dir, 100);
  const OutputFolder folder = OutputFolder::open(dir, foreign_allowed());
  EXPECT_EQ(folder.output_id(), kId);
  folder.remove_previous_run();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(fs::exists(dir / shard_name(i))) << i;
  EXPECT_FALSE(fs::exists(dir / "index.json"));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / "shard-final-results.h5"));
  EXPECT_TRUE(fs::exists(dir / "shard-000000.h5"));
  EXPECT_TRUE(fs::exists(dir / kLockFileName)) << "the lock must outlive --overwrite";
}

// The command's own files beside an earlier run's (the journal of its early decodes, a
// quarantine its supervisor wrote) stay when named; the same names are removed when not.
TEST(OutputFolderTest, OverwriteLeavesTheFilesItIsToldToKeep) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  fill_with_an_earlier_run(dir, 3);
  std::ofstream(dir / ".precompute.inflight") << "journal";
  std::ofstream(dir / ".precompute.quarantine") << "suspects";
  const OutputFolder folder = OutputFolder::open(dir, foreign_allowed());
  folder.remove_previous_run({".precompute.inflight", ".precompute.quarantine"});
  EXPECT_TRUE(fs::exists(dir / ".precompute.inflight"));
  EXPECT_TRUE(fs::exists(dir / ".precompute.quarantine"));
  EXPECT_FALSE(fs::exists(dir / shard_name(0)));
  EXPECT_FALSE(fs::exists(dir / "index.json"));
  folder.remove_previous_run();
  EXPECT_FALSE(fs::exists(dir / ".precompute.inflight"));
  EXPECT_FALSE(fs::exists(dir / ".precompute.quarantine"));
}

TEST(OutputFolderTest, AShardThatCannotBeRemovedIsNamedAndTheIndexStays) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  fill_with_an_earlier_run(dir, 40);
  const OutputFolder folder = OutputFolder::open(dir, foreign_allowed());
  // After the proof, a folder under a shard's name, with something in it: remove() refuses it.
  fs::remove(dir / shard_name(17));
  fs::create_directories(dir / shard_name(17) / "inside");
  try {
    folder.remove_previous_run();
    FAIL() << "a shard that cannot be removed was not reported";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(shard_name(17)), std::string::npos) << e.what();
  }
  // Interrupted there, the folder still has its index, for a resume to repair from.
  EXPECT_TRUE(fs::exists(dir / "index.json"));
}

// Opening must refuse (exit 73), naming the file, and leave every file as it was.
void expect_refused(const fs::path& dir, const std::string& file, const std::string& why) {
  for (const bool allow_foreign : {false, true}) {  // --overwrite too
    OutputFolderOptions options;
    options.allow_foreign = allow_foreign;
    try {
      OutputFolder::open(dir, options);
      ADD_FAILURE() << "opened a folder holding an unproven " << file;
    } catch (const OutputFolderError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
      EXPECT_NE(message.find("nothing was changed"), std::string::npos) << message;
    }
  }
  EXPECT_TRUE(fs::exists(dir / file));
}

TEST(OutputFolderTest, AUsersFilesUnderTheToolsNamesAreRefusedNamingThem) {
  for (const std::string& name : std::vector<std::string>{"dataset.h5", "index.json", "job.json",
                                                          "summary.json", shard_name(0)}) {
    TempDir tmp;
    const fs::path dir = tmp.path() / "out";
    fs::create_directories(dir);
    std::ofstream(dir / name) << "the user's own " << name;
    SCOPED_TRACE(name);
    expect_refused(dir, name, "carries no output id");
  }
}

TEST(OutputFolderTest, AFileOfAnotherOutputBesideThisOnesIsRefused) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  fill_with_an_earlier_run(dir, 3);
  std::ofstream(dir / shard_name(1), std::ios::trunc) << "a shard of other settings " << kOtherId;
  expect_refused(dir, shard_name(1), "belongs to another output");
  // Without an index, the files must agree among themselves.
  fs::remove(dir / "index.json");
  expect_refused(dir, shard_name(1), "belongs to another output");
}

TEST(OutputFolderTest, ALinkOrAFolderUnderAToolsNameIsRefused) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  fs::create_directories(dir);
  std::ofstream(tmp.path() / "elsewhere.h5") << kId;
  fs::create_symlink(tmp.path() / "elsewhere.h5", dir / "dataset.h5");
  expect_refused(dir, "dataset.h5", "is not a regular file");
  fs::remove(dir / "dataset.h5");
  fs::create_directories(dir / "index.json");
  expect_refused(dir, "index.json", "is not a regular file");
}

TEST(OutputFolderTest, AFolderOfProvenFilesOpensWithTheirIdAndANewOneWithNone) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "out";
  EXPECT_EQ(OutputFolder::open(dir, {}).output_id(), "");
  fill_with_an_earlier_run(dir, 2);
  fs::remove(dir / "index.json");  // shards alone still name the output
  EXPECT_EQ(OutputFolder::open(dir, foreign_allowed()).output_id(), kId);
}

}  // namespace
}  // namespace precompute
