#include "storage/hdf5_lock.hpp"

// Note [One thread in HDF5]
// The shard committer builds shard images on one thread and writes the one-file view
// (dataset_view.cpp) on another, both through HDF5. HDF5 is safe across threads only when built
// with --enable-threadsafe (Debian's is; others, conda's and source builds by default, are not),
// and then it serialises every call on a global lock of its own anyway. So precompute serialises
// its own HDF5 work on this lock: correct with either build, and no slower with a thread-safe one.

namespace precompute {

std::mutex& hdf5_lock() {
  static std::mutex lock;
  return lock;
}

}  // namespace precompute
