#include "storage/fletcher32.hpp"

namespace precompute {

namespace {

// Adds the carries above 16 bits back in (end-around carry, as HDF5 folds).
inline uint32_t fold(uint32_t sum) { return (sum & 0xFFFFu) + (sum >> 16); }

}  // namespace

uint32_t hdf5_fletcher32(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t low = 0, high = 0;  // HDF5's sum1 and sum2
  // 360 words is the most that two 32-bit sums take without overflowing between folds; HDF5
  // folds at exactly these points, and the result depends on where, so this does too.
  constexpr size_t kWordsBetweenFolds = 360;
  size_t words = size / 2;
  while (words > 0) {
    const size_t block = words < kWordsBetweenFolds ? words : kWordsBetweenFolds;
    words -= block;
    for (size_t i = 0; i < block; ++i, bytes += 2) {
      low += (static_cast<uint32_t>(bytes[0]) << 8) | bytes[1];
      high += low;
    }
    low = fold(low);
    high = fold(high);
  }
  if (size % 2 != 0) {
    low += static_cast<uint32_t>(bytes[0]) << 8;
    high += low;
    low = fold(low);
    high = fold(high);
  }
  low = fold(low);
  high = fold(high);
  return (high << 16) | low;
}

void hdf5_fletcher32_append(unsigned char* data, size_t size) {
  const uint32_t sum = hdf5_fletcher32(data, size);
  for (int i = 0; i < 4; ++i) data[size + static_cast<size_t>(i)] = (sum >> (8 * i)) & 0xFFu;
}

}  // namespace precompute
