#pragma once
// The lock that keeps HDF5 to one thread at a time inside precompute (Note [One thread in HDF5]
// in hdf5_lock.cpp).

#include <mutex>

namespace precompute {

// Held by every HDF5 user that may run beside another in the same process: the shard builder
// and the one-file view's writer.
std::mutex& hdf5_lock();

}  // namespace precompute
