// EarlyStart (encoders/early_start.hpp): the models' identities hashed beside the input's read
// are the ones the encoders would compute, and a hash that fails reaches whoever waits for it.

#include "encoders/early_start.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& content) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << content;
}

class EarlyStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("precompute-early-start-" + std::to_string(::testing::UnitTest::GetInstance()
                                                           ->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    // A BERT folder as model_sha256() sees it: only .json, .txt and .safetensors files count.
    write(dir_ / "bert" / "config.json", "{\"hidden_size\": 8}");
    write(dir_ / "bert" / "vocab.txt", "[PAD]\n[UNK]\n");
    write(dir_ / "bert" / "model.safetensors", std::string(3 << 20, 'w'));
    write(dir_ / "bert" / "README.md", "not part of the identity");
    write(dir_ / "video.pt", "torchscript bytes");
    config_.run.devices = {"cpu"};
    config_.text.enabled = true;
    config_.text.encoder.type = EncoderType::kBert;
    config_.text.encoder.path = dir_ / "bert";
    config_.video.enabled = true;
    config_.video.encoder.path = dir_ / "video.pt";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  Config config_;
};

TEST_F(EarlyStartTest, HashesEachEnabledModelAsItsEncoderWould) {
  // The folder's identity, spelled out: each counted file's path and content hash, sorted. It
  // must not change between versions, or every earlier output would refuse to resume.
  Sha256 folder;
  for (const char* name : {"config.json", "model.safetensors", "vocab.txt"}) {
    folder.update(name);
    folder.update(sha256_file(dir_ / "bert" / name));
  }
  const std::string identity = folder.hex_digest();
  EarlyStart early(config_);
  EXPECT_EQ(early.model_hash(Modality::kText).get(), identity);
  EXPECT_EQ(early.model_hash(Modality::kText).get(), model_sha256(config_, Modality::kText));
  EXPECT_EQ(early.model_hash(Modality::kVideo).get(), sha256_hex("torchscript bytes"));
  EXPECT_FALSE(early.model_hash(Modality::kAudio).valid()) << "audio is not enabled";
  EXPECT_EQ(early.devices(), describe_devices());
  // A README edit leaves the identity as it was.
  write(dir_ / "bert" / "README.md", "edited");
  EXPECT_EQ(model_sha256(config_, Modality::kText), identity);
}

TEST_F(EarlyStartTest, AModelThatCannotBeReadFailsWhoeverWaitsForItsHash) {
  config_.video.encoder.path = dir_ / "missing.pt";
  EarlyStart early(config_);
  try {
    (void)early.model_hash(Modality::kVideo).get();
    FAIL() << "hashing a missing model succeeded";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.pt"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(early.model_hash(Modality::kText).get().empty());
}

TEST_F(EarlyStartTest, ARunRefusedBeforeLoadingStopsTheHashingItDoesNotNeed) {
  // Destroyed at once, as when the input is refused: the destructor stops the hashing and
  // returns; what it left is "" (nobody took it) or the full hash, never a wrong one.
  ModelHash text;
  {
    EarlyStart early(config_);
    text = early.model_hash(Modality::kText);
  }
  const std::string left = text.get();
  EXPECT_TRUE(left.empty() || left == model_sha256(config_, Modality::kText)) << left;
}

}  // namespace
}  // namespace precompute
