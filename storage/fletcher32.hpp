#pragma once
// HDF5's Fletcher-32 checksum (the fletcher32 filter's), so that the shard writer can hand HDF5
// chunks already checksummed (Note [Chunks written whole] in shard_writer.cpp). The algorithm
// is HDF5's format, not a choice: sums start at 0, bytes pair into big-endian 16-bit words (an
// odd last byte is the high byte of a word of its own), and both sums fold their carries back
// in after every 360 words, after the odd byte and once more at the end. The filter stores the
// result after the chunk's bytes, little-endian (hdf5_fletcher32_append).

#include <cstddef>
#include <cstdint>

namespace precompute {

uint32_t hdf5_fletcher32(const void* data, size_t size);

// Writes the checksum of data[0, size) to data[size, size + 4), as the filter stores it.
void hdf5_fletcher32_append(unsigned char* data, size_t size);

}  // namespace precompute
