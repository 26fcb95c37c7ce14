#include "pipeline/core/sha256.hpp"

#include <gtest/gtest.h>

#include "pipeline/core/error.hpp"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace precompute {
namespace {

// Test vectors from FIPS 180-4's examples.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 portable(/*use_cpu_extensions=*/false);
  portable.update("abc");
  EXPECT_EQ(portable.hex_digest(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, StreamingEqualsOneShot) {
  const std::string million(1000000, 'a');
  Sha256 h;
  for (size_t i = 0; i < million.size(); i += 997) h.update(million.substr(i, 997));
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, CpuExtensionsAgreeWithThePortableCode) {
  if (!Sha256::cpu_extensions_available()) {
    GTEST_SKIP() << "this processor has no SHA extensions: both sides would be the portable code";
  }
  std::mt19937 random(20261130);
  for (size_t size : {0, 1, 55, 56, 63, 64, 65, 127, 128, 1000, 4096, 100003}) {
    std::string data(size, '\0');
    for (char& c : data) c = static_cast<char>(random());
    Sha256 fast;
    Sha256 portable(/*use_cpu_extensions=*/false);
    // Uneven pieces exercise the buffered and the whole-block paths.
    for (size_t i = 0; i < size; i += 777) {
      fast.update(std::string_view(data).substr(i, 777));
      portable.update(std::string_view(data).substr(i, 777));
    }
    EXPECT_EQ(fast.hex_digest(), portable.hex_digest()) << size << " bytes";
  }
}

TEST(Sha256Test, FileHashMatchesContent) {
  const auto path = std::filesystem::temp_directory_path() / "precompute-sha256-test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  EXPECT_EQ(sha256_file(path), sha256_hex("abc"));
  std::filesystem::remove(path);
  EXPECT_THROW(sha256_file(path), std::exception);
}

TEST(Sha256Test, AFileHashStopsOnceCancelled) {
  const auto path = std::filesystem::temp_directory_path() / "precompute-sha256-cancel.bin";
  const std::string content(3 << 20, 'x');  // three of the 1 MiB reads
  {
    std::ofstream out(path, std::ios::binary);
    out << content;
  }
  std::atomic<bool> cancelled{false};
  EXPECT_EQ(sha256_file(path, &cancelled), sha256_hex(content));
  cancelled = true;
  EXPECT_EQ(sha256_file(path, &cancelled), "");
  std::filesystem::remove(path);
  // A file that cannot be read is an error even when the hash is no longer wanted.
  EXPECT_THROW(sha256_file(path, &cancelled), StorageError);
}

}  // namespace
}  // namespace precompute
