#include "pipeline/core/sha256.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace precompute {
namespace {

// Test vectors from FIPS 180-4's examples.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, StreamingEqualsOneShot) {
  const std::string million(1000000, 'a');
  Sha256 h;
  for (size_t i = 0; i < million.size(); i += 997) h.update(million.substr(i, 997));
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
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

}  // namespace
}  // namespace precompute
