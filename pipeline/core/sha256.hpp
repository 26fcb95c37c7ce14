#pragma once
// SHA-256 (FIPS 180-4), for the identity of model files and shards: with the x86 SHA
// extensions where the processor has them (about 10x the portable code, which hashes about
// 170 MB/s), else portable. Not thread-safe per instance; use one Sha256 per thread.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace precompute {

class Sha256 {
 public:
  // `use_cpu_extensions` false: the portable code whatever the processor (tests compare both).
  explicit Sha256(bool use_cpu_extensions = true);
  void update(const void* data, size_t size);
  void update(std::string_view text) { update(text.data(), text.size()); }
  // The digest as 64 lowercase hex digits; the object must not be updated afterwards.
  std::string hex_digest();
  // Whether this processor has the SHA extensions (else every instance is the portable code).
  static bool cpu_extensions_available();

 private:

  using CompressFn = void (*)(std::array<uint32_t, 8>&, const uint8_t*, size_t);
  CompressFn compress_;
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view data);
// Hashes a whole file; throws StorageError naming the file when it cannot be read. Once
// `*cancelled` is set it stops between two reads and returns "" (for a hash nobody will use).
std::string sha256_file(const std::filesystem::path& file,
                        const std::atomic<bool>* cancelled = nullptr);


}  // namespace precompute
