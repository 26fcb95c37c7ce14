#pragma once
// The folders LibTorch's package loader unpacks into /tmp, and what removes them when the
// process that loaded them cannot (Note [Unpacked packages] in unpacked_packages.cpp). Free of
// LibTorch: the supervisor, which must not start it, cleans up after a run it restarts.

#include <filesystem>
#include <vector>

namespace precompute {

// Around one package's load, in the loading process: removes the copies of runs that have
// ended (and, when no other load is under way, what runs that died loading were unpacking),
// records that a load is under way (for the supervisor, should the process die in it) and,
// through settle(), what the load unpacked. Holds the ledger's lock shared, so that a clean-up
// never takes a folder another run is unpacking.
class PackageUnpacking {
 public:
  PackageUnpacking();
  ~PackageUnpacking();  // forgets the record of the load under way
  PackageUnpacking(const PackageUnpacking&) = delete;
  PackageUnpacking& operator=(const PackageUnpacking&) = delete;

  // After the load: removes what it unpacked (a CPU package), or writes it into the ledger
  // (`keep`: a CUDA package, whose folder must outlive the model).
  void settle(bool keep);

 private:
  int lock_fd_ = -1;
  std::filesystem::path record_;
  std::vector<std::filesystem::path> before_;  // the process's unpacked folders before the load
};

// Removes this process's ledger entries whose folder is gone (LibTorch removed it with its
// model).
void forget_removed_packages();

// In a supervisor, once its run `pid` has ended: removes what that run was unpacking, if it died
// loading a package.
void remove_packages_left_by(int pid);

}  // namespace precompute
